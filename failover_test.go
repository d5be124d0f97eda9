package remutex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// Failover under load, on real processes: a Sentinel deployment (a primary,
// two replicas, three sentinels) whose primary is killed, or paused until a
// replica is promoted and then resumed as a stale primary; and a Redis
// Cluster of three masters with a replica each, whose master of the locks'
// slots is killed. While it happens, several Clients hammer a few locks
// WithFencing, each critical section written to the fenced register; other
// Clients keep holds across the failover; one waits across it for a lock
// another holds.
//
// What is asserted is what docs/deployments.md states:
//   - with WithReplicaAck(1, ...): no anomaly at all in the register (no
//     overlapping sections, no shared or falling fence, no refused write),
//     but for a goroutine that continues its own hold after an Unlock that
//     could not reach Redis (see takesOver), which is counted apart;
//   - without it: none among sections on the primary while it lived, none
//     among sections acquired after the failover settled; across the
//     failover anything may happen, and what did is logged (a refused
//     write is paired with the write whose fence it fell below, so a
//     promoted counter that lags the old primary's tokens counts as across
//     the failover however long after it the refused hold came);
//   - in both: every LockContext returns, with the lock or an error, and
//     none later than its context allows (foHangGrace); every hold kept
//     across the failover is either reported lost (Lost closes) or renewed
//     on the new primary, which has its owner's field; a waiter's
//     subscription follows the lock to the new primary, and a release there
//     reaches it as a message; a Client that only holds a lock across the
//     failover (and so has no subscription that could notice it) keeps it,
//     unless the new primary says it is not its own, and takes a fresh lock
//     there.
//
// The figures (time from the fault to the promotion and to the first Lock
// that returned after it, sections, anomalies) are logged on lines that
// begin "failover:"; docs/deployments.md quotes them.

const (
	foClients    = 3
	foLocks      = 2 // hammered locks
	foGoroutines = 2 // per Client and hammered lock
	foWarm       = 3 // sections of each lock before the fault
	foAfter      = 5 // sections of each lock after the failover settled
	foLease      = 2 * time.Second
	foHoldLease  = 8 * time.Second  // holds kept across the failover
	foQuietLease = 30 * time.Second // the quiet Client's hold: it outlives any failover here
	foLockCtx    = 10 * time.Second
	foHangGrace  = 5 * time.Second // past its context, a LockContext counts as hung
	foAckTimeout = 200 * time.Millisecond
)

// foDeployment is a deployment whose primary for the test's locks fails.
type foDeployment interface {
	// rdb returns a new go-redis client (a pool of its own).
	rdb(t *testing.T) redis.UniversalClient
	// names returns n lock names under prefix on the primary that will fail.
	names(t *testing.T, prefix, base string, n int) []string
	// fail kills or pauses that primary.
	fail(t *testing.T)
	// quiet is how long after the fault no replica can have been promoted
	// yet: a Lock that returns sooner was granted by the old primary.
	quiet() time.Duration
	// awaitPromotion waits until a replica took its place.
	awaitPromotion(t *testing.T) time.Time
	// settle ends the fault (a paused primary resumes, and is made a
	// replica; a killed cluster master restarts, as a replica): from the
	// time it returns (settled), everything is on the new primary, which
	// has a replica. promoted is when that primary's promotion was seen:
	// later than awaitPromotion's where the first one promoted stalled on
	// a loaded machine and was failed over in turn.
	settle(t *testing.T) (settled, promoted time.Time)
	// primary returns an administrative client of the new primary.
	primary(t *testing.T) *redis.Client
	// observe subscribes to channel on the new primary.
	observe(t *testing.T, channel string) <-chan *redis.Message
}

// foResult is what one failover run measured.
type foResult struct {
	fault, promoted, settled time.Time
	lastPromoted             time.Time // the promotion of the primary the deployment settled on
	firstLock                time.Time // the first LockContext to return the lock once a promotion was possible
}

