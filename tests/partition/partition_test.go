package partition

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/lockcheck"
	"github.com/remutex/remutex/internal/redistest"
)

// The partition suite: holder processes, each in a network namespace of its
// own, and redis-server in another (redistest.Net), take a lock with
// random deadlines and write to a fenced register that no cut reaches (a
// second redis-server on a unix socket), while a seeded nemesis cuts one
// holder off, Redis off from everyone, or one direction between a holder
// and Redis, for 0.2–2.5 leases, and heals. Afterwards the history the
// holders reported (wall-clock times of one machine, so comparable) and
// the register's log are checked; see checkPartition. In the election's
// run, candidates and observers take the holders' place (elect_test.go).
//
//	REMUTEX_PARTITION_SEED=n        replays the nemesis of seed n (each run prints its seed)
//	REMUTEX_PARTITION_DURATION=10m  runs each primitive that long (default partShort)
//
// It runs where network namespaces can be made (root, iproute2) and skips
// elsewhere, unless REMUTEX_REQUIRE_NETNS=1.

const (
	partSeedEnv     = "REMUTEX_PARTITION_SEED"
	partDurationEnv = "REMUTEX_PARTITION_DURATION"
	partKindEnv     = "REMUTEX_PARTITION_KIND"   // child: mutex, rw or sem (a holder's)
	partBrokenEnv   = "REMUTEX_PARTITION_BROKEN" // child: "stalefence" writes with the fence before its own
	partSeedChild   = "REMUTEX_PARTITION_CHILD_SEED"

	partLease   = 2 * time.Second
	partPermits = 2                // of the semaphore
	partShort   = 35 * time.Second // per primitive, by default
	partHolders = 3                // processes
	partRoutine = 2                // holding goroutines per process (writers, for the RW mutex)
	partLate    = 300 * time.Millisecond
	// partSlack is how late a goroutine of a busy machine may run: the
	// watcher that timestamps a Lost, or the register's reply.
	partSlack = 25 * time.Millisecond
	// partBack is how soon after a heal the lock must be in use again.
	partBack = partLease + 5*time.Second
)

// partKinds are the kinds of lock the suite cuts apart, all at once (see
// TestMain): the mutex, the RW mutex, the semaphore and the election
// (elect_test.go).
var partKinds = []string{"mutex", "rw", "sem", "elect"}

// TestPartition runs the suite for each primitive, all at once, and at
// once with TestPartitionChecks.
func TestPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short: the partition suite cuts holders apart in network namespaces for its whole duration")
	}
	t.Parallel()
	redistest.RequireNetns(t)
	redistest.Require(t, "redis-server")
	d := partShort
	if s := os.Getenv(partDurationEnv); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("%s=%q: %v", partDurationEnv, s, err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(partSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", partSeedEnv, s, err)
		}
	}
	// The kinds run at once, each with its own namespaces, servers and
	// register: nothing of one run reaches another's.
	for i, kind := range partKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			t.Logf("seed %d (replay: %s=%d go test ./tests/partition -run '^TestPartition$/%s')", seed, partSeedEnv, seed, kind)
			run := startPartition(t, partConfig{kind: kind, seed: seed + uint64(i), net: true})
			run.replay = seed
			run.nemesis(t, d)
			run.finish(t)
			t.Log(run.hist.Summary())
			if kind == "elect" {
				t.Log(run.electSummary(t))
			}
			run.reportAll(t, checkPartition(run.hist, run.register(t)))
		})
	}
}

// partChecks are the runs of TestPartitionChecks: the kind, what its
// first holder does wrong, how many holds to wait for, and the kinds of
// violations one of which must be found (nil: none at all). (A correct
// election is TestPartition's.)
var partChecks = []struct {
	kind   string
	broken string
	holds  int
	want   []string
}{
	{"mutex", "", 20, nil},
	{"mutex", "stalefence", 20, []string{lockcheck.KindRegister, lockcheck.KindRefused}},
	{"elect", "stalefence", 6, []string{lockcheck.KindRegister, lockcheck.KindRefused}},
}

