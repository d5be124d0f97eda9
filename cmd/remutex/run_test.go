//go:build unix

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// lockState reads a lock's state in-process, as status does, for awaiting
// a state.
func lockState(t testing.TB, addr, name string) lockStatus {
	t.Helper()
	return lockStateOn(t, rdbFor(t, addr), name)
}

// lockStateOn is lockState through rdb, a server's or a cluster's client.
func lockStateOn(t testing.TB, rdb redis.UniversalClient, name string) lockStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	locks := remutex.NewClient(rdb)
	defer locks.Close()
	st, err := readStatus(ctx, locks, name)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// holderForm is how run and status name a holder: its owner token
// (<22 base64url>.<host>.<pid>:<goroutine id>.<n>), then its pid and host.
var holderForm = regexp.MustCompile(`[A-Za-z0-9_-]{22}\.([A-Za-z0-9._-]+)\.(\d+):\d+\.\d+ \(pid (\d+) on ([A-Za-z0-9._-]+)\)`)

// awaitWaiter waits until a Client other than the holder waits for the lock:
// it is queued in Redis and subscribed to the release channel.
func awaitWaiter(t testing.TB, addr, name string) {
	t.Helper()
	// Queued and listening: a release drops a queued waiter whose Client
	// does not listen yet, as if its process were gone.
	await(t, 10*time.Second, "a waiter on lock "+name+", queued and listening", func() bool {
		st := lockState(t, addr, name)
		return st.Queued > 0 && st.Subscribers > 0
	})
}

// TestRunSerialises runs three remutex run processes at once on one lock and
// checks from the log their commands append to that the critical sections
// never overlapped, and that the fencing tokens they got increased.
func TestRunSerialises(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "lock")
	log := filepath.Join(t.TempDir(), "log")
	script := `echo "start $$ $REMUTEX_FENCE" >> "$LOG"; sleep 0.2; echo "end $$" >> "$LOG"`
	var procs []*proc
	for range 3 {
		procs = append(procs, start(t, cliEnv("LOG="+log), "", "--addr", srv.addr(), "run", "--lease", "10s", name, "--", "sh", "-c", script))
	}
	for i, p := range procs {
		if code := p.wait(30 * time.Second); code != 0 {
			t.Fatalf("process %d: exit status %d, want 0; stderr:\n%s", i, code, p.stderr())
		}
	}
	lines := strings.Split(strings.TrimSpace(readFile(t, log)), "\n")
	if len(lines) != 6 {
		t.Fatalf("got %d log lines, want 6:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	var lastFence int64
	for i := 0; i < len(lines); i += 2 {
		s, e := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(s) != 3 || s[0] != "start" || len(e) != 2 || e[0] != "end" || e[1] != s[1] {
			t.Fatalf("critical sections overlap: lines %d-%d are %q, %q; want start and end of one command:\n%s",
				i+1, i+2, lines[i], lines[i+1], strings.Join(lines, "\n"))
		}
		fence, err := strconv.ParseInt(s[2], 10, 64)
		if err != nil {
			t.Fatalf("REMUTEX_FENCE = %q: %v", s[2], err)
		}
		if fence <= lastFence {
			t.Errorf("fencing token %d after %d, want increasing", fence, lastFence)
		}
		lastFence = fence
	}
}

// TestRunExitStatus checks the exit status of run: the command's own, the
// shell's 128+N for a signal, and remutex's for commands that cannot run.
func TestRunExitStatus(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	notExec := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		want    int
		stderr  string
		lockSet bool // the lock was taken (its fencing counter exists)
	}{
		{"success", []string{"--", "true"}, 0, "", true},
		{"failure", []string{"--", "sh", "-c", "exit 7"}, 7, "", true},
		{"without dashes", []string{"sh", "-c", "exit 3"}, 3, "", true},
		{"killed by SIGTERM", []string{"--", "sh", "-c", "kill -TERM $$"}, 128 + 15, "", true},
		{"fence variable", []string{"--", "sh", "-c", `test -n "$REMUTEX_FENCE"`}, 0, "", true},
		{"renamed fence variable", []string{"--fence-env", "TOKEN", "NAME", "--", "sh", "-c", `test -n "$TOKEN" && test -z "$REMUTEX_FENCE"`}, 0, "", true},
		{"no fencing", []string{"--fence-env=", "NAME", "--", "sh", "-c", `test -z "$REMUTEX_FENCE"`}, 0, "", false},
		{"not found", []string{"--", "remutex-test-no-such-command"}, exitNotFound, "not found", false},
		{"not executable", []string{"--", notExec}, exitCannotRun, "permission denied", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			name := lockName(t, "lock")
			args := append([]string{"--addr", srv.addr(), "run"}, tt.args...)
			if tt.args[0] == "--" || !strings.HasPrefix(tt.args[0], "-") {
				args = append([]string{"--addr", srv.addr(), "run", name}, tt.args...)
			}
			for i, a := range args {
				if a == "NAME" {
					args[i] = name
				}
			}
			code, _, stderr := run(t, cliEnv(), "", args...)
			if code != tt.want {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, tt.want, stderr)
			}
			if !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stderr %q does not mention %q", stderr, tt.stderr)
			}
			st := lockState(t, srv.addr(), name)
			if st.Held {
				t.Errorf("lock still held after run exited: %+v", st)
			}
			if got := st.Fence != 0; got != tt.lockSet {
				t.Errorf("fencing counter exists: %v, want %v (fence %d)", got, tt.lockSet, st.Fence)
			}
		})
	}
}

