//go:build unix

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/redistest"
)

// Tests of semaphores from the command line: run --permits, and status and
// unlock --force of a semaphore's holders.

// semState reads the state of the semaphore name in-process.
func semState(t testing.TB, addr, name string) lockStatus {
	t.Helper()
	return lockState(t, addr, name).ofKind(kindSemaphore)
}

// permitsScript is the command of TestRunPermits's runs. It counts the runs
// inside their commands in the Redis key $K:inside and logs the count and
// its fencing token on entry; then it stays inside until the test lets its
// batch go (the runs that entered N at a time: entries 1..N are batch 1,
// N+1..2N batch 2, ...) by setting $K:go to its batch number. It gives up
// with status 3 if that does not come.
const permitsScript = `
rc() { redis-cli -p "$PORT" "$@"; }
e=$(rc INCR "$K:entered")
i=$(rc INCR "$K:inside")
echo "$i $REMUTEX_FENCE" >> "$LOG"
batch=$(( (e + N - 1) / N ))
tries=0
while [ "$(rc GET "$K:go")" -lt "$batch" ]; do
	tries=$((tries + 1))
	[ "$tries" -lt 600 ] || exit 3
	sleep 0.05
done
rc DECR "$K:inside" > /dev/null
`

// TestRunPermits starts 2N runs of run --permits N at once. The first N
// enter their commands and stay there until the other N have queued; then
// they leave and the other N come in. The count of runs inside their
// commands, kept in Redis, is N at most and reaches N; each run gets a
// fencing token of its own.
func TestRunPermits(t *testing.T) {
	t.Parallel()
	redistest.Require(t, "redis-cli") // the commands count with it
	srv := sharedRedis(t)
	rdb := rdbFor(t, srv.addr())
	ctx := context.Background()
	name := lockName(t, "sem")
	const n, runs = 3, 6
	log, k := filepath.Join(t.TempDir(), "log"), "test:"+name
	if err := rdb.Set(ctx, k+":go", 0, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	port := srv.addr()[strings.LastIndexByte(srv.addr(), ':')+1:]
	env := cliEnv("PORT="+port, "K="+k, "LOG="+log, "N="+strconv.Itoa(n))
	var procs []*proc
	for range runs {
		procs = append(procs, start(t, env, "", "--addr", srv.addr(), "run", "--permits", strconv.Itoa(n), "--lease", "2s", name, "--", "sh", "-c", permitsScript))
	}
	// A run counts itself entered, then inside, then logs: the test lets a
	// batch go only once every run that entered has logged, so that no run
	// of the batch counts itself inside after another has left.
	entered := func() int64 { v, _ := rdb.Get(ctx, k+":entered").Int64(); return v }
	logged := func() int64 { return int64(strings.Count(readFile(t, log), "\n")) }
	await(t, 30*time.Second, "every run to be inside or queued", func() bool {
		e := entered()
		return e+semState(t, srv.addr(), name).Queued == runs && logged() == e
	})
	if got := entered(); got != n {
		t.Errorf("%d runs entered while the others queued, want %d (--permits %d)", got, n, n)
	}
	if err := rdb.Set(ctx, k+":go", 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	await(t, 30*time.Second, "the queued runs to enter", func() bool { return entered() == runs && logged() == runs })
	if err := rdb.Set(ctx, k+":go", 2, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	for i, p := range procs {
		if code := p.wait(60 * time.Second); code != 0 {
			t.Fatalf("run %d: exit status %d, want 0; stderr:\n%s", i, code, p.stderr())
		}
	}
	checkPermitsLog(t, readFile(t, log), n, runs)
	if st := semState(t, srv.addr(), name); st.Held || st.Size != n || st.Queued != 0 {
		t.Errorf("afterwards: %+v, want the semaphore free, of size %d, nobody queued", st, n)
	}
}

// checkPermitsLog checks the log of permitsScript: runs entries, at most n
// runs inside at once and n at some point, a distinct fencing token each.
func checkPermitsLog(t *testing.T, log string, n, runs int) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(log), "\n")
	if len(lines) != runs {
		t.Fatalf("got %d log lines, want %d:\n%s", len(lines), runs, log)
	}
	most := 0
	var fences []int64
	for _, line := range lines {
		var inside int
		var fence int64
		if _, err := fmt.Sscan(line, &inside, &fence); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		most = max(most, inside)
		fences = append(fences, fence)
	}
	if most != n {
		t.Errorf("at most %d runs were inside at once, want %d (--permits %d):\n%s", most, n, n, log)
	}
	slices.Sort(fences)
	if fences[0] <= 0 || len(slices.Compact(fences)) != runs {
		t.Errorf("fencing tokens %v, want %d distinct ones above 0", fences, runs)
	}
}

// TestRunPermitsStatusUnlock: two run --permits 2 hold the semaphore, one
// of them frozen, and a third waits. status shows the size, both holders
// and the waiter with the permit it asks for; run --wait 0 gives up naming
// the holders; a run with another --permits is refused. unlock --force
// --owner frees the frozen holder's permit alone: the waiter is handed it
// by a message to its Client and runs, the other holder keeps its permit,
// and the frozen one, resumed, finds its lease lost. unlock --force then
// frees the rest.
func TestRunPermitsStatusUnlock(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	addr := srv.addr()
	name := lockName(t, "sem")
	// The frozen holder keeps its permit for its lease, which outlasts the
	// checks however slowly a loaded machine runs them.
	a, _, fenceA := holdLock(t, addr, name, "--permits", "2", "--lease", "30s")
	b, _, fenceB := holdLock(t, addr, name, "--permits", "2", "--lease", "30s")
	a.signal(syscall.SIGSTOP)
	out := filepath.Join(t.TempDir(), "out")
	w := start(t, cliEnv("OUT="+out), "", "--addr", addr, "run", "--permits", "2", name, "--", "sh", "-c", `echo "$REMUTEX_FENCE" > "$OUT"`)
	await(t, 10*time.Second, "the waiter to queue and listen", func() bool {
		st := semState(t, addr, name)
		return st.Queued == 1 && st.Subscribers == 1
	})

	st := checkSemStatus(t, addr, name, []*proc{a, b}, w)
	ownerA := ""
	for _, h := range st.Holders {
		if h.PID == a.cmd.Process.Pid {
			ownerA = h.Owner
		}
	}

	code, _, stderr := run(t, cliEnv(), "", "--addr", addr, "run", "--permits", "2", "--wait", "0", name, "--", "true")
	if code != exitTimeout || !strings.Contains(stderr, fmt.Sprintf(`semaphore %q has all its 2 permits held, by `, name)) ||
		!strings.Contains(stderr, fmt.Sprintf("(pid %d on ", a.cmd.Process.Pid)) || !strings.Contains(stderr, "and 1 waiter queued") {
		t.Errorf("run --wait 0 while all permits are held: exit status %d, want %d, naming the holders; stderr:\n%s", code, exitTimeout, stderr)
	}
	code, _, stderr = run(t, cliEnv(), "", "--addr", addr, "run", "--permits", "3", name, "--", "true")
	if code != exitUsage || !strings.Contains(stderr, fmt.Sprintf(`run: --permits 3, but semaphore %q has 2 permits`, name)) {
		t.Errorf("run --permits 3 on a semaphore of 2: exit status %d, want %d; stderr:\n%s", code, exitUsage, stderr)
	}

	ps := rdbFor(t, addr).PSubscribe(context.Background(), "remutex:{"+name+"}:sem:released:*")
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run(t, cliEnv(), "", "--addr", addr, "unlock", "--force", "--yes", "--owner", ownerA, name)
	if code != 0 || !strings.Contains(stdout, "released lock") || !strings.Contains(stdout, ownerA) || !strings.Contains(stdout, "1 permit") {
		t.Fatalf("unlock --force --owner: exit status %d, want 0, naming the holder; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	assertReleaseMessage(t, ps.Channel())
	if code := w.wait(30 * time.Second); code != 0 {
		t.Fatalf("the waiter: exit status %d, want 0; stderr:\n%s", code, w.stderr())
	}
	if f, err := strconv.ParseInt(strings.TrimSpace(readFile(t, out)), 10, 64); err != nil || f <= max(fenceA, fenceB) {
		t.Errorf("the waiter's fencing token %q, want a number above the holders' %d and %d", readFile(t, out), fenceA, fenceB)
	}
	if st := semState(t, addr, name); len(st.Holders) != 1 || st.Holders[0].PID != b.cmd.Process.Pid || st.state() != "held 1/2" {
		t.Errorf("after unlock --owner: %+v, want the other holder (pid %d) alone, held 1/2", st, b.cmd.Process.Pid)
	}
	a.signal(syscall.SIGCONT)
	if code := a.wait(30 * time.Second); code != exitLost {
		t.Errorf("the resumed holder: exit status %d, want %d; stderr:\n%s", code, exitLost, a.stderr())
	}

	code, stdout, stderr = run(t, cliEnv(), "", "--addr", addr, "unlock", "--force", "--yes", name)
	if code != 0 || !strings.Contains(stdout, "released lock") || !strings.Contains(stdout, fmt.Sprintf("(pid %d on ", b.cmd.Process.Pid)) {
		t.Fatalf("unlock --force: exit status %d, want 0, naming the other holder; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if code := b.wait(30 * time.Second); code != exitLost {
		t.Errorf("the other holder: exit status %d, want %d; stderr:\n%s", code, exitLost, b.stderr())
	}
	if rows := statusTable(t, addr, name); len(rows) != 2 || len(rows) > 1 && (len(rows[1]) != 14 || rows[1][1] != "free" || rows[1][2] != "0/2") {
		t.Errorf("status after unlock: want one line %s free 0/2 semaphore - ...; got %q", name, rows)
	}
}

// checkSemStatus checks status and status --json of semaphore name of size
// 2, held by holders (one permit each), with waiter queued for one; it
// returns what status --json said.
func checkSemStatus(t *testing.T, addr, name string, holders []*proc, waiter *proc) lockStatus {
	t.Helper()
	st := statusJSON(t, addr, name)[0]
	if st.Kind != kindSemaphore || st.Key != "remutex:{"+name+"}:sem" || !st.Held || st.Size != 2 || st.Queued != 1 || st.Subscribers != 1 || len(st.Others) != 0 {
		t.Errorf("status --json: got %+v, want kind semaphore, key remutex:{%s}:sem, held, size 2, 1 queued, 1 subscriber", st, name)
	}
	var pids []int
	for _, h := range st.Holders {
		pids = append(pids, h.PID)
		if h.Count != 1 || h.Read || h.TTLMillis <= 0 || h.TTLMillis > 30000 || !strings.Contains(h.Owner, fmt.Sprintf(".%s.%d:", h.Host, h.PID)) {
			t.Errorf("holder %+v: want 1 permit, ttl_ms within the 30s lease, its host and pid in its owner token", h)
		}
	}
	if len(pids) != 2 || !slices.Contains(pids, holders[0].cmd.Process.Pid) || !slices.Contains(pids, holders[1].cmd.Process.Pid) {
		t.Errorf("holders %+v: want the two holding runs", st.Holders)
	}
	if len(st.Waiters) != 1 || st.Waiters[0].Permits != 1 || st.Waiters[0].PID != waiter.cmd.Process.Pid || st.Waiters[0].Read {
		t.Errorf("waiters %+v: want the waiting run (pid %d), asking for 1 permit", st.Waiters, waiter.cmd.Process.Pid)
	}

	locks, waiting := statusTables(t, addr, name)
	for _, row := range locks[1:] {
		// NAME, STATE (held 2/2), KIND, HOLDER, MODE, HOST, PID, COUNT, TTL, FENCE, QUEUED, WRITERS-WAITING, SUBSCRIBERS
		if len(row) != 14 || row[0] != name || row[1] != "held" || row[2] != "2/2" || row[3] != kindSemaphore || row[5] != "-" ||
			row[8] != "1" || row[11] != "1" || row[12] != "-" {
			t.Errorf("status line %q: want %s held 2/2 semaphore <owner> - <host> <pid> 1 <ttl> <fence> 1 - <subscribers>", strings.Join(row, " "), name)
		}
	}
	// NAME, KIND, WAITER, WANTS (1 permit), HOST, PID, WAITING
	want := regexp.MustCompile(fmt.Sprintf(`^%s semaphore \S+ 1 permit \S+ %d \S+$`, regexp.QuoteMeta(name), waiter.cmd.Process.Pid))
	if len(locks) != 3 || len(waiting) != 2 || strings.Join(waiting[0], " ") != "NAME KIND WAITER WANTS HOST PID WAITING" ||
		!want.MatchString(strings.Join(waiting[1], " ")) {
		t.Errorf("status: want a line per holder, then the waiter asking for 1 permit; got %q and %q", locks, waiting)
	}
	return st
}

// TestRunPermitsHolderKilled: a run --permits 1 killed with SIGKILL takes
// its command along, and its permit comes back when its lease ends: the
// next run gets it.
func TestRunPermitsHolderKilled(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "sem")
	holder, pid, _ := holdLock(t, srv.addr(), name, "--permits", "1", "--lease", "1s")
	holder.signal(syscall.SIGKILL)
	holder.wait(30 * time.Second)
	await(t, 10*time.Second, "the killed holder's command to go", func() bool { return !alive(pid) })
	code, _, stderr := run(t, cliEnv(), "", "--addr", srv.addr(), "run", "--permits", "1", name, "--", "true")
	if code != 0 {
		t.Errorf("run after the holder was killed: exit status %d, want 0; stderr:\n%s", code, stderr)
	}
}

// TestRunPermitsUsageErrors checks the checks of --permits in process:
// exit status 64 and one line that names the problem, before any
// connection to Redis. Valid combinations pass the checks, and the library
// accepts the options run builds from them.
func TestRunPermitsUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"--permits", "0"}, "invalid value \"0\" for flag --permits: want a whole number of permits from 1 to 2147483647"},
		{[]string{"--permits", "-1"}, "want a whole number of permits from 1 to"},
		{[]string{"--permits", "2147483648"}, "want a whole number of permits from 1 to"},
		{[]string{"--permits", "two"}, "want a whole number of permits from 1 to"},
		{[]string{"--permits", "2", "--read"}, "run: --permits takes a semaphore, --read and --write a read/write lock: not both"},
		{[]string{"--write", "--permits", "2"}, "run: --permits takes a semaphore"},
		{[]string{"--permits", "2", "--min-hold", "1s"}, "run: --min-hold is for a mutex, not with --permits"},
		{[]string{"--permits", "2", "--lease", "30s", "--max-hold", "1m"}, "run: --lease and --max-hold exclude each other"},
	} {
		wantRunUsage(t, tt.args, tt.stderr)
	}

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never used: NewSemaphore sends nothing
	defer rdb.Close()
	locks := remutex.NewClient(rdb)
	defer locks.Close()
	for _, cfg := range []runConfig{
		{permits: 1},
		{permits: maxPermits, maxHold: time.Second, fenceEnv: "REMUTEX_FENCE"},
		{permits: 3, wait: waitFlag{set: true}},
	} {
		cfg.name, cfg.lease = "job", remutex.DefaultLease
		if err := cfg.check(false); err != nil {
			t.Errorf("%+v: %v, want it valid", cfg, err)
			continue
		}
		if cfg.kind() != kindSemaphore {
			t.Errorf("%+v: kind %q, want %q", cfg, cfg.kind(), kindSemaphore)
		}
		cfg.newLock(locks, cfg.options()) // panics if the library refuses them
	}
}