// runFailover runs the load on d, fails its primary, and checks and logs
// the outcome.
func runFailover(t *testing.T, d foDeployment, ack bool) {
	prefix := topoPrefix(t)
	l := newFoLoad(t, d, prefix, ack)
	holds := l.holdAcross(t)
	probe := l.waitAcross(t, holds[0])
	l.start()
	l.awaitSections(t, time.Time{}, foWarm)

	var r foResult
	r.fault = time.Now()
	d.fail(t)
	r.promoted = d.awaitPromotion(t)
	// Before the fault ends (a paused primary still paused, a dead master
	// not back yet), the waiter listens on the new primary.
	l.awaitListening(t, holds[0], "on the new primary")
	r.settled, r.lastPromoted = d.settle(t)
	kept := l.checkHolds(t, holds, r.lastPromoted, d.primary(t))
	l.lockFresh(t)
	l.checkPush(t, d, probe, holds[0])
	l.awaitSections(t, r.settled, foAfter)
	l.stopAndJoin(t)
	l.releaseHolds(t, holds)

	r.firstLock = l.checkCalls(t, r.fault.Add(d.quiet()))
	t.Logf("failover: %s: promoted %v after the fault, first Lock %v after the fault; holds across it: %d of %d kept (renewed on the new primary), the rest reported lost",
		t.Name(), r.promoted.Sub(r.fault).Round(time.Millisecond), r.firstLock.Sub(r.fault).Round(time.Millisecond), kept, len(holds))
	l.checkRegisters(t, r, ack)
}

// foLoad is the load of one failover test.
type foLoad struct {
	regs     []*redistest.Register // per hammered lock
	clients  []*Client
	mutexes  [][]*DistMutex // hammered: [client][lock]
	holdName []string       // the lock each Client holds across the failover
	quiet    *Client        // a Client that only holds a lock across the failover
	fresh    string         // a lock the quiet Client takes after the failover
	stop     chan struct{}
	wg       sync.WaitGroup

	mu       sync.Mutex
	calls    []foCall
	sections [][]time.Time        // per hammered lock, when each section began
	renewed  map[string]time.Time // lock name: when the latest renewal of it came back
	lostWhy  map[string]error     // lock name: why its hold was lost
	granted  map[string]bool      // lock name: its latest acquisition was handed over by the queue
	unlocks  []error              // UnlockContext errors of the hammer
	kick     chan struct{}        // capacity 1: sections or renewals changed
}

// foCall is one LockContext of the hammer.
type foCall struct {
	start, deadline, end time.Time
	err                  error
}

func newFoLoad(t *testing.T, d foDeployment, prefix string, ack bool) *foLoad {
	l := &foLoad{
		stop:     make(chan struct{}),
		sections: make([][]time.Time, foLocks),
		renewed:  map[string]time.Time{},
		lostWhy:  map[string]error{},
		granted:  map[string]bool{},
		kick:     make(chan struct{}, 1),
	}
	opts := []Option{WithKeyPrefix(prefix), WithHook(l.hook), WithLogger(slog.New(slog.DiscardHandler))}
	if ack {
		opts = append(opts, WithReplicaAck(1, foAckTimeout))
	}
	names := d.names(t, prefix, "hammer", foLocks)
	for range names {
		l.regs = append(l.regs, redistest.NewRegister(t))
	}
	l.holdName = d.names(t, prefix, "hold", foClients+1)
	l.fresh = d.names(t, prefix, "fresh", 1)[0]
	l.quiet = clientOn(t, d.rdb(t), opts...)
	for i := 0; i < foClients; i++ {
		c := clientOn(t, d.rdb(t), opts...)
		l.clients = append(l.clients, c)
		var ms []*DistMutex
		for _, name := range names {
			ms = append(ms, c.NewMutex(name, WithFencing(), WithLease(foLease)))
		}
		l.mutexes = append(l.mutexes, ms)
	}
	t.Cleanup(func() {
		select {
		case <-l.stop:
		default:
			close(l.stop)
		}
		l.wg.Wait()
	})
	return l
}

