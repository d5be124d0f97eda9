package partition

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/redistest"
)

// The partition suite: holder processes, each in a network namespace of its
// own, and redis-server in another (redistest.Net), take a lock with
// random deadlines and write to a fenced register that no cut reaches (a
// second redis-server on a unix socket), while a seeded nemesis cuts one
// holder off, Redis off from everyone, or one direction between a holder
// and Redis, for 0.2–2.5 leases, and heals. Afterwards the history the
// holders reported (wall-clock times of one machine, so comparable) and
// the register's log are checked; see checkPartition.
//
//	REMUTEX_PARTITION_SEED=n        replays the nemesis of seed n (each run prints its seed)
//	REMUTEX_PARTITION_DURATION=10m  runs each primitive that long (default partShort)
//
// It runs where network namespaces can be made (root, iproute2) and skips
// elsewhere, unless REMUTEX_REQUIRE_NETNS=1.

const (
	partSeedEnv     = "REMUTEX_PARTITION_SEED"
	partDurationEnv = "REMUTEX_PARTITION_DURATION"
	partKindEnv     = "REMUTEX_PARTITION_KIND"   // child: mutex, rw or sem
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

// TestPartition runs the suite for each primitive, the three at once.
func TestPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short: the partition suite cuts holders apart in network namespaces for its whole duration")
	}
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
	// The three kinds run at once, each with its own namespaces, servers
	// and register: nothing of one run reaches another's.
	for i, kind := range []string{"mutex", "rw", "sem"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			t.Logf("seed %d (replay: %s=%d go test ./tests/partition -run 'TestPartition/%s')", seed, partSeedEnv, seed, kind)
			run := startPartition(t, partConfig{kind: kind, seed: seed + uint64(i), net: true})
			run.replay = seed
			run.nemesis(t, d)
			run.finish(t)
			t.Log(run.hist.summary())
			run.reportAll(t, checkPartition(run.hist, run.kind, run.register(t)))
		})
	}
}

// TestPartitionChecks: on loopback and without a nemesis, the checks pass
// a run of correct holders and fail one whose holder writes with a stale
// fence (the one before its own).
func TestPartitionChecks(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short: it runs holders in network namespaces")
	}
	for _, tc := range []struct {
		broken string
		want   []string // kinds, one of which must be found; nil: none at all
	}{
		{"", nil},
		{"stalefence", []string{partRegister, partRefused}},
	} {
		t.Run("broken="+tc.broken, func(t *testing.T) {
			run := startPartition(t, partConfig{kind: "mutex", seed: 1, broken: tc.broken})
			run.await(t, 20)
			run.finish(t)
			viol := checkPartition(run.hist, run.kind, run.register(t))
			found, wanted := map[string]int{}, 0
			for _, v := range viol {
				found[v.kind]++
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
				t.Logf("found %v; the first: %s: %s", found, viol[0].kind, viol[0].text)
			}
		})
	}
}

// ---------------------------------------------------------------- the run

type partConfig struct {
	kind   string // mutex, rw, sem
	seed   uint64
	net    bool   // in network namespaces, with a nemesis; else on loopback
	broken string // what the first holder does wrong (partBrokenEnv)
}

// partRun is one run: the processes, the register and the history.
type partRun struct {
	kind     string
	seed     uint64         // of this run's nemesis and holders
	replay   uint64         // the seed that replays it (partSeedEnv)
	net      *redistest.Net // nil on loopback
	reg      *redistest.Register
	children []*redistest.Child
	hist     *partHistory
	stop     chan struct{} // closed to stop the collectors
	wg       sync.WaitGroup
}

