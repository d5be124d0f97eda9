//go:build unix

package main

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Tests of read/write locks from the command line: run --read and --write,
// and status and unlock --force of their read and write holds.

// rwLockState reads the state of the read/write lock name in-process.
func rwLockState(t testing.TB, addr, name string) lockStatus {
	t.Helper()
	return lockState(t, addr, name).ofKind(kindRWMutex)
}

// statusJSON runs status --json for names and decodes its output.
func statusJSON(t *testing.T, addr string, names ...string) []lockStatus {
	t.Helper()
	code, stdout, stderr := run(t, cliEnv(), "", append([]string{"--addr", addr, "status", "--json"}, names...)...)
	if code != 0 {
		t.Fatalf("status --json: exit status %d, want 0; stderr:\n%s", code, stderr)
	}
	var got []lockStatus
	if err := json.Unmarshal([]byte(stdout), &got); err != nil || len(got) != len(names) {
		t.Fatalf("status --json: want %d locks, got %v:\n%s", len(names), err, stdout)
	}
	return got
}

// statusTable runs status for name and returns the lines of its table of
// locks with their columns split at white space, the header first. (STATE
// "read ×N" is two fields.)
func statusTable(t *testing.T, addr, name string) [][]string {
	t.Helper()
	locks, _ := statusTables(t, addr, name)
	return locks
}

// statusTables runs status for name and returns the lines of both its
// tables, locks and waiters (nil when nobody waits), split as statusTable
// splits them.
func statusTables(t *testing.T, addr, name string) (locks, waiters [][]string) {
	t.Helper()
	code, stdout, stderr := run(t, cliEnv(), "", "--addr", addr, "status", name)
	if code != 0 {
		t.Fatalf("status: exit status %d, want 0; stderr:\n%s", code, stderr)
	}
	first, second, _ := strings.Cut(strings.TrimSuffix(stdout, "\n"), "\n\n")
	split := func(table string) [][]string {
		var rows [][]string
		for _, line := range strings.Split(table, "\n") {
			rows = append(rows, strings.Fields(line))
		}
		return rows
	}
	if second != "" {
		waiters = split(second)
	}
	return split(first), waiters
}

