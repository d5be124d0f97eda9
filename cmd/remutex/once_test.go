//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Tests of remutex once: its exit statuses, the waiters of a failed run,
// --wait, and a runner killed mid-run.

// onceJob is the command of the once tests: it appends its fencing token to
// $LOG, waits (up to 30s) for the file $GO to exist if $GO is set, and
// exits with $STATUS.
const onceJob = `
echo "$REMUTEX_FENCE" >> "$LOG"
if [ -n "$GO" ]; then
	i=0
	while [ ! -e "$GO" ] && [ "$i" -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
fi
exit "${STATUS:-0}"
`

// onceRuns is the number of runs of onceJob logged at path.
func onceRuns(t testing.TB, path string) int {
	return strings.Count(readFile(t, path), "\n")
}

// awaitOnceWaiters waits until n callers wait for once name's run.
func awaitOnceWaiters(t testing.TB, addr, name string, n int64) {
	t.Helper()
	await(t, 10*time.Second, strconv.FormatInt(n, 10)+" waiters of once "+name, func() bool {
		return lockState(t, addr, name).ofKind(kindOnce).Queued == n
	})
}

// TestOnceExitStatus: a success is run once and every later once exits 0
// without running; a failure exits with the command's status and the next
// once runs it again.
func TestOnceExitStatus(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	for _, tt := range []struct {
		name      string
		status    string
		want      []int // the exit statuses of three onces one after another
		wantRuns  int
		afterText string
	}{
		{"success", "0", []int{0, 0, 0}, 1, ""},
		{"failure", "7", []int{7, 7, 7}, 3, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			name := lockName(t, "once")
			log := filepath.Join(t.TempDir(), "log")
			env := cliEnv("LOG="+log, "STATUS="+tt.status)
			for i, want := range tt.want {
				code, _, stderr := run(t, env, "", "--addr", srv.addr(), "once", name, "--", "sh", "-c", onceJob)
				if code != want {
					t.Errorf("once %d: exit status %d, want %d; stderr:\n%s", i+1, code, want, stderr)
				}
			}
			if got := onceRuns(t, log); got != tt.wantRuns {
				t.Errorf("runs of the command: %d, want %d", got, tt.wantRuns)
			}
			if st := lockState(t, srv.addr(), name).ofKind(kindOnce); st.Held || st.Queued != 0 {
				t.Errorf("the once's lock after the runs: %+v, want free", st)
			}
		})
	}
}

// TestOnceWaitersOfAFailedRun: the onces that waited for a run that failed
// exit 80 without running the command, and say whose run it was; the next
// once runs it and succeeds, and then a once exits 0 without running.
func TestOnceWaitersOfAFailedRun(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "once")
	dir := t.TempDir()
	log, goFile := filepath.Join(dir, "log"), filepath.Join(dir, "go")
	runner := start(t, cliEnv("LOG="+log, "GO="+goFile, "STATUS=3"), "", "--addr", srv.addr(), "once", name, "--", "sh", "-c", onceJob)
	await(t, 10*time.Second, "the runner's command to start", func() bool { return onceRuns(t, log) == 1 })
	var waiters []*proc
	for range 2 {
		waiters = append(waiters, start(t, cliEnv("LOG="+log), "", "--addr", srv.addr(), "once", name, "--", "sh", "-c", onceJob))
	}
	awaitOnceWaiters(t, srv.addr(), name, 2)
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := runner.wait(30 * time.Second); code != 3 {
		t.Errorf("runner: exit status %d, want 3; stderr:\n%s", code, runner.stderr())
	}
	for i, w := range waiters {
		code := w.wait(30 * time.Second)
		if code != exitRunFailed {
			t.Errorf("waiter %d: exit status %d, want %d; stderr:\n%s", i, code, exitRunFailed, w.stderr())
		}
		if s := w.stderr(); !strings.Contains(s, "status 3") || !strings.Contains(s, "pid "+strconv.Itoa(runner.cmd.Process.Pid)) {
			t.Errorf("waiter %d: stderr %q does not name the run's status and the runner's pid %d", i, s, runner.cmd.Process.Pid)
		}
	}
	if got := onceRuns(t, log); got != 1 {
		t.Errorf("runs of the command by the runner and its waiters: %d, want 1", got)
	}
	if code, _, stderr := run(t, cliEnv("LOG="+log), "", "--addr", srv.addr(), "once", name, "--", "sh", "-c", onceJob); code != 0 {
		t.Errorf("the next once: exit status %d, want 0; stderr:\n%s", code, stderr)
	}
	if code, _, stderr := run(t, cliEnv("LOG="+log, "STATUS=9"), "", "--addr", srv.addr(), "once", name, "--", "sh", "-c", onceJob); code != 0 {
		t.Errorf("a once after the success: exit status %d, want 0; stderr:\n%s", code, stderr)
	}
	if got := onceRuns(t, log); got != 2 {
		t.Errorf("runs of the command: %d, want 2", got)
	}
}