// holdLock starts remutex run holding name with a command that writes its
// pid and fencing token to a file and sleeps; it returns once the command
// runs. With addr "", args give the connection flags.
func holdLock(t testing.TB, addr, name string, args ...string) (p *proc, pid int, fence int64) {
	t.Helper()
	info := filepath.Join(t.TempDir(), "holder")
	conn := []string{"--addr", addr}
	if addr == "" {
		conn = nil // args hold the connection flags
	}
	args = append(append(append(conn, "run"), args...),
		name, "--", "sh", "-c", `echo "$$ $REMUTEX_FENCE" > "$INFO.tmp" && mv "$INFO.tmp" "$INFO" && exec sleep 30`)
	p = start(t, cliEnv("INFO="+info), "", args...)
	await(t, 30*time.Second, "the holder's command to start", func() bool {
		if p.exited() {
			t.Fatalf("holder exited with status %d; stderr:\n%s", p.cmd.ProcessState.ExitCode(), p.stderr())
		}
		return readFile(t, info) != ""
	})
	if _, err := fmt.Sscan(readFile(t, info), &pid, &fence); err != nil {
		t.Fatalf("holder info %q: %v", readFile(t, info), err)
	}
	return p, pid, fence
}

// TestRunWaitTimeout checks --wait: a busy lock makes run give up with
// status 75 without running the command, after waiting or at once.
func TestRunWaitTimeout(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "lock")
	holder, _, _ := holdLock(t, srv.addr(), name)
	ran := filepath.Join(t.TempDir(), "ran")
	for _, wait := range []string{"300ms", "0"} {
		code, _, stderr := run(t, cliEnv("RAN="+ran), "", "--addr", srv.addr(), "run", "--wait", wait, name, "--", "sh", "-c", `echo ran > "$RAN"`)
		if code != exitTimeout {
			t.Errorf("--wait %s: exit status %d, want %d; stderr:\n%s", wait, code, exitTimeout, stderr)
		}
		if m := holderForm.FindStringSubmatch(stderr); m == nil || !strings.Contains(stderr, "is held by "+m[0]) ||
			m[1] != m[4] || m[2] != m[3] || m[3] != strconv.Itoa(holder.cmd.Process.Pid) {
			t.Errorf("--wait %s: stderr does not name the holder:\n%s", wait, stderr)
		}
		if readFile(t, ran) != "" {
			t.Errorf("--wait %s: the command ran although the lock was held", wait)
		}
	}
	holder.signal(syscall.SIGTERM) // passed on to sleep, which dies of it
	if code := holder.wait(30 * time.Second); code != 128+15 {
		t.Errorf("holder: exit status %d, want %d; stderr:\n%s", code, 128+15, holder.stderr())
	}
	if code, _, stderr := run(t, cliEnv("RAN="+ran), "", "--addr", srv.addr(), "run", "--wait", "0", name, "--", "sh", "-c", `echo ran > "$RAN"`); code != 0 || !fileHas(t, ran, "ran") {
		t.Errorf("free lock with --wait 0: exit status %d, command ran: %v; stderr:\n%s", code, fileHas(t, ran, "ran"), stderr)
	}
}