// hook records renewals, and wakes await for them and for lost holds.
func (l *foLoad) hook(ev Event) {
	switch ev.Kind {
	case EventRenewed:
		l.mu.Lock()
		l.renewed[ev.Lock] = time.Now()
		l.mu.Unlock()
		l.signal()
	case EventAcquired:
		l.mu.Lock()
		l.granted[ev.Lock] = ev.Granted
		l.mu.Unlock()
	case EventLost:
		l.mu.Lock()
		l.lostWhy[ev.Lock] = ev.Err
		l.mu.Unlock()
		l.signal()
	}
}

func (l *foLoad) signal() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// start runs the hammer: foGoroutines goroutines per Client and lock.
func (l *foLoad) start() {
	for i, ms := range l.mutexes {
		for k, m := range ms {
			for g := 0; g < foGoroutines; g++ {
				l.wg.Add(1)
				go l.hammer(fmt.Sprintf("c%d.l%d.g%d", i, k, g), k, m)
			}
		}
	}
}

// hammer locks m over and over until stop, entering the register while it
// holds it. The writer's name carries the time LockContext returned, so
// that the register's anomalies can be placed before or after the failover.
func (l *foLoad) hammer(who string, lock int, m *DistMutex) {
	defer l.wg.Done()
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), foLockCtx)
		call := foCall{start: time.Now()}
		call.deadline, _ = ctx.Deadline()
		call.err = m.LockContext(ctx)
		call.end = time.Now()
		cancel()
		l.record(call)
		if call.err != nil {
			continue
		}
		l.began(lock, call.end)
		l.regs[lock].Enter(who+"@"+strconv.FormatInt(call.end.UnixMicro(), 10), m.Fence())()
		if err := m.UnlockContext(context.Background()); err != nil {
			l.mu.Lock()
			l.unlocks = append(l.unlocks, err)
			l.mu.Unlock()
		}
	}
}

func (l *foLoad) record(c foCall) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, c)
}

func (l *foLoad) began(lock int, at time.Time) {
	l.mu.Lock()
	l.sections[lock] = append(l.sections[lock], at)
	l.mu.Unlock()
	l.signal()
}

// awaitSections waits until every hammered lock was taken n times after
// since.
func (l *foLoad) awaitSections(t *testing.T, since time.Time, n int) {
	t.Helper()
	l.await(t, fmt.Sprintf("%d sections of each lock after %v", n, since.Format("15:04:05.000")), func() bool {
		for _, s := range l.sections {
			i := sort.Search(len(s), func(i int) bool { return s[i].After(since) })
			if len(s)-i < n {
				return false
			}
		}
		return true
	})
}

// await waits until cond, read under l.mu, holds; the hammer and the hook
// kick it when what it reads changes.
func (l *foLoad) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(hangGuard)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		ok := cond()
		l.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-l.kick:
		case <-deadline.C:
			t.Fatalf("got nothing after %v, want %s", hangGuard, what)
		}
	}
}

// stopAndJoin stops the hammer and waits for it: every LockContext in
// flight returns within its context and foHangGrace, or the test fails.
func (l *foLoad) stopAndJoin(t *testing.T) {
	t.Helper()
	close(l.stop)
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(foLockCtx + foHangGrace):
		t.Fatalf("the hammer did not stop within %v: a LockContext hangs past its context", foLockCtx+foHangGrace)
	}
}

// foHold is a hold kept across the failover by a goroutine of the test.
type foHold struct {
	m        *DistMutex
	owner    string
	lost     <-chan struct{}
	release  chan struct{}
	unlocked chan error
	done     bool  // unlock was called
	err      error // what its UnlockContext returned
}

// unlock lets the hold's goroutine unlock (once), and returns what its
// UnlockContext returned.
func (h *foHold) unlock(t *testing.T) error {
	t.Helper()
	if !h.done {
		close(h.release)
		h.err, h.done = await(t, h.unlocked, "a hold's UnlockContext"), true
	}
	return h.err
}