// TestOnceWaitTimeout: a once whose --wait passes while another runs
// exits 75 without running; the run goes on and succeeds.
func TestOnceWaitTimeout(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "once")
	dir := t.TempDir()
	log, goFile := filepath.Join(dir, "log"), filepath.Join(dir, "go")
	runner := start(t, cliEnv("LOG="+log, "GO="+goFile), "", "--addr", srv.addr(), "once", name, "--", "sh", "-c", onceJob)
	await(t, 10*time.Second, "the runner's command to start", func() bool { return onceRuns(t, log) == 1 })
	code, _, stderr := run(t, cliEnv("LOG="+log), "", "--addr", srv.addr(), "once", "--wait", "300ms", name, "--", "sh", "-c", onceJob)
	if code != exitTimeout || !strings.Contains(stderr, "--wait") {
		t.Errorf("once --wait 300ms: exit status %d, want %d with a message naming --wait; stderr:\n%s", code, exitTimeout, stderr)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := runner.wait(30 * time.Second); code != 0 {
		t.Errorf("runner: exit status %d, want 0; stderr:\n%s", code, runner.stderr())
	}
	if got := onceRuns(t, log); got != 1 {
		t.Errorf("runs of the command: %d, want 1", got)
	}
}

// TestOnceRunnerKilled: a runner SIGKILLed mid-run is taken over by the
// waiter once its lease ends: the waiter runs the command, with a higher
// fencing token, and exits 0.
func TestOnceRunnerKilled(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "once")
	dir := t.TempDir()
	log, goFile := filepath.Join(dir, "log"), filepath.Join(dir, "go")
	runner := start(t, cliEnv("LOG="+log, "GO="+goFile), "", "--addr", srv.addr(), "once", "--lease", "1s", name, "--", "sh", "-c", onceJob)
	await(t, 10*time.Second, "the runner's command to start", func() bool { return onceRuns(t, log) == 1 })
	waiter := start(t, cliEnv("LOG="+log), "", "--addr", srv.addr(), "once", "--lease", "1s", name, "--", "sh", "-c", onceJob)
	awaitOnceWaiters(t, srv.addr(), name, 1)
	runner.signal(syscall.SIGKILL)
	if code := waiter.wait(30 * time.Second); code != 0 {
		t.Fatalf("waiter: exit status %d, want 0; stderr:\n%s", code, waiter.stderr())
	}
	lines := strings.Fields(readFile(t, log))
	if len(lines) != 2 {
		t.Fatalf("runs logged: %q, want the runner's and the waiter's", lines)
	}
	a, errA := strconv.ParseInt(lines[0], 10, 64)
	b, errB := strconv.ParseInt(lines[1], 10, 64)
	if errA != nil || errB != nil || b <= a {
		t.Errorf("fencing tokens %q: want the waiter's above the runner's", lines)
	}
}

// TestOnceUsage: usage errors exit 64 with one line.
func TestOnceUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"once", "--", "true"}, "no once name"},
		{[]string{"once", "job"}, "no command"},
		{[]string{"once", "--wait", "0", "job", "--", "true"}, "--wait 0"},
		{[]string{"once", "--lease", "1ms", "job", "--", "true"}, "--lease"},
	} {
		var stdout, stderr strings.Builder
		c := &cli{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr,
			getenv: func(k string) string { return map[string]string{"REDIS_ADDR": "127.0.0.1:1"}[k] }}
		code := c.main(tt.args)
		if code != exitUsage || !strings.Contains(stderr.String(), tt.want) || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("remutex %q: exit status %d, want %d with one line mentioning %q; stderr:\n%s", tt.args, code, exitUsage, tt.want, stderr.String())
		}
	}
}

// TestOnceStatus: status shows a once running (its runner and waiter), then
// done, with the run that made it done (who, pid), in the table and in JSON.
func TestOnceStatus(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "once")
	dir := t.TempDir()
	log, goFile := filepath.Join(dir, "log"), filepath.Join(dir, "go")
	runner := start(t, cliEnv("LOG="+log, "GO="+goFile), "", "--addr", srv.addr(), "once", name, "--", "sh", "-c", onceJob)
	await(t, 10*time.Second, "the runner's command to start", func() bool { return onceRuns(t, log) == 1 })
	waiter := start(t, cliEnv("LOG="+log), "", "--addr", srv.addr(), "once", name, "--", "sh", "-c", onceJob)
	awaitOnceWaiters(t, srv.addr(), name, 1)
	code, stdout, stderr := run(t, cliEnv(), "", "--addr", srv.addr(), "status", name)
	pid := strconv.Itoa(runner.cmd.Process.Pid)
	if code != 0 || !strings.Contains(stdout, "running") || !strings.Contains(stdout, " "+pid+" ") ||
		!strings.Contains(stdout, strconv.Itoa(waiter.cmd.Process.Pid)) {
		t.Errorf("status while running: exit status %d, want 0 and the state running, the runner's pid %s and the waiter's; stdout:\n%s\nstderr:\n%s", code, pid, stdout, stderr)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := runner.wait(30*time.Second) + waiter.wait(30*time.Second); code != 0 {
		t.Fatalf("runner and waiter: exit statuses %d, want 0", code)
	}
	code, stdout, _ = run(t, cliEnv(), "", "--addr", srv.addr(), "status", name)
	if code != 0 || !strings.Contains(stdout, "done") || !strings.Contains(stdout, " "+pid+" ") {
		t.Errorf("status when done: exit status %d, want 0 and the state done with the runner's pid %s; stdout:\n%s", code, pid, stdout)
	}
	st := lockState(t, srv.addr(), name).ofKind(kindOnce)
	if st.Once == nil || !st.Once.Done || st.Once.Run == nil || strconv.Itoa(st.Once.Run.PID) != pid {
		t.Errorf("status of the once: %+v, want done by pid %s", st.Once, pid)
	}
}