func startPartition(t *testing.T, cfg partConfig) *partRun {
	t.Helper()
	run := &partRun{kind: cfg.kind, seed: cfg.seed, hist: newPartHistory(), stop: make(chan struct{})}
	holders := make([]string, partHolders)
	for i := range holders {
		holders[i] = "h" + strconv.Itoa(i+1)
	}
	var srv *redistest.Server
	if cfg.net {
		run.net = redistest.NewNet(t, append([]string{"redis"}, holders...)...)
		srv = run.net.StartServer(t, "redis")
	} else {
		srv = redistest.Start(t)
	}
	regSrv := redistest.StartUnix(t)
	run.reg = redistest.NewRegisterOn(t, regSrv)
	for i, h := range holders {
		c := redistest.HolderConfig{Role: "partition", Addr: srv.Addr(), Name: "partition", Lease: partLease,
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
	}
	for _, ch := range run.children {
		ch.Expect(t, "ready", 30*time.Second)
	}
	run.hist.start = time.Now()
	for _, ch := range run.children {
		run.wg.Add(1)
		go run.collect(ch)
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

// collect moves ch's events into the history as they come, until ch exits
// or the run stops.
func (run *partRun) collect(ch *redistest.Child) {
	defer run.wg.Done()
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
			t.Fatalf("%d holds within a minute, want %d:\n%s", run.hist.acquired(), n, run.hist.summary())
		}
	}
}

// partOp is one fault the nemesis can do.
type partOp struct {
	name string
	do   func(n *redistest.Net) error
}

func partOps() []partOp {
	ops := []partOp{{"cut redis off from everyone", func(n *redistest.Net) error { return n.Isolate("redis") }}}
	for i := 1; i <= partHolders; i++ {
		h := "h" + strconv.Itoa(i)
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
// partBack), then 0.1–1 lease more.
func (run *partRun) nemesis(t *testing.T, d time.Duration) {
	t.Helper()
	rng := rand.New(rand.NewPCG(run.seed, 0x9e3779b97f4a7c15))
	ops := partOps()
	between := func(lo, hi float64) time.Duration {
		return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(partLease))
	}
	end := time.Now().Add(d)
	// Let the holders get going first.
	run.hist.waitAcquired(time.Now(), partBack)
	for time.Now().Before(end) {
		op := ops[rng.IntN(len(ops))]
		hold := between(0.2, 2.5)
		run.hist.note("nemesis", op.name+" for "+hold.Round(time.Millisecond).String())
		if err := op.do(run.net); err != nil {
			t.Fatal(err)
		}
		time.Sleep(hold) // the fault itself: nothing to wait for
		if err := run.net.Heal(); err != nil {
			t.Fatal(err)
		}
		healed := time.Now()
		run.hist.note("nemesis", "heal")
		if !run.hist.waitAcquired(healed, partBack) {
			run.hist.violate(partViolation{at: healed, kind: partIdle,
				text: fmt.Sprintf("no acquisition within %v of the heal at %s", partBack, run.hist.rel(healed))})
		}
		time.Sleep(between(0.1, 1))
	}
}

// finish stops the holders and waits for them to report the end.
func (run *partRun) finish(t *testing.T) {
	t.Helper()
	for _, ch := range run.children {
		ch.Send(t, "stop")
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
			run.hist.violate(partViolation{at: time.Now(), kind: partChild, text: ch.ID() + " panicked:\n" + err})
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
func (run *partRun) reportAll(t *testing.T, viol []partViolation) {
	t.Helper()
	if len(viol) == 0 {
		return
	}
	sort.SliceStable(viol, func(i, j int) bool { return viol[i].at.Before(viol[j].at) })
	count := map[string]int{}
	for _, v := range viol {
		count[v.kind]++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d violations (%s=%d): %v\n", len(viol), partSeedEnv, run.replay, count)
	for i, v := range viol {
		switch {
		case i < 3:
			fmt.Fprintf(&b, "\n%s at %s: %s\nevents (the holders' from %s):\n%s", v.kind, run.hist.rel(v.at), v.text,
				run.hist.rel(v.at.Add(-partLease)), run.hist.around(v.at, partLease, partLease/4, 40))
		case i < 30:
			if i == 3 {
				b.WriteString("\nand:\n")
			}
			fmt.Fprintf(&b, "  %s at %s: %s\n", v.kind, run.hist.rel(v.at), v.text)
		case i == 30:
			fmt.Fprintf(&b, "  ... %d more\n", len(viol)-30)
		}
	}
	t.Error(b.String())
}

// ---------------------------------------------------------------- history

// partHold is one lock call and, if it succeeded, the hold it made.
type partHold struct {
	proc           string
	g, seq         int
	write          bool // a write hold (or a mutex's or a semaphore's)
	call, deadline time.Time
	ret            time.Time
	err            string // "nil" when held
	fence          int64
	lost           time.Time // when its Lost closed while held; zero if it did not
	unlockCall     time.Time // zero while not unlocked
	unlockDeadline time.Time
	unlockRet      time.Time
	unlockErr      string
	writes         []partWrite
}

func (h *partHold) id() string { return fmt.Sprintf("%s.g%d.%d", h.proc, h.g, h.seq) }
func (h *partHold) held() bool { return h.err == "nil" }
func (h *partHold) mode() string {
	if h.write {
		return "write"
	}
	return "read"
}

// until is when the hold ended for the others: its unlock call (or never).
func (h *partHold) until() time.Time {
	if h.unlockCall.IsZero() {
		return time.Unix(1<<40, 0)
	}
	return h.unlockCall
}

// lostBy reports whether the hold's Lost had closed by t.
func (h *partHold) lostBy(t time.Time) bool { return !h.lost.IsZero() && !h.lost.After(t) }

type partWrite struct {
	op        string // begin or end
	call, ret time.Time
	res       string // 1 accepted, 0 refused, else an error
}

type partEvent struct {
	at   time.Time
	who  string
	text string
}

type partViolation struct {
	at   time.Time
	kind string
	text string
}

// The kinds of violations.
const (
	partTakenOver = "hold taken over before its Lost closed"
	partFenceInv  = "fence inversion"
	partRegister  = "register"
	partRefused   = "register refused a hold not lost"
	partLateCall  = "call returned late"
	partIdle      = "lock not in use again after a heal"
	partChild     = "holder process"
)

type partHistory struct {
	start time.Time

	mu     sync.Mutex
	holds  map[string]*partHold
	order  []*partHold // in the order their lock calls returned
	events []partEvent
	viol   []partViolation
	last   time.Time // of the latest acquisition
	n      int       // acquisitions
	kick   chan struct{}
	cuts   int
}

func newPartHistory() *partHistory {
	return &partHistory{start: time.Now(), holds: map[string]*partHold{}, kick: make(chan struct{})}
}

func partTime(s string) time.Time {
	ns, _ := strconv.ParseInt(s, 10, 64)
	return time.Unix(0, ns)
}

func partInt(s string) int { n, _ := strconv.Atoi(s); return n }

// add records one event of a holder process (see partitionRole).
func (ph *partHistory) add(proc string, f []string) {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if len(f) < 4 {
		ph.events = append(ph.events, partEvent{time.Now(), proc, strings.Join(f, " ")})
		return
	}
	key := fmt.Sprintf("%s.g%s.%s", proc, f[1], f[2])
	h := ph.holds[key]
	if h == nil {
		h = &partHold{proc: proc, g: partInt(f[1]), seq: partInt(f[2])}
		ph.holds[key] = h
	}
	var ev partEvent
	switch f[0] {
	case "lock": // lock g seq mode call deadline ret err fence
		h.write = f[3] == "w"
		h.call, h.deadline, h.ret, h.err = partTime(f[4]), partTime(f[5]), partTime(f[6]), f[7]
		h.fence, _ = strconv.ParseInt(f[8], 10, 64)
		ph.order = append(ph.order, h)
		ev = partEvent{h.ret, proc, fmt.Sprintf("%s %s lock returned %s fence %d (called %s, deadline %s)",
			h.id(), h.mode(), h.err, h.fence, ph.rel(h.call), ph.rel(h.deadline))}
		if h.held() {
			ph.n++
			if h.ret.After(ph.last) {
				ph.last = h.ret
			}
			close(ph.kick)
			ph.kick = make(chan struct{})
		}
	case "lost": // lost g seq at
		h.lost = partTime(f[3])
		ev = partEvent{h.lost, proc, h.id() + " Lost closed"}
	case "write": // write g seq op call ret res
		w := partWrite{op: f[3], call: partTime(f[4]), ret: partTime(f[5]), res: f[6]}
		h.writes = append(h.writes, w)
		ev = partEvent{w.ret, proc, fmt.Sprintf("%s register %s fence %d → %s (called %s)", h.id(), w.op, h.fence, w.res, ph.rel(w.call))}
	case "unlock": // unlock g seq mode call deadline ret err
		h.unlockCall, h.unlockDeadline, h.unlockRet, h.unlockErr = partTime(f[4]), partTime(f[5]), partTime(f[6]), f[7]
		ev = partEvent{h.unlockRet, proc, fmt.Sprintf("%s unlock returned %s (called %s, deadline %s)",
			h.id(), h.unlockErr, ph.rel(h.unlockCall), ph.rel(h.unlockDeadline))}
	default:
		ev = partEvent{time.Now(), proc, strings.Join(f, " ")}
	}
	ph.events = append(ph.events, ev)
}

// note records an event of the test itself.
func (ph *partHistory) note(who, text string) {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if strings.HasPrefix(text, "cut") {
		ph.cuts++
	}
	ph.events = append(ph.events, partEvent{time.Now(), who, text})
}

func (ph *partHistory) violate(v partViolation) {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	ph.viol = append(ph.viol, v)
}

func (ph *partHistory) changed() <-chan struct{} {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	return ph.kick
}

func (ph *partHistory) acquired() int {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	return ph.n
}

// waitAcquired waits until a lock call that returned after since holds,
// and reports whether one did within d.
func (ph *partHistory) waitAcquired(since time.Time, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		ph.mu.Lock()
		ok, kick := !ph.last.Before(since), ph.kick
		ph.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-kick:
		case <-timer.C:
			return false
		}
	}
}

// rel is t as an offset from the start of the run.
func (ph *partHistory) rel(t time.Time) string {
	return fmt.Sprintf("+%.3fs", t.Sub(ph.start).Seconds())
}

// around lists the events from before ahead of at to after it, in time
// order: at most max of the holders' (the nearest to at), and every fault
// and heal of the nemesis in three times that span before at, which
// explain them.
func (ph *partHistory) around(at time.Time, before, after time.Duration, max int) string {
	ph.mu.Lock()
	evs := append([]partEvent(nil), ph.events...)
	ph.mu.Unlock()
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	var sel, faults []partEvent
	for _, e := range evs {
		switch {
		case e.at.After(at.Add(after)):
		case e.who == "nemesis" && !e.at.Before(at.Add(-3*before)):
			faults = append(faults, e)
		case !e.at.Before(at.Add(-before)):
			sel = append(sel, e)
		}
	}
	for len(sel) > max { // drop the one farthest from at
		if at.Sub(sel[0].at) > sel[len(sel)-1].at.Sub(at) {
			sel = sel[1:]
		} else {
			sel = sel[:len(sel)-1]
		}
	}
	sel = append(sel, faults...)
	sort.SliceStable(sel, func(i, j int) bool { return sel[i].at.Before(sel[j].at) })
	var b strings.Builder
	for _, e := range sel {
		mark := "  "
		if e.at.Equal(at) {
			mark = "=>"
		}
		fmt.Fprintf(&b, "%s %s %-8s %s\n", mark, ph.rel(e.at), e.who, e.text)
	}
	return b.String()
}

func (ph *partHistory) summary() string {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	var calls, held, lost, refused int
	for _, h := range ph.holds {
		calls++
		if h.held() {
			held++
		}
		if !h.lost.IsZero() {
			lost++
		}
		for _, w := range h.writes {
			if w.res == "0" {
				refused++
			}
		}
	}
	return fmt.Sprintf("%d lock calls, %d held, %d lost, %d refused writes, %d cuts in %v",
		calls, held, lost, refused, ph.cuts, time.Since(ph.start).Round(time.Second))
}

// ---------------------------------------------------------------- checks

// partRegisterLog is what the register saw.
type partRegisterLog struct {
	accepted []redistest.Write
	found    []redistest.Anomaly
}

// checkPartition checks a finished run's history and register:
//
//   - a hold that another took over had its Lost closed first: when a lock
//     call returns held, fewer holds that exclude it (capacity: 1, or the
//     semaphore's permits) may be open (returned, not yet unlocking) with
//     Lost still open. docs/guarantees.md: a hold's validity ends a drift
//     margin before its key can expire on the server, so its holder knows
//     before anyone else can take the lock; partSlack allows for the
//     goroutine that timestamps Lost;
//   - fences rise: a hold that returned after another (a semaphore's: whose
//     call began after another returned) has a larger fence (read holds
//     carry a writer's and are left out);
//   - the register accepted no overlap, no shared fence and no fence that
//     went back (the semaphore's: never more than its permits at once),
//     and refused only writes of holds already lost;
//   - no lock or unlock call returned more than partLate past its
//     deadline;
//
// plus the violations recorded while the run went (the lock not in use
// again within partBack of a heal, holder processes that failed).
func checkPartition(ph *partHistory, kind string, reg partRegisterLog) []partViolation {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	viol := append([]partViolation(nil), ph.viol...)
	var held []*partHold
	for _, h := range ph.order {
		if h.held() {
			held = append(held, h)
		}
		if late := h.ret.Sub(h.deadline); late > partLate {
			viol = append(viol, partViolation{h.ret, partLateCall, fmt.Sprintf("%s: lock returned %v past its deadline", h.id(), late)})
		}
		if late := h.unlockRet.Sub(h.unlockDeadline); !h.unlockCall.IsZero() && late > partLate {
			viol = append(viol, partViolation{h.unlockRet, partLateCall, fmt.Sprintf("%s: unlock returned %v past its deadline", h.id(), late)})
		}
		for _, w := range h.writes {
			switch {
			case w.res == "0" && !h.lostBy(w.ret.Add(partSlack)):
				viol = append(viol, partViolation{w.ret, partRefused, fmt.Sprintf("%s: %s with fence %d refused, Lost %s",
					h.id(), w.op, h.fence, ph.lostText(h))})
			case w.res != "0" && w.res != "1":
				viol = append(viol, partViolation{w.ret, partRegister, fmt.Sprintf("%s: %s: %s", h.id(), w.op, w.res)})
			}
		}
	}
	viol = append(viol, ph.checkTakeOver(held, kind)...)
	viol = append(viol, ph.checkFences(held, kind)...)
	viol = append(viol, ph.checkRegister(kind, reg)...)
	return viol
}

func (ph *partHistory) lostText(h *partHold) string {
	if h.lost.IsZero() {
		return "never closed"
	}
	return "closed at " + ph.rel(h.lost)
}

// checkTakeOver finds holds that began while too many others held the
// lock with their Lost open.
func (ph *partHistory) checkTakeOver(held []*partHold, kind string) []partViolation {
	capacity := 1
	if kind == "sem" {
		capacity = partPermits
	}
	var viol []partViolation
	for _, b := range held {
		var in []*partHold
		for _, a := range held {
			if a == b || !(a.write || b.write) || !a.ret.Before(b.ret) || !b.ret.Before(a.until()) || a.lostBy(b.ret.Add(partSlack)) {
				continue
			}
			in = append(in, a)
		}
		if len(in) >= capacity {
			var names []string
			for _, a := range in {
				names = append(names, fmt.Sprintf("%s (fence %d, held since %s, Lost %s)", a.id(), a.fence, ph.rel(a.ret), ph.lostText(a)))
			}
			viol = append(viol, partViolation{b.ret, partTakenOver, fmt.Sprintf("%s %s took the lock (fence %d) while %s held it",
				b.id(), b.mode(), b.fence, strings.Join(names, ", "))})
		}
	}
	return viol
}

// checkFences finds a hold whose fence is not larger than that of a hold
// that returned before it: before its lock call began (a semaphore's
// holders may overlap, so later calls may return first), or, for a mutex's
// and a writer's, before it returned. Two holds of a mutex never overlap,
// so the one that returned later must have been taken later: a hold that
// returns after another with a larger fence had already ended (or had been
// given away) when it was reported held.
func (ph *partHistory) checkFences(held []*partHold, kind string) []partViolation {
	var w []*partHold
	for _, h := range held {
		if h.write {
			w = append(w, h)
		}
	}
	begun := func(h *partHold) time.Time { return h.ret }
	if kind == "sem" {
		begun = func(h *partHold) time.Time { return h.call }
	}
	byRet := append([]*partHold(nil), w...)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].ret.Before(byRet[j].ret) })
	byBegun := append([]*partHold(nil), w...)
	sort.Slice(byBegun, func(i, j int) bool { return begun(byBegun[i]).Before(begun(byBegun[j])) })
	var viol []partViolation
	var top *partHold // the largest fence among the holds returned so far
	i := 0
	for _, b := range byBegun {
		for ; i < len(byRet) && byRet[i].ret.Before(begun(b)); i++ {
			if top == nil || byRet[i].fence > top.fence {
				top = byRet[i]
			}
		}
		if top != nil && b.fence <= top.fence {
			viol = append(viol, partViolation{b.ret, partFenceInv, fmt.Sprintf("%s got fence %d (called %s, returned %s), but %s had got %d at %s",
				b.id(), b.fence, ph.rel(b.call), ph.rel(b.ret), top.id(), top.fence, ph.rel(top.ret))})
		}
	}
	return viol
}