// holdAcross has each Client take a lock of its own, with foHoldLease, and
// keep it until releaseHolds.
func (l *foLoad) holdAcross(t *testing.T) []*foHold {
	t.Helper()
	var holds []*foHold
	for i, c := range append(l.clients[:foClients:foClients], l.quiet) {
		lease := foHoldLease
		if c == l.quiet {
			lease = foQuietLease
		}
		h := &foHold{m: c.NewMutex(l.holdName[i], WithFencing(), WithLease(lease)),
			release: make(chan struct{}), unlocked: make(chan error, 1)}
		ready := make(chan error, 1)
		ctx := testCtx(t, hangGuard)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			if err := h.m.LockContext(ctx); err != nil {
				ready <- err
				return
			}
			h.owner, h.lost = ownerString(h.m.current().owner), h.m.Lost()
			ready <- nil
			select {
			case <-h.release:
			case <-l.stop:
			}
			h.unlocked <- h.m.UnlockContext(context.Background())
		}()
		if err := await(t, ready, "a hold's LockContext"); err != nil {
			t.Fatalf("LockContext(%q) before the failover: got %v, want nil", h.m.Name(), err)
		}
		holds = append(holds, h)
	}
	return holds
}

// checkHolds waits until each hold was either lost or renewed after the
// promotion, and checks that a hold not lost is on the new primary under
// its owner. It returns how many were kept.
func (l *foLoad) checkHolds(t *testing.T, holds []*foHold, promoted time.Time, primary *redis.Client) (kept int) {
	t.Helper()
	for _, h := range holds {
		name := h.m.Name()
		l.await(t, fmt.Sprintf("hold %q lost or renewed after the promotion", name), func() bool {
			return isClosed(h.lost) || l.renewed[name].After(promoted)
		})
		if isClosed(h.lost) {
			l.mu.Lock()
			why := l.lostWhy[name]
			l.mu.Unlock()
			if errors.Is(why, errExpired) && h.m.c == l.quiet {
				t.Errorf("hold %q of a Client that only held it, lease %v: got lost by %v, want it renewed on the new primary (or lost there as not ours)", name, foQuietLease, why)
			}
			continue
		}
		kept++
		ok, err := primary.HExists(testCtx(t, hangGuard), h.m.spec.hash(), h.owner).Result()
		if err != nil || !ok {
			t.Errorf("hold %q renewed after the promotion and not lost: HEXISTS %s %s on the new primary: got (%v, %v), want (true, nil)",
				name, h.m.spec.hash(), h.owner, ok, err)
		}
	}
	return kept
}

// releaseHolds unlocks the holds kept across the failover: a hold that was
// not reported lost must unlock cleanly, and one whose Unlock reports it
// lost must have closed its Lost channel.
func (l *foLoad) releaseHolds(t *testing.T, holds []*foHold) {
	t.Helper()
	for _, h := range holds {
		switch err := h.unlock(t); {
		case err == nil:
		case errors.Is(err, ErrLockLost) && isClosed(h.lost):
		default:
			t.Errorf("hold %q: UnlockContext: got %v with Lost closed %v, want nil, or ErrLockLost with Lost closed", h.m.Name(), h.err, isClosed(h.lost))
		}
	}
}

// lockFresh has the quiet Client, which never waited for a lock and so has
// no subscription that could have noticed the failover, take a lock on the
// new primary: its calls alone must find it.
func (l *foLoad) lockFresh(t *testing.T) {
	t.Helper()
	m := l.quiet.NewMutex(l.fresh, WithFencing())
	if err := m.LockContext(testCtx(t, hangGuard)); err != nil {
		t.Fatalf("LockContext(%q) on a Client that only held a lock across the failover: got %v, want nil", l.fresh, err)
	}
	if err := m.UnlockContext(testCtx(t, hangGuard)); err != nil {
		t.Errorf("UnlockContext(%q): got %v, want nil", l.fresh, err)
	}
}

// foProbe is a LockContext waiting across the failover for the first
// Client's hold, on the second Client.
type foProbe struct {
	lock    *asyncLock
	channel string // where the second Client hears of the lock
}

// waitAcross starts the probe and waits until it is queued and subscribed.
func (l *foLoad) waitAcross(t *testing.T, h *foHold) *foProbe {
	t.Helper()
	c := l.clients[1]
	m := c.NewMutex(h.m.Name(), WithFencing(), WithLease(foHoldLease))
	p := &foProbe{lock: lockAsync(t, m, nil, "probe"), channel: m.spec.channel}
	l.awaitListening(t, h, "before the failover")
	return p
}