// TestPartitionChecks: on loopback and without a nemesis, the checks pass
// a run of correct holders and fail one whose holder (an election's
// candidate) writes with a stale fence (the one before its own). Its runs
// go at once, and at once with TestPartition's (an election's terms take
// seconds).
func TestPartitionChecks(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short: it runs holders in network namespaces")
	}
	t.Parallel()
	for _, tc := range partChecks {
		t.Run(tc.kind+"/broken="+tc.broken, func(t *testing.T) {
			t.Parallel()
			run := startPartition(t, partConfig{kind: tc.kind, seed: 1, broken: tc.broken})
			run.await(t, tc.holds)
			if tc.want != nil {
				run.awaitFound(t, tc.want)
			}
			run.finish(t)
			viol := checkPartition(run.hist, run.register(t))
			if tc.kind == "elect" {
				t.Log(run.electSummary(t))
			}
			found, wanted := map[string]int{}, 0
			for _, v := range viol {
				found[v.Kind]++
			}
			for _, k := range tc.want {
				wanted += found[k]
			}
			switch {
			case tc.want == nil:
				run.reportAll(t, viol)
			case wanted == 0:
				t.Errorf("violations: got %v, want some of kind %q", found, tc.want)
			default:
				t.Logf("found %v; the first: %s: %s", found, viol[0].Kind, viol[0].Msg)
			}
		})
	}
}

// ---------------------------------------------------------------- the run

type partConfig struct {
	kind   string // mutex, rw, sem, elect
	seed   uint64
	net    bool   // in network namespaces, with a nemesis; else on loopback
	broken string // what the first holder does wrong (partBrokenEnv)
}

// partRun is one run: the processes, the register and the history.
type partRun struct {
	kind      string
	seed      uint64         // of this run's nemesis and holders
	replay    uint64         // the seed that replays it (partSeedEnv)
	net       *redistest.Net // nil on loopback
	reg       *redistest.Register
	members   []partMember
	children  []*redistest.Child // one per member
	stopped   []bool             // sent "stop" (by the test's goroutine)
	hist      *partHistory
	stop      chan struct{}   // closed to stop the collectors
	collected []chan struct{} // closed when the collector of each child returned
	wg        sync.WaitGroup
}

func startPartition(t *testing.T, cfg partConfig) *partRun {
	t.Helper()
	run := &partRun{kind: cfg.kind, seed: cfg.seed, members: partMembers(cfg.kind), stop: make(chan struct{})}
	nodes := []string{"redis"}
	for _, m := range run.members {
		nodes = append(nodes, m.node)
	}
	var srv *redistest.Server
	if cfg.net {
		run.net = redistest.NewNet(t, nodes...)
		srv = run.net.StartServer(t, "redis")
	} else {
		srv = redistest.Start(t)
	}
	regSrv := redistest.StartUnix(t)
	run.reg = redistest.NewRegisterOn(t, regSrv)
	for i, m := range run.members {
		h := m.node
		c := redistest.HolderConfig{Role: m.role, Addr: srv.Addr(), Name: "partition", Lease: partLease,
			Register: regSrv.UnixSocket(), RegisterKey: run.reg.Key(), ID: h, Goroutines: partRoutine}
		env := append(c.Env(), partKindEnv+"="+cfg.kind, partSeedChild+"="+strconv.FormatUint(cfg.seed+uint64(i+1)*7919, 10))
		if i == 0 && cfg.broken != "" {
			env = append(env, partBrokenEnv+"="+cfg.broken)
		}
		var ch *redistest.Child
		if cfg.net {
			ch = run.net.StartChild(t, h, c.Role, h, env...)
		} else {
			ch = redistest.StartChild(t, c.Role, h, env...)
		}
		run.children = append(run.children, ch)
		run.stopped = append(run.stopped, false)
	}
	for _, ch := range run.children {
		ch.Expect(t, "ready", 30*time.Second)
	}
	run.hist = newPartHistory(cfg.kind) // its times count from here
	run.collected = make([]chan struct{}, len(run.children))
	for i := range run.collected {
		run.collected[i] = make(chan struct{})
	}
	for i := range run.children {
		run.wg.Add(1)
		go run.collect(i)
	}
	t.Cleanup(func() { // a run that failed before finish
		select {
		case <-run.stop:
		default:
			close(run.stop)
		}
		run.wg.Wait()
	})
	return run
}