// checkRegister reports what the register saw wrong.
func (ph *partHistory) checkRegister(kind string, reg partRegisterLog) []partViolation {
	var viol []partViolation
	at := func(w redistest.Write) time.Time { return time.UnixMicro(w.End) }
	if kind == "sem" {
		for _, c := range redistest.Crowds(reg.accepted, partPermits) {
			viol = append(viol, partViolation{time.UnixMicro(c[len(c)-1].Start), partRegister,
				fmt.Sprintf("%d writers at once, want at most %d: %v", len(c), partPermits, c)})
		}
		return viol
	}
	for _, a := range reg.found {
		if a.Kind == redistest.Refused {
			continue // checked against the holds' Lost
		}
		viol = append(viol, partViolation{at(a.B), partRegister, a.String()})
	}
	return viol
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
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	c := remutex.NewClient(rdb, remutex.WithLogger(slog.New(slog.DiscardHandler)))
	reg := redistest.OpenRegister(cfg.Register, cfg.RegisterKey)
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
	redistest.Emit("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() && sc.Text() != "stop" {
	}
	cancel()
	wg.Wait()
	_ = c.Close()
	_ = rdb.Close()
	_ = reg.Close()
	redistest.Emit("done")
	return 0
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
	lost, quit, watched := l.lost(), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-lost:
			redistest.Emit("p", "lost", g, seq, time.Now().UnixNano())
		case <-quit:
		}
	}()
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
	close(quit)
	<-watched
	call = time.Now()
	deadline = call.Add(between(500*time.Millisecond, 3*time.Second))
	uctx, ucancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	err = l.unlock(uctx)
	ret = time.Now()
	ucancel()
	redistest.Emit("p", "unlock", g, seq, mode, call.UnixNano(), deadline.UnixNano(), ret.UnixNano(), errKind(err))
}