// awaitListening waits until h's lock has one live waiter in Redis and one
// Client subscribed to its channel on the server that serves it, or h was
// lost (without replica acknowledgement the new primary may never have had
// it; the waiter then takes the lock).
func (l *foLoad) awaitListening(t *testing.T, h *foHold, when string) {
	t.Helper()
	name := h.m.Name()
	waitFor(t, fmt.Sprintf("a waiter of %q queued and subscribed %s", name, when), func() bool {
		if isClosed(h.lost) {
			return true
		}
		info, err := l.clients[0].Inspect(testCtx(t, hangGuard), name)
		return err == nil && len(info.Waiters) == 1 && info.Subscribers == 1
	})
}

// checkPush makes sure the probe, which subscribed before the failover,
// listens on the new primary, then releases the hold it waits for there:
// the release's message must reach its channel, and the probe must get the
// lock.
func (l *foLoad) checkPush(t *testing.T, d foDeployment, p *foProbe, h *foHold) {
	t.Helper()
	name := h.m.Name()
	l.awaitListening(t, h, "on the new primary once the failover settled")
	heard := d.observe(t, p.channel)
	// (releaseHolds checks the outcome.) A hold lost by then, before the
	// release or found gone by it, hands nothing on: the probe takes the
	// lock when it finds it free.
	lost := h.unlock(t) != nil || isClosed(h.lost)
	if r := await(t, p.lock.locked, "the probe's LockContext"); r.err != nil {
		t.Fatalf("probe: LockContext(%q) across the failover: got %v, want nil", name, r.err)
	}
	l.mu.Lock()
	granted := l.granted[name]
	l.mu.Unlock()
	switch {
	case granted:
		msg := await(t, heard, "the release's message on the probe's channel")
		t.Logf("failover: %s: the waiter across the failover heard %q on the new primary", t.Name(), msg.Payload)
	case !lost:
		// Its own refresh found the lock free first: between a quick
		// release's HDEL and the wake after it, or after its entry lapsed
		// on a stalled machine. Nothing was handed over, nor published.
		t.Logf("failover: %s: the waiter across the failover took the lock by its own call", t.Name())
	}
	p.lock.unlock()
	if err := await(t, p.lock.unlocked, "the probe's UnlockContext"); err != nil {
		t.Errorf("probe: UnlockContext: got %v, want nil", err)
	}
}

// checkCalls fails the test for a LockContext that returned later than its
// context allows, and for a hammer that never got a lock after the
// promotion could have happened; it returns when the first LockContext to
// return the lock after that did.
func (l *foLoad) checkCalls(t *testing.T, after time.Time) (first time.Time) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	kinds := map[string]int{}
	for _, c := range l.calls {
		if late := c.end.Sub(c.deadline); late > foHangGrace {
			t.Errorf("LockContext returned %v after its context's deadline (%v), want within %v", late, c.err, foHangGrace)
		}
		if c.err != nil {
			kinds[faultErrKind(c.err)]++
			continue
		}
		kinds["ok"]++
		if c.end.After(after) && (first.IsZero() || c.end.Before(first)) {
			first = c.end
		}
	}
	if first.IsZero() {
		t.Fatalf("no LockContext returned the lock after the failover; outcomes %v", kinds)
	}
	unlocks := map[string]int{}
	for _, err := range l.unlocks {
		unlocks[faultErrKind(err)]++
	}
	t.Logf("failover: %s: LockContext outcomes %v; UnlockContext errors %v", t.Name(), kinds, unlocks)
	return first
}

// checkRegisters checks the critical sections against what the deployment
// guarantees: with replica acknowledgement, no anomaly at all; without it,
// none among sections that ended while the primary lived or that were
// acquired once the failover settled, and the rest is logged.
func (l *foLoad) checkRegisters(t *testing.T, r foResult, ack bool) {
	t.Helper()
	sections := 0
	across := map[redistest.AnomalyKind]int{}
	for _, reg := range l.regs {
		for _, err := range reg.EnterErrors() {
			t.Error(err)
		}
		accepted, found := reg.Anomalies(t)
		sections += len(accepted)
		for _, a := range found {
			switch {
			case ack:
				t.Errorf("register, with replica acknowledgement: %v", a)
			case l.crossesFailover(t, a, r):
				across[a.Kind]++
				t.Logf("register, across the failover: %v", a)
			}
		}
	}
	t.Logf("failover: %s: %d sections; anomalies across the failover: %v", t.Name(), sections, across)
}