// collect moves the events of child i into the history as they come,
// until it exits or the run stops.
func (run *partRun) collect(i int) {
	defer run.wg.Done()
	defer close(run.collected[i])
	ch := run.children[i]
	for {
		for _, f := range ch.TakeAll("p") {
			run.hist.add(ch.ID(), f)
		}
		select {
		case <-ch.Arrived():
		case <-ch.Exited():
			for _, f := range ch.TakeAll("p") {
				run.hist.add(ch.ID(), f)
			}
			return
		case <-run.stop:
			return
		}
	}
}

// await waits until n holds were taken (on loopback, without a nemesis).
func (run *partRun) await(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		changed := run.hist.changed()
		if run.hist.acquired() >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%d holds within a minute, want %d:\n%s", run.hist.acquired(), n, run.hist.Summary())
		}
	}
}

// awaitFound waits until the checks find a violation of one of kinds in
// the run so far. A broken holder's fault shows only once it held after
// another holder wrote (its stale fence is then another's), and on a busy
// machine an election's broken candidate may win none of the first terms.
func (run *partRun) awaitFound(t *testing.T, kinds []string) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		changed := run.hist.changed()
		for _, v := range checkPartition(run.hist, run.register(t)) {
			if slices.Contains(kinds, v.Kind) {
				return
			}
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no violation of kind %q within a minute:\n%s", kinds, run.hist.Summary())
		}
	}
}

// partOp is one fault the nemesis can do.
type partOp struct {
	name string
	do   func(n *redistest.Net) error
}

// partOps are the faults of a run of members: Redis cut off, and each
// member cut off, or one way between it and Redis.
func partOps(members []partMember) []partOp {
	ops := []partOp{{"cut redis off from everyone", func(n *redistest.Net) error { return n.Isolate("redis") }}}
	for _, m := range members {
		h := m.node
		ops = append(ops,
			partOp{"cut " + h + " off", func(n *redistest.Net) error { return n.Isolate(h) }},
			partOp{"cut " + h + "→redis", func(n *redistest.Net) error { return n.CutOut(h) }},
			partOp{"cut redis→" + h, func(n *redistest.Net) error { return n.CutIn(h) }},
		)
	}
	return ops
}

// nemesis cuts and heals for d: each cut lasts 0.2–2.5 leases; after each
// heal it waits until the lock is in use again (a violation if not within
// partBack; an election's is checked afterwards: see checkPartition), then
// 0.1–1 lease more.
func (run *partRun) nemesis(t *testing.T, d time.Duration) {
	t.Helper()
	rng := rand.New(rand.NewPCG(run.seed, 0x9e3779b97f4a7c15))
	ops := partOps(run.members)
	between := func(lo, hi float64) time.Duration {
		return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(partLease))
	}
	end := time.Now().Add(d)
	// Let the holders get going first.
	run.hist.waitAcquired(time.Now(), partBack)
	for time.Now().Before(end) {
		op := ops[rng.IntN(len(ops))]
		hold := between(0.2, 2.5)
		run.hist.Fault("nemesis", "%s for %v", op.name, hold.Round(time.Millisecond))
		if err := op.do(run.net); err != nil {
			t.Fatal(err)
		}
		time.Sleep(hold) // the fault itself: nothing to wait for
		if err := run.net.Heal(); err != nil {
			t.Fatal(err)
		}
		healed := time.Now()
		at := run.hist.Log("nemesis", "heal")
		run.hist.healed(at)
		if run.kind == "elect" {
			run.hist.waitLeading(healed, partBack)
		} else if !run.hist.waitAcquired(healed, partBack) {
			run.hist.Violate(partIdle, "nemesis", "no acquisition within %v of the heal at %s", partBack, lockcheck.At(at))
		}
		time.Sleep(between(0.1, 1))
	}
}