// TestRunForwardsSignals sends SIGINT, SIGTERM and SIGHUP to remutex while
// its command runs: the command receives each once, and its exit status
// comes back.
func TestRunForwardsSignals(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	for i, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			name := lockName(t, "lock")
			log := filepath.Join(t.TempDir(), "log")
			trap := strings.TrimPrefix(fmt.Sprint(map[syscall.Signal]string{syscall.SIGINT: "INT", syscall.SIGTERM: "TERM", syscall.SIGHUP: "HUP"}[sig]), "SIG")
			script := fmt.Sprintf(`trap 'echo got >> "$LOG"; exit %d' %s; echo ready >> "$LOG"; while :; do sleep 0.05; done`, 10+i, trap)
			p := start(t, cliEnv("LOG="+log), "", "--addr", srv.addr(), "run", name, "--", "sh", "-c", script)
			await(t, 30*time.Second, "the command to start", func() bool { return fileHas(t, log, "ready") })
			p.signal(sig)
			if code := p.wait(30 * time.Second); code != 10+i {
				t.Errorf("exit status %d, want the command's %d; stderr:\n%s", code, 10+i, p.stderr())
			}
			if got := strings.Count(readFile(t, log), "got"); got != 1 {
				t.Errorf("the command saw the signal %d times, want once", got)
			}
			if st := lockState(t, srv.addr(), name); st.Held {
				t.Errorf("lock still held: %+v", st)
			}
		})
	}
}

// TestRunInterruptedWhileWaiting interrupts a run that waits for a busy lock:
// it exits with 128+SIGINT, without running the command or staying queued.
func TestRunInterruptedWhileWaiting(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "lock")
	holdLock(t, srv.addr(), name)
	ran := filepath.Join(t.TempDir(), "ran")
	p := start(t, cliEnv("RAN="+ran), "", "--addr", srv.addr(), "run", name, "--", "sh", "-c", `echo ran > "$RAN"`)
	await(t, 10*time.Second, "the waiter to queue", func() bool { return lockState(t, srv.addr(), name).Queued > 0 })
	p.signal(syscall.SIGINT)
	if code := p.wait(30 * time.Second); code != 128+2 {
		t.Errorf("exit status %d, want %d; stderr:\n%s", code, 128+2, p.stderr())
	}
	if readFile(t, ran) != "" {
		t.Error("the command ran")
	}
	if st := lockState(t, srv.addr(), name); st.Queued != 0 {
		t.Errorf("%d waiters still queued after the waiter left, want 0", st.Queued)
	}
}

// TestRunHolderKilled kills a holding remutex with SIGKILL: its lock ends
// within its lease and a waiting run gets it. On Linux the holder's command
// dies with it.
func TestRunHolderKilled(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "lock")
	holder, pid, fenceA := holdLock(t, srv.addr(), name, "--lease", "1s")
	out := filepath.Join(t.TempDir(), "out")
	waiter := start(t, cliEnv("OUT="+out), "", "--addr", srv.addr(), "run", "--lease", "1s", name, "--", "sh", "-c", `echo "$REMUTEX_FENCE" > "$OUT"`)
	awaitWaiter(t, srv.addr(), name)
	if waiter.exited() || readFile(t, out) != "" {
		t.Fatal("the waiter ran while the lock was held")
	}

	holder.signal(syscall.SIGKILL)
	if code := waiter.wait(30 * time.Second); code != 0 {
		t.Fatalf("waiter: exit status %d, want 0; stderr:\n%s", code, waiter.stderr())
	}
	fenceB, err := strconv.ParseInt(strings.TrimSpace(readFile(t, out)), 10, 64)
	if err != nil || fenceB <= fenceA {
		t.Errorf("waiter's fencing token %q, want a number above the holder's %d", readFile(t, out), fenceA)
	}
	if runtime.GOOS == "linux" {
		await(t, 10*time.Second, fmt.Sprintf("the holder's command (pid %d) to die with it", pid), func() bool { return !alive(pid) })
	}
}

// alive reports whether process pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

// stopTraps are the commands' two ways to take the SIGTERM of a lost lease,
// and what then shows: in the command's log, or in remutex's stderr.
var stopTraps = []struct {
	name, trap, want string
}{
	{"command stops on SIGTERM", `trap 'echo got TERM >> "$LOG"; exit 0' TERM`, "got TERM"},
	{"command ignores SIGTERM", `trap '' TERM`, "SIGKILL"},
}

