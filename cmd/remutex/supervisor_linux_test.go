package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// treeScript starts a tree of processes in the command's group: the shell,
// a background sleep, and a second shell with a background sleep of its own
// (a grandchild of the command). Each appends its pid to $PIDS once it runs;
// then the command waits.
const treeScript = `sleep 300 & echo $! >> "$PIDS"
sh -c 'sleep 300 & echo $! >> "$PIDS"; echo $$ >> "$PIDS"; wait' &
echo $$ >> "$PIDS"; echo ready >> "$LOG"; wait`

// startTree runs remutex run with treeScript and extra run flags, and
// returns once the four processes of the tree run. It also returns every
// process below remutex (the supervisor, the tree) as found in /proc.
func startTree(t *testing.T, addr, name string, flags ...string) (p *proc, tree []int, below []int) {
	t.Helper()
	dir := t.TempDir()
	pids, log := filepath.Join(dir, "pids"), filepath.Join(dir, "log")
	args := append(append([]string{"--addr", addr, "run"}, flags...), name, "--", "sh", "-c", treeScript)
	p = start(t, cliEnv("PIDS="+pids, "LOG="+log), "", args...)
	await(t, 30*time.Second, "the command's process tree to start", func() bool {
		if p.exited() {
			t.Fatalf("remutex exited with status %d; stderr:\n%s", p.cmd.ProcessState.ExitCode(), p.stderr())
		}
		return fileHas(t, log, "ready") && len(strings.Fields(readFile(t, pids))) == 4
	})
	for _, f := range strings.Fields(readFile(t, pids)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("pid file: %v", err)
		}
		tree = append(tree, pid)
	}
	below = descendants(t, p.cmd.Process.Pid)
	for _, pid := range tree {
		if !slices.Contains(below, pid) || !alive(pid) {
			t.Fatalf("process %d of the command is not a running descendant of remutex (%d); descendants: %v", pid, p.cmd.Process.Pid, below)
		}
	}
	if len(below) != len(tree)+1 {
		t.Fatalf("remutex has descendants %v, want the supervisor and the command's tree %v", below, tree)
	}
	return p, tree, below
}

// descendants returns the pids of every process below pid, from the parent
// links in /proc.
func descendants(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	children := map[int][]int{}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		_, rest, _ := strings.Cut(string(b[strings.LastIndexByte(string(b), ')'):]), " ")
		var state string
		var ppid int
		if _, err := fmt.Sscan(rest, &state, &ppid); err == nil {
			children[ppid] = append(children[ppid], child)
		}
	}
	var out []int
	for queue := children[pid]; len(queue) > 0; queue = queue[1:] {
		out = append(out, queue[0])
		queue = append(queue, children[queue[0]]...)
	}
	return out
}

// living returns those of pids that still run.
func living(pids []int) []int {
	var out []int
	for _, pid := range pids {
		if alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// TestRunKilledTakesTreeAlong kills remutex with SIGKILL while its command
// runs a tree of processes: every one of them, grandchildren included, and
// the supervisor die with it.
func TestRunKilledTakesTreeAlong(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	p, _, below := startTree(t, srv.addr(), lockName(t, "lock"))
	p.signal(syscall.SIGKILL)
	if code := p.wait(10 * time.Second); code != -1 {
		t.Fatalf("exit status %d, want -1 (killed)", code)
	}
	await(t, 10*time.Second, fmt.Sprintf("every process below remutex (%v) to die", below), func() bool {
		return len(living(below)) == 0
	})
}

// TestRunLostLeaseKillsTree deletes the lock's key while the command runs a
// tree of processes: by the time remutex exits with status 79, the whole
// tree is gone, a process that ignores SIGTERM included (SIGKILL after
// --grace).
func TestRunLostLeaseKillsTree(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "lock")
	p, tree, below := startTree(t, srv.addr(), name, "--lease", "600ms", "--grace", "300ms")
	if err := rdbFor(t, srv.addr()).Del(context.Background(), "remutex:{"+name+"}").Err(); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(30 * time.Second); code != exitLost {
		t.Errorf("exit status %d, want %d; stderr:\n%s", code, exitLost, p.stderr())
	}
	if left := living(below); len(left) != 0 {
		t.Errorf("processes %v outlived remutex (the command's tree was %v)", left, tree)
	}
}

// TestRunLeavesNothingBehind runs commands that exit while a process they
// started in the background still runs: remutex stops it (SIGTERM, or
// SIGKILL after --grace if it ignores that) before it releases the lock and
// exits with the command's status.
func TestRunLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	tests := []struct {
		name, script, stderr string
	}{
		{"background process stops on SIGTERM",
			`sleep 300 & echo $! > "$PIDS"; exit 3`, "sending them SIGTERM"},
		// The background shell tells its pid through a fifo once it ignores
		// SIGTERM, so that the command cannot exit before that.
		{"background process ignores SIGTERM",
			`mkfifo "$PIDS.fifo"; sh -c 'trap "" TERM; echo $$ > "$PIDS.fifo"; exec sleep 300' & read pid < "$PIDS.fifo"; echo $pid > "$PIDS"; exit 3`,
			"SIGKILL in 300ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			name := lockName(t, "lock")
			pids := filepath.Join(t.TempDir(), "pids")
			code, _, stderr := run(t, cliEnv("PIDS="+pids), "", "--addr", srv.addr(), "run", "--grace", "300ms", name, "--", "sh", "-c", tt.script)
			if code != 3 {
				t.Errorf("exit status %d, want the command's 3; stderr:\n%s", code, stderr)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, pids)))
			if err != nil {
				t.Fatalf("background pid %q: %v; stderr:\n%s", readFile(t, pids), err, stderr)
			}
			if alive(pid) {
				t.Errorf("background process %d outlived remutex", pid)
			}
			if !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stderr does not say %q:\n%s", tt.stderr, stderr)
			}
			if st := lockState(t, srv.addr(), name); st.Held {
				t.Errorf("lock still held after run exited: %+v", st)
			}
		})
	}
}

// TestRunSIGHUPIgnored starts remutex with SIGHUP ignored, as nohup does:
// the command still gets SIGHUP's default disposition, and dies of the
// SIGHUP that remutex passes on.
//
// Not parallel: the test process ignores SIGHUP while it starts remutex, and
// no other test may start a process meanwhile.
func TestRunSIGHUPIgnored(t *testing.T) {
	srv := sharedRedis(t)
	binary(t) // built before SIGHUP is ignored
	log := filepath.Join(t.TempDir(), "log")
	signal.Ignore(syscall.SIGHUP)
	p := start(t, cliEnv("LOG="+log), "", "--addr", srv.addr(), "run", lockName(t, "lock"), "--",
		"sh", "-c", `echo ready >> "$LOG"; exec sleep 300`)
	signal.Reset(syscall.SIGHUP)
	await(t, 30*time.Second, "the command to start", func() bool { return fileHas(t, log, "ready") })
	p.signal(syscall.SIGHUP)
	if code := p.wait(30 * time.Second); code != 128+int(syscall.SIGHUP) {
		t.Errorf("exit status %d, want %d (the command killed by SIGHUP); stderr:\n%s", code, 128+int(syscall.SIGHUP), p.stderr())
	}
}