// TestCheckPartition: the checks on histories made up for them.
func TestCheckPartition(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// hold: proc, write, fence, lock call/return and unlock call (ms); the
	// deadlines are far.
	hold := func(proc string, write bool, fence int64, call, ret, unlock int) *partHold {
		return &partHold{proc: proc, write: write, fence: fence, err: "nil",
			call: at(call), ret: at(ret), deadline: at(ret + 1000),
			unlockCall: at(unlock), unlockRet: at(unlock + 1), unlockDeadline: at(unlock + 1000), unlockErr: "nil"}
	}
	lostAt := func(h *partHold, ms int) *partHold { h.lost = at(ms); return h }
	cases := []struct {
		name  string
		kind  string
		holds []*partHold
		want  []string // kinds found, sorted
	}{
		{"in turn", "mutex", []*partHold{hold("a", true, 1, 0, 1, 10), hold("b", true, 2, 5, 11, 20)}, nil},
		{"taken over, not lost", "mutex", []*partHold{hold("a", true, 1, 0, 1, 100), hold("b", true, 2, 5, 50, 60)},
			[]string{partTakenOver}},
		{"taken over after Lost", "mutex", []*partHold{lostAt(hold("a", true, 1, 0, 1, 100), 40), hold("b", true, 2, 5, 50, 60)}, nil},
		{"taken over within the slack before Lost", "mutex", []*partHold{lostAt(hold("a", true, 1, 0, 1, 100), 50+10), hold("b", true, 2, 5, 50, 60)}, nil},
		{"taken over long before Lost", "mutex", []*partHold{lostAt(hold("a", true, 1, 0, 1, 100), 90), hold("b", true, 2, 5, 50, 60)},
			[]string{partTakenOver}},
		{"fence went back", "mutex", []*partHold{hold("a", true, 5, 0, 1, 10), hold("b", true, 4, 12, 13, 20)},
			[]string{partFenceInv}},
		{"fence repeated", "mutex", []*partHold{hold("a", true, 5, 0, 1, 10), hold("b", true, 5, 12, 13, 20)},
			[]string{partFenceInv}},
		{"returned after a larger fence", "mutex", []*partHold{hold("a", true, 5, 0, 10, 11), hold("b", true, 4, 1, 12, 20)},
			[]string{partFenceInv}},
		{"permits, concurrent calls", "sem", []*partHold{hold("a", true, 5, 0, 10, 11), hold("b", true, 4, 1, 12, 20)}, nil},
		{"permits, fence went back", "sem", []*partHold{hold("a", true, 5, 0, 10, 11), hold("b", true, 4, 11, 12, 20)},
			[]string{partFenceInv}},
		{"readers together", "rw", []*partHold{hold("a", false, 1, 0, 1, 100), hold("b", false, 1, 5, 50, 60)}, nil},
		{"writer among readers", "rw", []*partHold{hold("a", false, 1, 0, 1, 100), hold("b", true, 2, 5, 50, 60)},
			[]string{partTakenOver}},
		{"two of two permits", "sem", []*partHold{hold("a", true, 1, 0, 1, 100), hold("b", true, 2, 5, 50, 60)}, nil},
		{"three of two permits", "sem", []*partHold{hold("a", true, 1, 0, 1, 100), hold("b", true, 2, 5, 20, 100),
			hold("c", true, 3, 5, 50, 60)}, []string{partTakenOver}},
		{"lock late", "mutex", []*partHold{func() *partHold {
			h := hold("a", true, 1, 0, 1000, 1010)
			h.deadline = at(1000 - int(partLate/time.Millisecond) - 1)
			return h
		}()}, []string{partLateCall}},
		{"unlock late", "mutex", []*partHold{func() *partHold {
			h := hold("a", true, 1, 0, 1, 10)
			h.unlockRet = h.unlockDeadline.Add(partLate + time.Millisecond)
			return h
		}()}, []string{partLateCall}},
		{"refused, lost", "mutex", []*partHold{func() *partHold {
			h := lostAt(hold("a", true, 1, 0, 1, 10), 4)
			h.writes = []partWrite{{op: "end", call: at(5), ret: at(6), res: "0"}}
			return h
		}()}, nil},
		{"refused, not lost", "mutex", []*partHold{func() *partHold {
			h := hold("a", true, 1, 0, 1, 10)
			h.writes = []partWrite{{op: "end", call: at(5), ret: at(6), res: "0"}}
			return h
		}()}, []string{partRefused}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ph := newPartHistory()
			ph.start = t0
			for i, h := range tc.holds {
				h.seq = i
				ph.holds[h.id()] = h
				ph.order = append(ph.order, h)
			}
			var got []string
			for _, v := range checkPartition(ph, tc.kind, partRegisterLog{}) {
				got = append(got, v.kind)
			}
			sort.Strings(got)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got violations %q, want %q", got, tc.want)
			}
		})
	}
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