// finish stops the holders and waits for them to report the end; an
// election's candidates first, so that its observers can catch up.
func (run *partRun) finish(t *testing.T) {
	t.Helper()
	if run.kind == "elect" {
		run.stopCandidates(t)
	}
	for i, ch := range run.children {
		if !run.stopped[i] {
			ch.Send(t, "stop")
			run.stopped[i] = true
		}
	}
	// The collectors stop first: Expect waits on the channel they read.
	close(run.stop)
	run.wg.Wait()
	for _, ch := range run.children {
		ch.Expect(t, "done", time.Minute)
		for _, f := range ch.TakeAll("p") {
			run.hist.add(ch.ID(), f)
		}
		if err := ch.Stderr(); strings.Contains(err, "panic") {
			run.hist.Violate(partChild, ch.ID(), "panicked:\n%s", err)
		}
	}
}

// register returns the register's log, with its refusals.
func (run *partRun) register(t *testing.T) partRegisterLog {
	t.Helper()
	accepted, found := run.reg.Anomalies(t)
	return partRegisterLog{accepted: accepted, found: found}
}

// reportAll fails the test with the violations: how many of each kind,
// the events around the first few, in order, and a line for each other.
func (run *partRun) reportAll(t *testing.T, viol []lockcheck.Violation) {
	t.Helper()
	if len(viol) == 0 {
		return
	}
	slices.SortStableFunc(viol, func(a, b lockcheck.Violation) int { return cmp.Compare(a.At, b.At) })
	count := map[string]int{}
	for _, v := range viol {
		count[v.Kind]++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d violations (%s=%d): %v\n", len(viol), partSeedEnv, run.replay, count)
	for i, v := range viol {
		switch {
		case i < 3:
			fmt.Fprintf(&b, "\n%v\nevents (the holders' from %s):\n%s", v,
				lockcheck.At(v.At-partLease), run.hist.Around(v.At, partLease, partLease/4, 40))
		case i < 30:
			if i == 3 {
				b.WriteString("\nand:\n")
			}
			fmt.Fprintf(&b, "  %s at %s: %s\n", v.Kind, lockcheck.At(v.At), v.Msg)
		case i == 30:
			fmt.Fprintf(&b, "  ... %d more\n", len(viol)-30)
		}
	}
	t.Error(b.String())
}

// ---------------------------------------------------------------- holders

// partLocker is one goroutine's view of the primitive under test.
type partLocker struct {
	write  bool
	lock   func(ctx context.Context) error
	unlock func(ctx context.Context) error
	lost   func() <-chan struct{}
	fence  func() int64
}

// partLockers returns a locker per goroutine of a holder process.
func partLockers(c *remutex.Client, kind string, n int) []partLocker {
	var ls []partLocker
	switch kind {
	case "mutex":
		m := c.NewMutex("partition", remutex.WithLease(partLease), remutex.WithFencing())
		for range n {
			ls = append(ls, partLocker{true, m.LockContext, m.UnlockContext, m.Lost, m.Fence})
		}
	case "rw":
		rw := c.NewRWMutex("partition", remutex.WithLease(partLease), remutex.WithFencing())
		for range n {
			ls = append(ls, partLocker{true, rw.LockContext, rw.UnlockContext, rw.Lost, rw.Fence})
		}
		ls = append(ls, partLocker{false, rw.RLockContext, rw.RUnlockContext, rw.Lost, rw.Fence})
	case "sem":
		for range n {
			s := c.NewSemaphore("partition", partPermits, remutex.WithLease(partLease), remutex.WithFencing())
			ls = append(ls, partLocker{true,
				func(ctx context.Context) error { return s.Acquire(ctx, 1) },
				func(ctx context.Context) error { return s.ReleaseContext(ctx, 1) },
				s.Lost, s.Fence})
		}
	}
	return ls
}

// partitionRole is a holder process of the suite: its goroutines lock with
// random deadlines of 0.5–6 s, write to the register with their fence
// (begin, a short random wait, end), and unlock with a deadline of 0.5–3 s,
// until "stop" arrives on stdin. It emits, with wall-clock times in ns:
//
//	p lock <g> <seq> <w|r> <call> <deadline> <return> <error kind> <fence>
//	p lost <g> <seq> <when>                 (Lost closed while held)
//	p write <g> <seq> <begin|end> <call> <return> <1|0|error>
//	p unlock <g> <seq> <w|r> <call> <deadline> <return> <error kind>
//
// and "done" at the end. A semaphore's holders write with fence 0 (the
// register then counts them; see redistest.Crowds).
func partitionRole(cfg redistest.HolderConfig) int {
	kind := os.Getenv(partKindEnv)
	seed, _ := strconv.ParseUint(os.Getenv(partSeedChild), 10, 64)
	broken := os.Getenv(partBrokenEnv)
	c, reg, closeAll := childSetup(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for g, l := range partLockers(c, kind, cfg.Goroutines) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			for seq := 0; ctx.Err() == nil; seq++ {
				partHoldOnce(ctx, rng, l, reg, kind, broken, cfg.ID, g, seq)
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		wg.Wait()
	}()
	return serveUntilStop(cancel, done, closeAll)
}

// partHoldOnce is one lock call and, if it holds, one write and unlock.
func partHoldOnce(ctx context.Context, rng *rand.Rand, l partLocker, reg *redistest.Register, kind, broken, proc string, g, seq int) {
	mode := "r"
	if l.write {
		mode = "w"
	}
	between := func(lo, hi time.Duration) time.Duration { return partBetween(rng, lo, hi) }
	call := time.Now()
	deadline := call.Add(between(500*time.Millisecond, 6*time.Second))
	lctx, lcancel := context.WithDeadline(ctx, deadline)
	err := l.lock(lctx)
	ret := time.Now()
	lcancel()
	var fence int64
	if err == nil {
		fence = l.fence()
	}
	redistest.Emit("p", "lock", g, seq, mode, call.UnixNano(), deadline.UnixNano(), ret.UnixNano(), errKind(err), fence)
	if err != nil {
		return
	}
	unwatch := watchLost(l.lost(), g, seq)
	if l.write {
		if kind == "sem" {
			fence = 0 // the register counts the semaphore's writers
		} else if broken == "stalefence" {
			fence--
		}
		partSection(ctx, rng, reg, fence, fmt.Sprintf("%s.g%d.%d", proc, g, seq), g, seq)
	} else {
		time.Sleep(partBetween(rng, time.Millisecond, 100*time.Millisecond))
	}
	unwatch()
	partRelease(ctx, rng, l.unlock, mode, g, seq)
}

// watchLost emits "p lost <g> <seq> <when>" when lost closes, until the
// function it returns is called; that waits for the watcher to exit.
func watchLost(lost <-chan struct{}, g, seq int) (unwatch func()) {
	quit, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-lost:
			redistest.Emit("p", "lost", g, seq, time.Now().UnixNano())
		case <-quit:
		}
	}()
	return func() {
		close(quit)
		<-watched
	}
}