// TestRunReadWrite: two run --read share the lock; run --write waits for
// them, and run --read behind a waiting writer waits too (both give up with
// --wait 0, naming why). status shows the read holds and the waiting
// writer; unlock --force asks about both read holds, then releases them: the
// waiting --write run is handed the lock and runs, the readers find their
// leases lost.
func TestRunReadWrite(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	addr := srv.addr()
	name := lockName(t, "lock")
	r1, pid1, fence1 := holdLock(t, addr, name, "--read", "--lease", "2s")
	r2, pid2, _ := holdLock(t, addr, name, "--read", "--lease", "2s")
	if fence1 != 0 {
		t.Errorf("a reader's fencing token before any write: %d, want 0", fence1)
	}

	ran := filepath.Join(t.TempDir(), "ran")
	code, _, stderr := run(t, cliEnv("RAN="+ran), "", "--addr", addr, "run", "--write", "--wait", "0", name, "--", "sh", "-c", `echo ran > "$RAN"`)
	if code != exitTimeout || !regexp.MustCompile(`is held for reading by \S+ \(pid \d+ on \S+\) and 1 other readers`).MatchString(stderr) {
		t.Errorf("run --write --wait 0 while read: exit status %d, want %d, naming the readers; stderr:\n%s", code, exitTimeout, stderr)
	}
	out := filepath.Join(t.TempDir(), "out")
	writer := start(t, cliEnv("OUT="+out), "", "--addr", addr, "run", "--write", name, "--", "sh", "-c", `echo "$REMUTEX_FENCE" > "$OUT"`)
	await(t, 10*time.Second, "the writer to queue", func() bool { return rwLockState(t, addr, name).WritersWaiting == 1 })
	code, _, stderr = run(t, cliEnv("RAN="+ran), "", "--addr", addr, "run", "--read", "--wait", "0", name, "--", "sh", "-c", `echo ran > "$RAN"`)
	if code != exitTimeout || !strings.Contains(stderr, "has writers waiting (1), which go before new readers") {
		t.Errorf("run --read --wait 0 behind a waiting writer: exit status %d, want %d; stderr:\n%s", code, exitTimeout, stderr)
	}
	if readFile(t, ran) != "" {
		t.Error("a command ran although its lock was not free")
	}

	st := statusJSON(t, addr, name)[0]
	if st.Kind != kindRWMutex || st.Key != "remutex:{"+name+"}:rw" || !st.Held || st.Readers != 2 || st.Queued != 1 || st.WritersWaiting != 1 || len(st.Others) != 0 {
		t.Errorf("status --json: got %+v, want kind rwmutex, key remutex:{%s}:rw, 2 readers, 1 writer queued", st, name)
	}
	pids := map[int]bool{pid1: false, pid2: false}
	for _, h := range st.Holders {
		pids[h.PID] = true
		if !h.Read || h.Count != 1 || h.TTLMillis <= 0 || h.TTLMillis > 2000 {
			t.Errorf("holder %+v: want a read hold, count 1, ttl_ms within the 2s lease", h)
		}
	}
	if len(st.Holders) != 2 || !pids[r1.cmd.Process.Pid] || !pids[r2.cmd.Process.Pid] {
		t.Errorf("holders %+v: want the two run --read processes", st.Holders)
	}
	rows := statusTable(t, addr, name)
	for _, row := range rows[1:] {
		// NAME, STATE (read ×2), KIND, HOLDER, MODE, HOST, PID, COUNT, TTL, FENCE, QUEUED, WRITERS-WAITING, SUBSCRIBERS
		if len(row) != 14 || row[0] != name || row[1] != "read" || row[2] != "×2" || row[3] != kindRWMutex || row[5] != "read" || row[11] != "1" || row[12] != "1" {
			t.Errorf("status line %q: want %s read ×2 rwmutex <owner> read ... queued 1, writers waiting 1", strings.Join(row, " "), name)
		}
	}
	if len(rows) != 3 {
		t.Errorf("status: got %d lines, want a header and one per reader: %q", len(rows), rows)
	}

	code, _, stderr = run(t, cliEnv(), "n\n", "--addr", addr, "unlock", "--force", name)
	if code != exitDeclined || !strings.Contains(stderr, "has 2 holds") || strings.Count(stderr, "held for reading by") != 2 {
		t.Errorf("unlock answered n: exit status %d, want %d, listing both read holds; stderr:\n%s", code, exitDeclined, stderr)
	}
	code, stdout, stderr := run(t, cliEnv(), "", "--addr", addr, "unlock", "--force", "--yes", name)
	if code != 0 || !strings.Contains(stdout, "released lock") || strings.Count(stdout, "held for reading by") != 2 {
		t.Fatalf("unlock --force --yes: exit status %d, want 0, naming both read holds; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if code := writer.wait(30 * time.Second); code != 0 {
		t.Fatalf("the waiting writer: exit status %d, want 0; stderr:\n%s", code, writer.stderr())
	}
	if f, err := strconv.ParseInt(strings.TrimSpace(readFile(t, out)), 10, 64); err != nil || f <= 0 {
		t.Errorf("the writer's fencing token %q, want a number above 0", readFile(t, out))
	}
	for i, r := range []*proc{r1, r2} {
		if code := r.wait(30 * time.Second); code != exitLost {
			t.Errorf("reader %d: exit status %d, want %d; stderr:\n%s", i, code, exitLost, r.stderr())
		}
	}
}

// TestUnlockForceWriteHold: status shows a run --write holding the lock and
// two run --read waiting; unlock --force releases the frozen writer's hold,
// and both readers are handed the lock together; the writer, resumed,
// finds its lease lost.
func TestUnlockForceWriteHold(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	addr := srv.addr()
	name := lockName(t, "lock")
	// A lease that outlasts the steps up to unlock --force on a busy
	// machine: the stopped writer must still hold then.
	holder, _, fence := holdLock(t, addr, name, "--write", "--lease", "30s")
	holder.signal(syscall.SIGSTOP)
	code, _, stderr := run(t, cliEnv(), "", "--addr", addr, "run", "--read", "--wait", "0", name, "--", "true")
	if m := holderForm.FindStringSubmatch(stderr); code != exitTimeout || m == nil || !strings.Contains(stderr, "is held for writing by "+m[0]) ||
		m[3] != strconv.Itoa(holder.cmd.Process.Pid) {
		t.Errorf("run --read --wait 0 while written: exit status %d, want %d, naming the writer; stderr:\n%s", code, exitTimeout, stderr)
	}
	dir := t.TempDir()
	var readers []*proc
	for i := range 2 {
		out := filepath.Join(dir, strconv.Itoa(i))
		readers = append(readers, start(t, cliEnv("OUT="+out), "", "--addr", addr, "run", "--read", name, "--", "sh", "-c", `echo "$REMUTEX_FENCE" > "$OUT"`))
	}
	await(t, 10*time.Second, "two readers to queue", func() bool { return rwLockState(t, addr, name).Queued == 2 })

	rows := statusTable(t, addr, name)
	if len(rows) != 2 || len(rows[1]) != 13 || rows[1][1] != "write" || rows[1][2] != kindRWMutex || rows[1][4] != "write" ||
		rows[1][6] != strconv.Itoa(holder.cmd.Process.Pid) || rows[1][9] != strconv.FormatInt(fence, 10) || rows[1][10] != "2" || rows[1][11] != "0" {
		t.Errorf("status: want one line: %s write rwmutex <owner> write <host> %d 1 <ttl> %d 2 0 <subscribers>; got %q", name, holder.cmd.Process.Pid, fence, rows)
	}

	code, stdout, stderr := run(t, cliEnv(), "", "--addr", addr, "unlock", "--force", "--yes", name)
	if code != 0 || !strings.Contains(stdout, "released lock") || !strings.Contains(stdout, "held for writing by") {
		t.Fatalf("unlock --force --yes: exit status %d, want 0, naming the write hold; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for i, r := range readers {
		if code := r.wait(30 * time.Second); code != 0 {
			t.Errorf("reader %d: exit status %d, want 0; stderr:\n%s", i, code, r.stderr())
		}
		if got := strings.TrimSpace(readFile(t, filepath.Join(dir, strconv.Itoa(i)))); got != strconv.FormatInt(fence, 10) {
			t.Errorf("reader %d's fencing token %q, want the latest write's, %d", i, got, fence)
		}
	}
	holder.signal(syscall.SIGCONT)
	if code := holder.wait(30 * time.Second); code != exitLost {
		t.Errorf("resumed writer: exit status %d, want %d; stderr:\n%s", code, exitLost, holder.stderr())
	}
}

// TestStatusMixedKinds: a mutex and a read/write lock of one name are two
// locks: both run at once, status shows both, and unlock --force releases
// both.
func TestStatusMixedKinds(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	addr := srv.addr()
	name := lockName(t, "lock")
	m, _, _ := holdLock(t, addr, name, "--lease", "2s")
	w, _, _ := holdLock(t, addr, name, "--write", "--lease", "2s")

	st := statusJSON(t, addr, name)[0]
	if st.Kind != kindMutex || len(st.Holders) != 1 || st.Holders[0].PID != m.cmd.Process.Pid || len(st.Others) != 1 {
		t.Fatalf("status --json: got %+v, want the mutex held by pid %d, and one other lock", st, m.cmd.Process.Pid)
	}
	if o := st.Others[0]; o.Kind != kindRWMutex || len(o.Holders) != 1 || o.Holders[0].Read || o.Holders[0].PID != w.cmd.Process.Pid {
		t.Errorf("status --json: other %+v, want the read/write lock held for writing by pid %d", o, w.cmd.Process.Pid)
	}
	rows := statusTable(t, addr, name)
	if len(rows) != 3 || rows[1][1] != "held" || rows[1][2] != kindMutex || rows[2][1] != "write" || rows[2][2] != kindRWMutex {
		t.Errorf("status: want the mutex's line and the read/write lock's; got %q", rows)
	}

	code, stdout, stderr := run(t, cliEnv(), "", "--addr", addr, "unlock", "--force", "--yes", name)
	if code != 0 || !strings.Contains(stdout, "released lock") || !strings.Contains(stdout, "held by") || !strings.Contains(stdout, "held for writing by") {
		t.Fatalf("unlock --force --yes: exit status %d, want 0, naming both holds; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, p := range []*proc{m, w} {
		if code := p.wait(30 * time.Second); code != exitLost {
			t.Errorf("holder: exit status %d, want %d; stderr:\n%s", code, exitLost, p.stderr())
		}
	}
	if st := lockState(t, addr, name); len(holdsOf(st)) != 0 {
		t.Errorf("after unlock: %+v, want nothing held", st)
	}
}