// TestRunLostLease deletes the lock's key behind the holder's back: remutex
// sees the lease lost, sends the command SIGTERM (then SIGKILL after --grace
// if it ignores that), and exits with status 79.
func TestRunLostLease(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	for _, tt := range stopTraps {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			name := lockName(t, "lock")
			log := filepath.Join(t.TempDir(), "log")
			script := tt.trap + `; echo ready >> "$LOG"; while :; do sleep 0.05; done`
			p := start(t, cliEnv("LOG="+log), "", "--addr", srv.addr(), "run", "--lease", "600ms", "--grace", "300ms", name, "--", "sh", "-c", script)
			await(t, 30*time.Second, "the command to start", func() bool { return fileHas(t, log, "ready") })

			if err := rdbFor(t, srv.addr()).Del(context.Background(), "remutex:{"+name+"}").Err(); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(30 * time.Second); code != exitLost {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, exitLost, p.stderr())
			}
			if got := readFile(t, log) + p.stderr(); !strings.Contains(got, tt.want) {
				t.Errorf("log and stderr do not show %q:\n%s", tt.want, got)
			}
			if !strings.Contains(p.stderr(), "lost") {
				t.Errorf("stderr does not report the loss:\n%s", p.stderr())
			}
		})
	}
}

// TestRunRedisGone kills the Redis server while the command runs: the lease
// cannot be renewed, remutex declares it lost before it can expire, stops the
// command and exits with status 79.
func TestRunRedisGone(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	name := lockName(t, "lock")
	log := filepath.Join(t.TempDir(), "log")
	script := `trap 'echo got TERM >> "$LOG"; exit 0' TERM; echo ready >> "$LOG"; while :; do sleep 0.05; done`
	p := start(t, cliEnv("LOG="+log), "", "--addr", srv.addr(), "run", "--lease", "1s", name, "--", "sh", "-c", script)
	await(t, 30*time.Second, "the command to start", func() bool { return fileHas(t, log, "ready") })
	srv.stop()
	if code := p.wait(30 * time.Second); code != exitLost {
		t.Errorf("exit status %d, want %d; stderr:\n%s", code, exitLost, p.stderr())
	}
	if !fileHas(t, log, "got TERM") {
		t.Errorf("the command was not sent SIGTERM; stderr:\n%s", p.stderr())
	}
	if !strings.Contains(p.stderr(), "no renewal succeeded") {
		t.Errorf("stderr does not give the cause of the loss:\n%s", p.stderr())
	}
}

// TestRunSignalWhileConnecting sends SIGTERM while the server does not
// answer the first PING: remutex stops at once (not after its 10s connection
// timeout) with status 128+SIGTERM.
func TestRunSignalWhileConnecting(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		for c := range accepted {
			_ = c.Close()
		}
	})
	ran := filepath.Join(t.TempDir(), "ran")
	p := start(t, cliEnv("RAN="+ran), "", "--addr", l.Addr().String(), "run", "x", "--", "sh", "-c", `echo ran > "$RAN"`)
	await(t, 10*time.Second, "remutex to connect", func() bool { return len(accepted) > 0 })
	p.signal(syscall.SIGTERM)
	if code := p.wait(5 * time.Second); code != 128+15 {
		t.Errorf("exit status %d, want %d; stderr:\n%s", code, 128+15, p.stderr())
	}
	if readFile(t, ran) != "" {
		t.Error("the command ran")
	}
}

// TestRunArgumentUsageErrors: command lines that run would misread are
// usage errors (status 64, one line, the command not run, Redis never
// reached): a name forgotten before "--", anything between NAME and "--",
// a --fence-env that is no environment variable name; and the flag
// package's own errors name flags as users write them, with two dashes.
func TestRunArgumentUsageErrors(t *testing.T) {
	oneDash := regexp.MustCompile(`[ :]-[a-z]`)
	t.Parallel()
	ran := filepath.Join(t.TempDir(), "ran")
	record := []string{"sh", "-c", `echo ran >> "$RAN"`}
	tests := []struct {
		args   []string
		stderr string
	}{
		{append([]string{"run", "--"}, record...), "no lock name before --"},
		{append([]string{"run", "--wait", "0", "--"}, record...), "no lock name before --"},
		{append([]string{"run", "x", "y", "--"}, record...), `"y" between the lock name "x" and --`},
		{append([]string{"run", "x", "y", "z", "--"}, record...), `"y z" between the lock name "x" and --`},
		{append([]string{"run", "--fence-env", "1BAD", "x", "--"}, record...), `--fence-env "1BAD" is not a variable name`},
		{append([]string{"run", "--fence-env", "A-B", "x", "--"}, record...), `--fence-env "A-B" is not a variable name`},
		{append([]string{"run", "--fence-env", "A B", "x", "--"}, record...), `--fence-env "A B" is not a variable name`},
		{[]string{"run", "--lease"}, "flag needs an argument: --lease"},
		{[]string{"run", "--lease", "5", "x", "--", "true"}, `invalid value "5" for flag --lease: a duration needs a unit`},
		{[]string{"run", "--nope", "x", "--", "true"}, "flag provided but not defined: --nope"},
		{[]string{"--nope", "status", "x"}, "flag provided but not defined: --nope"},
		{[]string{"run", "--read=maybe", "x", "--", "true"}, "for --read"},
	}
	for _, tt := range tests {
		code, _, stderr := run(t, cliEnv("REDIS_ADDR=127.0.0.1:1", "RAN="+ran), "", tt.args...)
		if code != exitUsage || !strings.Contains(stderr, tt.stderr) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("remutex %q: exit status %d, want %d with one line mentioning %q; stderr:\n%s", tt.args, code, exitUsage, tt.stderr, stderr)
		}
		if oneDash.MatchString(stderr) {
			t.Errorf("remutex %q: a flag named with one dash: %s", tt.args, stderr)
		}
	}
	if got := readFile(t, ran); got != "" {
		t.Errorf("a command ran after a usage error: %q", got)
	}
	// A valid name with the fencing token still runs.
	if code, _, stderr := run(t, cliEnv("REDIS_ADDR="+sharedRedis(t).addr()), "", "run", "--fence-env", "_TOKEN_2", lockName(t, "lock"), "--", "sh", "-c", `test -n "$_TOKEN_2"`); code != 0 {
		t.Errorf("--fence-env _TOKEN_2: exit status %d, want 0; stderr:\n%s", code, stderr)
	}
}