// partRelease is a hold's unlock (a term's Resign) with a deadline of
// 0.5–3 s, reported.
func partRelease(ctx context.Context, rng *rand.Rand, unlock func(context.Context) error, mode string, g, seq int) {
	call := time.Now()
	deadline := call.Add(partBetween(rng, 500*time.Millisecond, 3*time.Second))
	uctx, ucancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	err := unlock(uctx)
	ret := time.Now()
	ucancel()
	redistest.Emit("p", "unlock", g, seq, mode, call.UnixNano(), deadline.UnixNano(), ret.UnixNano(), errKind(err))
}

// partSection is a hold's critical section: a write to the register with
// fence (begin, a short random wait, end), each reported.
func partSection(ctx context.Context, rng *rand.Rand, reg *redistest.Register, fence int64, writer string, g, seq int) {
	wctx := context.WithoutCancel(ctx)
	for _, op := range []string{"begin", "end"} {
		call := time.Now()
		var ok bool
		var err error
		if op == "begin" {
			ok, err = reg.Begin(wctx, fence, writer)
		} else {
			ok, err = reg.End(wctx, fence, writer)
		}
		redistest.Emit("p", "write", g, seq, op, call.UnixNano(), time.Now().UnixNano(), boolText(ok, err))
		if op == "begin" {
			time.Sleep(partBetween(rng, time.Millisecond, 100*time.Millisecond))
		}
	}
}

// partBetween returns a random duration in [lo, hi).
func partBetween(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}
