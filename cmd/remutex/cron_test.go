//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// Tests of run --min-hold and --max-hold: one cron line on several machines
// runs its job once per tick. The ticks are real time (1s) on a real
// redis-server; the bounds leave hundreds of milliseconds of slack for the
// time a remutex process takes to start.

// cronTick is the tick of these tests, and cronSkews how late each of the
// three runners starts a tick: the clocks of three machines.
const cronTick = time.Second

var cronSkews = []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond}

// cronEnv is cliEnv with extra, and without the race detector's sleep of
// 1s before a race-built remutex exits (GORACE's atexit_sleep_ms; race
// reports still come): the tests here wait for many short runs.
func cronEnv(extra ...string) []string {
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	return cliEnv(append([]string{"GORACE=" + gorace}, extra...)...)
}

// cronLock returns a lock name unique to this run of the test: a lock kept
// by its minimum hold outlives the test for a moment, and -count runs it
// again at once.
func cronLock(t *testing.T, suffix string) string {
	return lockName(t, suffix+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
}

// cronRunners starts, at tick k of the grid that begins at first, one
// remutex run per skew with args, its command given TICK=k, RUNNER=i (its
// index in the result) and LOG=log.
func cronRunners(t *testing.T, first time.Time, k int, log string, args ...string) []*proc {
	t.Helper()
	var procs []*proc
	for i, skew := range cronSkews {
		time.Sleep(time.Until(first.Add(time.Duration(k)*cronTick + skew))) // the runner's clock ticks
		env := cronEnv("TICK="+strconv.Itoa(k), "RUNNER="+strconv.Itoa(i), "LOG="+log)
		procs = append(procs, start(t, env, "", args...))
	}
	return procs
}

// runsPerTick counts the lines "<tick> ..." the commands appended to log.
func runsPerTick(t *testing.T, log string, ticks int) []int {
	t.Helper()
	runs := make([]int, ticks)
	for _, line := range strings.Fields(strings.ReplaceAll(readFile(t, log), " ", "_")) {
		k, err := strconv.Atoi(strings.SplitN(line, "_", 2)[0])
		if err != nil || k < 0 || k >= ticks {
			t.Fatalf("log line %q: want <tick> ...", line)
		}
		runs[k]++
	}
	return runs
}

// TestRunMinHoldOncePerTick runs the cron line of three machines whose
// clocks are 0, 50 and 100ms apart, for three ticks 2s apart: run --wait 0
// --min-hold 1s runs the job exactly once per tick, and the other runners
// exit with 75 without running it. (Without --min-hold the short job is
// done before the next runner looks, and runs up to three times a tick.)
// The hold's end lies 1s from either tick, more than a loaded machine takes
// to start a runner.
func TestRunMinHoldOncePerTick(t *testing.T) {
	// Serial: every runner's --wait 0 must be answered within TryLock's
	// 300ms, which the parallel tests of a busy machine can outlast.
	srv := sharedRedis(t)
	name := cronLock(t, "report")
	log := filepath.Join(t.TempDir(), "log")
	binary(t) // built before the first tick
	const ticks = 3
	args := []string{"--addr", srv.addr(), "run", "--wait", "0", "--min-hold", "1s", "--max-hold", "5s",
		name, "--", "sh", "-c", `echo "$TICK $$" >> "$LOG"`}
	first := time.Now().Add(100 * time.Millisecond)
	var procs [ticks][]*proc
	for k := range ticks {
		// Ticks 2s apart: tick k at first + 2k cronTick, named k.
		procs[k] = cronRunners(t, first.Add(time.Duration(k)*cronTick), k, log, args...)
	}
	for k := range ticks {
		statuses, ran := make([]int, len(procs[k])), 0
		for i, p := range procs[k] {
			switch statuses[i] = p.wait(30 * time.Second); {
			case statuses[i] == 0:
				ran++
			case statuses[i] != exitTimeout || !strings.Contains(p.stderr(), "the command did not run"):
				t.Errorf("tick %d, runner %d: exit status %d, want 0 or %d (skipped); stderr:\n%s", k, i, statuses[i], exitTimeout, p.stderr())
			}
		}
		if ran != 1 {
			t.Errorf("tick %d: exit statuses %v, want one 0 and the others %d", k, statuses, exitTimeout)
		}
	}
	for k, n := range runsPerTick(t, log, ticks) {
		if n != 1 {
			t.Errorf("tick %d: the job ran %d times, want once; log:\n%s", k, n, readFile(t, log))
		}
	}
}

// TestRunMaxHoldAfterCrash kills, with SIGKILL, the runner that took tick
// 0 while its job runs. Nobody releases its lock, so it stays held until
// its --max-hold of 3s has passed: tick 1 (at 1s) finds it held and skips,
// tick 2 (at 5s) runs the job again. The margins of 2s either side of the
// hold's end, and a --min-hold of 2s that keeps tick 2's runners from each
// finding the lock free, outlast how late a loaded machine starts a
// runner. On Linux the dead runner's job dies with it.
func TestRunMaxHoldAfterCrash(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := cronLock(t, "report")
	log := filepath.Join(t.TempDir(), "log")
	binary(t)
	// The job of tick 0 hangs; the others are quick.
	args := []string{"--addr", srv.addr(), "run", "--wait", "0", "--min-hold", "2s", "--max-hold", "3s",
		name, "--", "sh", "-c", `echo "$TICK $RUNNER $$" >> "$LOG"; if [ "$TICK" = 0 ]; then exec sleep 30; fi`}
	first := time.Now().Add(100 * time.Millisecond)

	tick0 := cronRunners(t, first, 0, log, args...)
	await(t, 10*time.Second, "the job of tick 0 to start", func() bool { return readFile(t, log) != "" })
	var holder, jobPID int
	if _, err := fmt.Sscanf(readFile(t, log), "0 %d %d", &holder, &jobPID); err != nil || holder < 0 || holder >= len(tick0) {
		t.Fatalf("log %q: want \"0 <runner> <pid>\" (%v)", readFile(t, log), err)
	}
	tick0[holder].signal(syscall.SIGKILL)
	if runtime.GOOS == "linux" {
		await(t, 10*time.Second, fmt.Sprintf("the dead runner's job (pid %d) to die with it", jobPID), func() bool { return !alive(jobPID) })
	}

	// Tick 1 comes 2s before the dead runner's hold ends, tick 2 2s after.
	// The runners of both ticks start on time; then all are waited for.
	tick1 := cronRunners(t, first, 1, log, args...)
	tick2 := cronRunners(t, first.Add(3*cronTick), 2, log, args...)
	for i, p := range tick0 {
		if code := p.wait(30 * time.Second); i != holder && code != exitTimeout {
			t.Errorf("tick 0: runner %d, which did not get the lock, exited with %d, want %d; stderr:\n%s", i, code, exitTimeout, p.stderr())
		}
	}
	for _, tc := range []struct {
		tick, runs int
		procs      []*proc
	}{{1, 0, tick1}, {2, 1, tick2}} {
		codes, ran := make([]int, len(tc.procs)), 0
		for i, p := range tc.procs {
			switch codes[i] = p.wait(30 * time.Second); codes[i] {
			case 0:
				ran++
			case exitTimeout:
			default:
				t.Errorf("tick %d, runner %d: exit status %d; stderr:\n%s", tc.tick, i, codes[i], p.stderr())
			}
		}
		if ran != tc.runs {
			t.Errorf("tick %d: exit statuses %v, want %d of them 0 and the others %d", tc.tick, codes, tc.runs, exitTimeout)
		}
	}
	if got := runsPerTick(t, log, 3); got[0] != 1 || got[1] != 0 || got[2] != 1 {
		t.Errorf("runs per tick %v, want [1 0 1]: tick 1 within --max-hold of the dead runner, tick 2 after it; log:\n%s", got, readFile(t, log))
	}
}

// TestRunMaxHoldStopsCommand runs a command that outlasts --max-hold: when
// the fixed lease runs out it gets SIGTERM (then SIGKILL after --grace, as
// after any lost lease), and run exits with 79 and says why. The 3s of
// --max-hold outlast the shell's start, however slow, so its trap is set
// before the signal comes.
func TestRunMaxHoldStopsCommand(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	for _, tt := range stopTraps {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			log := filepath.Join(t.TempDir(), "log")
			script := tt.trap + `; echo ready >> "$LOG"; while :; do sleep 0.05; done`
			code, _, stderr := run(t, cronEnv("LOG="+log), "", "--addr", srv.addr(), "run", "--max-hold", "3s", "--grace", "200ms",
				cronLock(t, "job"), "--", "sh", "-c", script)
			if code != exitLost {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, exitLost, stderr)
			}
			if got := readFile(t, log) + stderr; !strings.Contains(got, tt.want) {
				t.Errorf("log and stderr do not show %q:\n%s", tt.want, got)
			}
			for _, want := range []string{"--max-hold 3s", "the fixed lease ran out"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr does not mention %q:\n%s", want, stderr)
				}
			}
		})
	}
}