// TestRunWaitBoundsAPausedRedis: against a Redis that does not answer (a
// paused server), run --wait 0 and --wait 1s give up within their bound
// (TryLock's for --wait 0), with the Redis error status, saying that Redis
// did not answer within it; the command does not run.
func TestRunWaitBoundsAPausedRedis(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	srv.Signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { srv.Signal(t, syscall.SIGCONT) })
	ran := filepath.Join(t.TempDir(), "ran")
	for _, tt := range []struct {
		wait  string
		bound time.Duration
		say   string
	}{
		{"0", remutex.TryLockTimeout, fmt.Sprintf("did not answer within %v (--wait 0)", remutex.TryLockTimeout)},
		{"1s", time.Second, "did not answer within --wait 1s"},
	} {
		p := start(t, cliEnv("RAN="+ran), "", "--addr", srv.addr(), "run", "--wait", tt.wait, lockName(t, "lock"), "--", "sh", "-c", `echo ran > "$RAN"`)
		// The slack is for a loaded machine; the bug it catches took 5s.
		if code := p.wait(tt.bound + 2*time.Second); code != exitRedis {
			t.Errorf("--wait %s against a paused Redis: exit status %d, want %d; stderr:\n%s", tt.wait, code, exitRedis, p.stderr())
		}
		if !strings.Contains(p.stderr(), tt.say) || !strings.Contains(p.stderr(), srv.addr()) {
			t.Errorf("--wait %s against a paused Redis: stderr should say that Redis at %s %s; got:\n%s", tt.wait, srv.addr(), tt.say, p.stderr())
		}
	}
	if readFile(t, ran) != "" {
		t.Error("the command ran")
	}
}

// TestRunForcedReleaseBeforeRenewal: the lock of a running command is
// force-released and taken by another run before the holder's next
// renewal (a third of the lease); the command ends first. remutex must not
// report success: its release finds the hold gone, and it exits with
// status 79.
func TestRunForcedReleaseBeforeRenewal(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "lock")
	dir := t.TempDir()
	log, gate := filepath.Join(dir, "log"), filepath.Join(dir, "gate")
	script := `echo ready >> "$LOG"; while [ ! -e "$GATE" ]; do sleep 0.02; done`
	p := start(t, cliEnv("LOG="+log, "GATE="+gate), "", "--addr", srv.addr(), "run", "--lease", "30s", name, "--", "sh", "-c", script)
	await(t, 30*time.Second, "the command to start", func() bool { return fileHas(t, log, "ready") })

	if code, stdout, stderr := run(t, cliEnv(), "", "--addr", srv.addr(), "unlock", "--force", "--yes", name); code != 0 {
		t.Fatalf("unlock --force: exit status %d; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	other := filepath.Join(dir, "other")
	if code, _, stderr := run(t, cliEnv("OUT="+other), "", "--addr", srv.addr(), "run", "--wait", "0", name, "--", "sh", "-c", `echo ran > "$OUT"`); code != 0 {
		t.Fatalf("a second run after the forced release: exit status %d, want 0; stderr:\n%s", code, stderr)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(30 * time.Second); code != exitLost {
		t.Errorf("the first run, whose lock was taken from it: exit status %d, want %d; stderr:\n%s", code, exitLost, p.stderr())
	}
}