// crossesFailover reports whether anomaly a is one the deployment allows
// without replica acknowledgement, and fails the test if it is not: its
// sections may not all have ended while the primary lived, nor all have
// been acquired after the failover settled.
func (l *foLoad) crossesFailover(t *testing.T, a redistest.Anomaly, r foResult) bool {
	t.Helper()
	ws := []redistest.Write{a.B}
	if a.Kind != redistest.Refused || a.A.Writer != "" {
		// A refused write is paired with the write whose fence it fell
		// below: after a failover without replica acknowledgement the new
		// primary's counter may lag the tokens the old one gave out, and
		// holds acquired well after it settled are refused until it
		// passes them.
		ws = append(ws, a.A)
	}
	switch {
	case allWrites(ws, func(w redistest.Write) bool { return w.End < r.fault.UnixMicro() }):
		t.Errorf("register, while the primary lived: %v", a)
	case allWrites(ws, func(w redistest.Write) bool { return acquiredAt(t, w).After(r.settled) }):
		t.Errorf("register, among locks acquired after the failover settled: %v", a)
	default:
		return true
	}
	return false
}

func allWrites(ws []redistest.Write, f func(redistest.Write) bool) bool {
	for _, w := range ws {
		if !f(w) {
			return false
		}
	}
	return true
}

// acquiredAt reads, from the writer of a hammer's section, when its
// LockContext returned (see foLoad.hammer).
func acquiredAt(t *testing.T, w redistest.Write) time.Time {
	t.Helper()
	_, rest, _ := strings.Cut(w.Writer, "@")
	us, _, _ := strings.Cut(rest, "#")
	n, err := strconv.ParseInt(us, 10, 64)
	if err != nil {
		t.Fatalf("writer %q: no acquisition time", w.Writer)
	}
	return time.UnixMicro(n)
}

// ------------------------------------------------------------ Sentinel

// sentinelFailover is a Sentinel deployment whose primary is killed, or
// paused until a replica is promoted and then resumed as a stale primary.
type sentinelFailover struct {
	s             *redistest.Sentinel
	pause         bool
	old, promoted *redistest.Server
}

func (d *sentinelFailover) rdb(t *testing.T) redis.UniversalClient {
	return d.s.Client(t, redis.FailoverOptions{ContextTimeoutEnabled: true, ReadTimeout: time.Second, WriteTimeout: time.Second})
}

func (d *sentinelFailover) names(t *testing.T, prefix, base string, n int) []string {
	var names []string
	for i := 0; i < n; i++ {
		names = append(names, base+strconv.Itoa(i))
	}
	return names
}

func (d *sentinelFailover) fail(t *testing.T) {
	d.old = d.s.Primary(t)
	if d.pause {
		d.old.Signal(t, syscall.SIGSTOP)
		return
	}
	d.old.Stop()
}

func (d *sentinelFailover) quiet() time.Duration { return redistest.DownAfter }

func (d *sentinelFailover) awaitPromotion(t *testing.T) (at time.Time) {
	d.promoted, at = d.s.AwaitSwitch(t, d.old)
	return at
}

func (d *sentinelFailover) settle(t *testing.T) (settled, promoted time.Time) {
	if d.pause {
		d.old.Signal(t, syscall.SIGCONT)
	}
	d.promoted, promoted = d.s.AwaitSettled(t)
	return time.Now(), promoted
}

func (d *sentinelFailover) primary(t *testing.T) *redis.Client { return rdbAt(t, d.promoted.Addr()) }

func (d *sentinelFailover) observe(t *testing.T, channel string) <-chan *redis.Message {
	return observeChannel(t, d.primary(t).Subscribe(testCtx(t, hangGuard), channel))
}