// TestStatusKept checks a lock kept by its minimum hold: status shows it as
// kept with the time left, --json marks the hold "kept", a run --wait 0
// skips and says why, and unlock --force frees it. A command that outlasts
// its minimum hold leaves the lock free.
func TestStatusKept(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name, long := cronLock(t, "kept"), cronLock(t, "long")
	runner := start(t, cronEnv(), "", "--addr", srv.addr(), "run", "--min-hold", "1m", name, "--", "true")
	if code := runner.wait(30 * time.Second); code != 0 {
		t.Fatalf("run --min-hold: exit status %d, want 0; stderr:\n%s", code, runner.stderr())
	}
	pid := strconv.Itoa(runner.cmd.Process.Pid)

	code, stdout, stderr := run(t, cronEnv(), "", "--addr", srv.addr(), "status", name)
	row := strings.Fields(strings.SplitN(stdout+"\n", "\n", 3)[1])
	if code != 0 || len(row) != 13 || row[1] != "kept" || row[2] != "mutex" || row[6] != pid || row[7] != "0" || !strings.HasSuffix(row[8], "s") {
		t.Errorf("status: exit %d, want 0 and a row NAME kept mutex HOLDER - HOST %s 0 <time left> ...; stdout:\n%s\nstderr:\n%s", code, pid, stdout, stderr)
	}
	code, stdout, _ = run(t, cronEnv(), "", "--addr", srv.addr(), "status", "--json", name)
	var got []lockStatus
	if err := json.Unmarshal([]byte(stdout), &got); err != nil || len(got) != 1 || code != 0 {
		t.Fatalf("status --json: exit %d, %v:\n%s", code, err, stdout)
	}
	if st := got[0]; !st.Held || len(st.Holders) != 1 || !st.Holders[0].Kept || st.Holders[0].Count != 0 ||
		st.Holders[0].TTLMillis <= 0 || st.Holders[0].TTLMillis > 60000 || strconv.Itoa(st.Holders[0].PID) != pid {
		t.Errorf("status --json: got %+v, want held, one holder (pid %s) kept, count 0, ttl_ms in (0, 60000]", st, pid)
	}

	ran := filepath.Join(t.TempDir(), "ran")
	code, _, stderr = run(t, cronEnv("RAN="+ran), "", "--addr", srv.addr(), "run", "--wait", "0", name, "--", "sh", "-c", `echo ran > "$RAN"`)
	if code != exitTimeout || !strings.Contains(stderr, "is kept taken by its minimum hold for") || !strings.Contains(stderr, "(pid "+pid+" on ") || readFile(t, ran) != "" {
		t.Errorf("run --wait 0 on a kept lock: exit %d (want %d), command ran: %v; stderr:\n%s", code, exitTimeout, readFile(t, ran) != "", stderr)
	}
	code, stdout, stderr = run(t, cronEnv(), "", "--addr", srv.addr(), "unlock", "--force", "--yes", name)
	if code != 0 || !strings.Contains(stdout, "released lock") || !strings.Contains(stdout, "kept taken by its minimum hold") {
		t.Errorf("unlock --force of a kept lock: exit %d, stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if st := lockState(t, srv.addr(), name); st.Held {
		t.Errorf("after unlock --force: %+v, want free", st)
	}

	if code, _, stderr := run(t, cronEnv(), "", "--addr", srv.addr(), "run", "--min-hold", "100ms", long, "--", "sleep", "0.3"); code != 0 {
		t.Fatalf("run --min-hold 100ms -- sleep 0.3: exit status %d; stderr:\n%s", code, stderr)
	}
	if st := lockState(t, srv.addr(), long); st.Held {
		t.Errorf("after a command that outlasted its minimum hold: %+v, want free", st)
	}
}

// TestRunHoldUsageErrors checks the checks of --min-hold and --max-hold,
// in process (cli.main, which the binary runs; TestUsageErrors runs the
// binary for one of them): exit status 64 and one line that names the
// problem, before any connection to Redis. Valid combinations pass the
// checks, and the library accepts the options run builds from them.
func TestRunHoldUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args   []string
		stderr string
	}{
		{[]string{"--min-hold", "2s", "--max-hold", "1s"}, "run: --min-hold 2s exceeds --max-hold 1s"},
		{[]string{"--min-hold", "1s", "--read"}, "run: --min-hold is for a mutex, not with --read or --write"},
		{[]string{"--min-hold", "1s", "--write"}, "run: --min-hold is for a mutex"},
		{[]string{"--min-hold", "10ms"}, "run: --min-hold 10ms: must be between 50ms and 24h"},
		{[]string{"--min-hold", "-1s"}, "run: --min-hold -1s: must be between 50ms and 24h"},
		{[]string{"--min-hold", "30"}, "a duration needs a unit, as in 30s"},
		{[]string{"--max-hold", "25h"}, "run: --max-hold 25h0m0s: must be between 50ms and 24h"},
		{[]string{"--max-hold", "soon"}, "not a duration"},
		{[]string{"--lease", "30s", "--max-hold", "10m"}, "run: --lease and --max-hold exclude each other"},
	}
	for _, tt := range tests {
		wantRunUsage(t, tt.args, tt.stderr)
	}

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never used: NewMutex sends nothing
	defer rdb.Close()
	locks := remutex.NewClient(rdb)
	defer locks.Close()
	for _, cfg := range []runConfig{
		{minHold: time.Second, maxHold: time.Second}, // at least as long as at most
		{minHold: time.Hour},                         // longer than the renewed lease
		{maxHold: time.Second, read: true},
		{maxHold: time.Second, write: true, fenceEnv: "REMUTEX_FENCE"},
	} {
		cfg.name, cfg.lease = "job", remutex.DefaultLease
		if err := cfg.check(false); err != nil {
			t.Errorf("%+v: %v, want it valid", cfg, err)
			continue
		}
		cfg.newLock(locks, cfg.options()) // panics if the library refuses them
	}
}