// observeChannel returns the messages of ps, once its subscription is
// confirmed; ps is closed at the end of the test.
func observeChannel(t *testing.T, ps *redis.PubSub) <-chan *redis.Message {
	t.Helper()
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(testCtx(t, hangGuard)); err != nil {
		t.Fatalf("subscribing to observe a channel: %v", err)
	}
	return ps.Channel()
}

// TestFailoverSentinelKill kills the primary (SIGKILL) under load.
func TestFailoverSentinelKill(t *testing.T) {
	skipShort(t, "a failover")
	t.Parallel()
	eachAck(t, func(t *testing.T, ack bool) {
		runFailover(t, &sentinelFailover{s: redistest.StartSentinel(t)}, ack)
	})
}

// TestFailoverSentinelStalePrimary pauses the primary (SIGSTOP) under load
// until a replica is promoted, then resumes it: it comes back believing it
// is the primary, until the sentinels make it a replica (some 8s later).
func TestFailoverSentinelStalePrimary(t *testing.T) {
	skipShort(t, "a failover")
	t.Parallel()
	eachAck(t, func(t *testing.T, ack bool) {
		runFailover(t, &sentinelFailover{s: redistest.StartSentinel(t), pause: true}, ack)
	})
}

// eachAck runs f with and without WithReplicaAck, in parallel: each on a
// deployment of its own, and most of their time is spent waiting.
func eachAck(t *testing.T, f func(t *testing.T, ack bool)) {
	for _, ack := range []bool{true, false} {
		name := "WithReplicaAck"
		if !ack {
			name = "WithoutReplicaAck"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			settleDialers(t)
			f(t, ack)
		})
	}
}

// ------------------------------------------------------------ Cluster

// clusterNodeTimeout is how long a master is unreachable before the
// cluster fails it over.
const clusterNodeTimeout = time.Second

// clusterFailover is a Cluster whose master of the locks' slots is killed;
// its replica is promoted by the cluster.
type clusterFailover struct {
	tc              *redistest.Cluster
	master, replica *redistest.Node
	slot            int
	promotedAt      time.Time
}

func (d *clusterFailover) rdb(t *testing.T) redis.UniversalClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: d.tc.Addrs(), ContextTimeoutEnabled: true,
		ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func (d *clusterFailover) names(t *testing.T, prefix, base string, n int) []string {
	var names []string
	for i := 0; i < n; i++ {
		names = append(names, nameOn(t, d.tc, d.master, prefix, base+strconv.Itoa(i)+"-"))
	}
	d.slot = keySlot(prefix + "{" + names[0] + "}")
	return names
}

func (d *clusterFailover) fail(t *testing.T) { d.replica = d.tc.KillMaster(t, d.master) }

func (d *clusterFailover) quiet() time.Duration { return clusterNodeTimeout }

func (d *clusterFailover) awaitPromotion(t *testing.T) time.Time {
	d.tc.AwaitPromotion(t, d.slot, d.replica)
	d.promotedAt = time.Now()
	return d.promotedAt
}

// settle restarts the dead master: it rejoins as a replica of the promoted
// one, which until then has no replica to acknowledge anything.
func (d *clusterFailover) settle(t *testing.T) (settled, promoted time.Time) {
	d.tc.Rejoin(t, d.master, d.replica)
	return time.Now(), d.promotedAt
}

func (d *clusterFailover) primary(t *testing.T) *redis.Client { return d.replica.RDB }

func (d *clusterFailover) observe(t *testing.T, channel string) <-chan *redis.Message {
	return observeChannel(t, d.replica.SubscribeShard(testCtx(t, hangGuard), channel))
}

// TestFailoverCluster kills, under load, the master that serves the locks'
// slots in a cluster of three masters with a replica each.
func TestFailoverCluster(t *testing.T) {
	skipShort(t, "a failover")
	t.Parallel()
	eachAck(t, func(t *testing.T, ack bool) {
		tc := redistest.StartCluster(t, 3, 1, "--cluster-node-timeout", strconv.FormatInt(clusterNodeTimeout.Milliseconds(), 10))
		runFailover(t, &clusterFailover{tc: tc, master: tc.Masters[0]}, ack)
	})
}
