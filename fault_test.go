package remutex

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// Reliability tests: real redis-server processes, real child processes, and
// faults done to them. Every lock that matters is fenced, and every holder
// writes to a fenced register (see internal/redistest) whose log shows
// overlapping holders and stale writers.

// faultLease is the lease of most fault tests: short, so that expiry is
// quick, long enough for the race detector on a busy machine.
const faultLease = time.Second

func faultInt(t testing.TB, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return n
}

// faultExpect checks one event field.
func faultExpect(t testing.TB, what string, got []string, want string) {
	t.Helper()
	if len(got) == 0 || got[0] != want {
		t.Fatalf("%s: got %v, want %s", what, got, want)
	}
}

// faultSubscribed waits until someone subscribed to channel: the sign that a
// waiter registered and blocks.
func faultSubscribed(t testing.TB, rdb *redis.Client, channel string) {
	t.Helper()
	faultEventually(t, 5*time.Second, func() error {
		n, err := subscribers(rdb, channel)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("no subscriber on %s*", channel)
		}
		return nil
	})
}

func faultHolderChild(t testing.TB, addr, name string, reg *redistest.Register, id string) *redistest.Child {
	t.Helper()
	c := startChild(t, childConfig{Role: "holder", Addr: addr, Name: name, Lease: faultLease, Register: reg.Addr(), RegisterKey: reg.Key(), ID: id})
	c.Expect(t, "ready", 20*time.Second)
	return c
}

// faultLockResult is what a waiter goroutine saw.
type faultLockResult struct {
	err   error
	at    time.Time
	fence int64
	wrote bool
	werr  error
	lost  <-chan struct{}
}

// faultLockAndWrite locks m on g (asynchronously), writes to reg with the
// hold's fence, and leaves the hold in place.
func faultLockAndWrite(g *faultGoroutine, ctx context.Context, m *DistMutex, reg *redistest.Register, writer string) (<-chan struct{}, *faultLockResult) {
	r := &faultLockResult{}
	done := g.async(func() {
		r.err = m.LockContext(ctx)
		r.at = time.Now()
		if r.err != nil {
			return
		}
		r.fence = m.Fence()
		r.lost = m.Lost()
		r.wrote, r.werr = reg.Write(context.Background(), r.fence, writer)
	})
	return done, r
}

// faultUnlock unlocks m on g and returns UnlockContext's error.
func faultUnlock(t testing.TB, g *faultGoroutine, m *DistMutex) error {
	t.Helper()
	var err error
	g.do(t, 10*time.Second, "UnlockContext", func() { err = m.UnlockContext(context.Background()) })
	return err
}

// TestFaultHolderKilled: a holder process is SIGKILLed while a waiter in
// another process blocks; the waiter takes over within lease + 1s, with a
// greater fence, and the register shows no overlap.
func TestFaultHolderKilled(t *testing.T) {
	skipShort(t, "a fault suite")
	t.Parallel()
	srv := redistest.Start(t)
	reg := redistest.NewRegister(t)
	name := lockName(t)
	k := keysOf(name)
	direct := rdbAt(t, srv.Addr())

	holder := faultHolderChild(t, srv.Addr(), name, reg, "1")
	holder.Send(t, "lock")
	f1 := faultInt(t, holder.Expect(t, "held", 10*time.Second)[0])
	holder.Send(t, "begin")
	faultExpect(t, "holder's begin", holder.Expect(t, "begin", 5*time.Second), "1")
	holder.Send(t, "end")
	faultExpect(t, "holder's end", holder.Expect(t, "end", 5*time.Second), "1")

	c, errs := clientWithErrors(t, rdbAt(t, srv.Addr()))
	m := c.NewMutex(name, WithLease(faultLease), WithFencing())
	g := newFaultGoroutine(t)
	done, r := faultLockAndWrite(g, testCtx(t, 20*time.Second), m, reg, "waiter")
	faultSubscribed(t, direct, k.channel)
	if isClosed(done) {
		t.Fatalf("the waiter returned while the holder lives: %v", r.err)
	}

	holder.Kill()
	killed := time.Now()
	faultAwait(t, done, faultLease+3*time.Second, "the waiter after the holder's SIGKILL")
	if r.err != nil {
		t.Fatalf("waiter: LockContext: %v", r.err)
	}
	if took := r.at.Sub(killed); took > faultLease+time.Second {
		t.Errorf("waiter acquired %v after the SIGKILL, want at most lease + 1s = %v", took, faultLease+time.Second)
	}
	if r.fence <= f1 {
		t.Errorf("waiter's fence %d, want greater than the dead holder's %d", r.fence, f1)
	}
	if !r.wrote || r.werr != nil {
		t.Errorf("waiter's write: accepted %v, err %v", r.wrote, r.werr)
	}
	if err := faultUnlock(t, g, m); err != nil {
		t.Errorf("waiter: UnlockContext: %v", err)
	}
	accepted, stale := reg.Check(t)
	if len(accepted) != 2 || len(stale) != 0 {
		t.Errorf("register: got %d accepted, %d stale writes (%v %v), want 2 and 0", len(accepted), len(stale), accepted, stale)
	}
	if n := errs.count(ErrLockLost); n != 0 {
		t.Errorf("the waiter's Client reported %d lost holds: %v", n, errs)
	}
}

// TestFaultHolderPaused: a holder process is SIGSTOPped for 3 leases (a GC
// pause) in the middle of a write; a waiter takes the lock and writes; when
// the holder resumes, its write is refused by the register, its Lost closes
// within one renewal interval, UnlockContext reports ErrLockLost and Unlock
// does not panic.
func TestFaultHolderPaused(t *testing.T) {
	skipShort(t, "a fault suite")
	// Serial: Lost must close within a renewal interval (333ms) of the resume.
	srv := redistest.Start(t)
	reg := redistest.NewRegister(t)
	name := lockName(t)
	k := keysOf(name)
	direct := rdbAt(t, srv.Addr())

	holder := faultHolderChild(t, srv.Addr(), name, reg, "1")
	holder.Send(t, "lock")
	f1 := faultInt(t, holder.Expect(t, "held", 10*time.Second)[0])
	holder.Send(t, "lock")
	if got := holder.Expect(t, "held", 5*time.Second); len(got) != 2 || got[1] != "2" {
		t.Fatalf("nested lock: got %v, want count 2", got)
	}
	holder.Send(t, "begin")
	faultExpect(t, "holder's begin", holder.Expect(t, "begin", 5*time.Second), "1")

	holder.Signal(t, syscall.SIGSTOP)
	stopped := time.Now()

	c, errs := clientWithErrors(t, rdbAt(t, srv.Addr()))
	m := c.NewMutex(name, WithLease(faultLease), WithFencing())
	g := newFaultGoroutine(t)
	done, r := faultLockAndWrite(g, testCtx(t, 20*time.Second), m, reg, "waiter")
	faultAwait(t, done, 3*faultLease, "the waiter while the holder is stopped")
	if r.err != nil {
		t.Fatalf("waiter: LockContext: %v", r.err)
	}
	if r.fence <= f1 || !r.wrote || r.werr != nil {
		t.Fatalf("waiter: fence %d (holder's %d), write accepted %v, err %v", r.fence, f1, r.wrote, r.werr)
	}

	time.Sleep(time.Until(stopped.Add(3 * faultLease))) // the pause is the fault
	if holder.Has("lost") {
		t.Fatal("the stopped holder reported a loss while stopped")
	}
	holder.Signal(t, syscall.SIGCONT)
	resumed := time.Now()
	holder.Expect(t, "lost", 5*time.Second)
	if took, interval := time.Since(resumed), faultLease/3; took > interval {
		t.Errorf("Lost closed %v after the holder resumed, want within one renewal interval (%v)", took, interval)
	}

	holder.Send(t, "end")
	faultExpect(t, "the resumed holder's write (must be refused)", holder.Expect(t, "end", 5*time.Second), "0")
	holder.Send(t, "unlockctx")
	faultExpect(t, "UnlockContext of the lost hold", holder.Expect(t, "unlockctx", 5*time.Second), "lost")
	holder.Send(t, "unlock")
	faultExpect(t, "Unlock of the lost hold", holder.Expect(t, "unlock", 5*time.Second), "ok")
	holder.Send(t, "count")
	faultExpect(t, "HoldCount after both Unlocks", holder.Expect(t, "count", 5*time.Second), "0")

	if isClosed(r.lost) {
		t.Error("the waiter's hold was lost")
	}
	if n, err := direct.HLen(context.Background(), k.hash).Result(); err != nil || n != 1 {
		t.Errorf("holders on the server: %d (%v), want 1 (the waiter)", n, err)
	}
	if err := faultUnlock(t, g, m); err != nil {
		t.Errorf("waiter: UnlockContext: %v", err)
	}
	accepted, stale := reg.Check(t)
	if len(accepted) != 1 || len(stale) != 1 || !strings.HasPrefix(stale[0].Writer, "child1.") || stale[0].Fence != f1 {
		t.Errorf("register: accepted %v, stale %v; want the waiter's write accepted and the paused holder's refused", accepted, stale)
	}
	if n := errs.count(ErrLockLost); n != 0 {
		t.Errorf("the waiter's Client reported %d lost holds: %v", n, errs)
	}
}

// TestFaultRenewalBlackholed: the holder's connection stops passing bytes;
// the holder declares its hold lost before the lease ends on the server, and
// a waiter acquires only after that.
func TestFaultRenewalBlackholed(t *testing.T) {
	skipShort(t, "a fault suite")
	// Serial: the loss must be declared within the drift margin (55ms) before the server's expiry.
	const lease = 2 * time.Second
	srv := redistest.Start(t)
	reg := redistest.NewRegister(t)
	name := lockName(t)
	k := keysOf(name)
	direct := rdbAt(t, srv.Addr())
	p := redistest.NewProxy(t, srv.Addr())

	// The moment the holder's Client declares the loss, taken where it
	// does (the hook runs on the goroutine that declares it), not when the
	// test hears of it, which a loaded machine may delay.
	declared := make(chan time.Time, 1)
	onLoss := WithHook(func(e Event) {
		if e.Kind == EventLost {
			select {
			case declared <- time.Now():
			default:
			}
		}
	})
	hc, herrs := clientWithErrors(t, rdbAt(t, p.Addr()), onLoss)
	t.Cleanup(p.Heal) // before hc closes: a blackholed renewal would hold Close up
	hm := hc.NewMutex(name, WithLease(lease), WithFencing())
	hg := newFaultGoroutine(t)
	hdone, h := faultLockAndWrite(hg, testCtx(t, 10*time.Second), hm, reg, "holder")
	faultAwait(t, hdone, 5*time.Second, "holder's lock")
	if h.err != nil || !h.wrote {
		t.Fatalf("holder: LockContext %v, write %v %v", h.err, h.wrote, h.werr)
	}

	wc, _ := clientWithErrors(t, rdbAt(t, srv.Addr()))
	wm := wc.NewMutex(name, WithLease(lease), WithFencing())
	wg := newFaultGoroutine(t)
	wdone, w := faultLockAndWrite(wg, testCtx(t, 20*time.Second), wm, reg, "waiter")
	faultSubscribed(t, direct, k.channel)

	owners, err := direct.HKeys(context.Background(), k.hash).Result()
	if err != nil || len(owners) != 1 {
		t.Fatalf("owners on the server: %q (%v), want the holder alone", owners, err)
	}
	p.SetBlackhole(true)
	blackholed := time.Now()
	// No renewal reaches the server from now on, so the hold's expiry
	// there is fixed: at most a millisecond past the PTTL read's reply plus
	// the PTTL.
	pttl, err := direct.PTTL(context.Background(), k.hash).Result()
	expiry := time.Now().Add(pttl + time.Millisecond)
	if err != nil || pttl <= 0 {
		t.Fatalf("PTTL of the hold once its connection went dark: %v (%v)", pttl, err)
	}
	faultAwait(t, h.lost, lease+time.Second, "the holder's Lost after its connection went dark")
	lostAt := <-declared
	if !lostAt.Before(expiry) {
		t.Errorf("the holder declared the loss %v after the hold expired on the server; want before (the holder must know first)", lostAt.Sub(expiry))
	}
	if took := lostAt.Sub(blackholed); took > lease {
		t.Errorf("loss declared %v after the blackhole began, want within the lease %v", took, lease)
	}

	faultAwait(t, wdone, lease+2*time.Second, "the waiter after expiry")
	if w.err != nil {
		t.Fatalf("waiter: LockContext: %v", w.err)
	}
	if !w.at.After(lostAt) {
		t.Errorf("waiter acquired at %v, before the holder knew of the loss (%v)", w.at, lostAt)
	}
	if w.fence <= h.fence || !w.wrote {
		t.Errorf("waiter: fence %d (holder's %d), write accepted %v (%v)", w.fence, h.fence, w.wrote, w.werr)
	}

	p.Heal()
	if err := faultUnlock(t, hg, hm); !errors.Is(err, ErrLockLost) {
		t.Errorf("holder: UnlockContext after the loss: %v, want ErrLockLost", err)
	}
	herrs.await(t, ErrLockLost, time.Second, "the holder's loss")
	if err := faultUnlock(t, wg, wm); err != nil {
		t.Errorf("waiter: UnlockContext: %v", err)
	}
	if _, stale := reg.Check(t); len(stale) != 0 {
		t.Errorf("stale writes: %v", stale)
	}
}

// TestFaultLateAcquireReply: replies reach the client only after more than
// a lease, so every grant it gets has already expired when it arrives. It
// must not report the lock as held, while another Client takes the lock in
// between.
func TestFaultLateAcquireReply(t *testing.T) {
	skipShort(t, "a fault suite")
	t.Parallel()
	const latency = 2 * faultLease
	srv := redistest.Start(t)
	reg := redistest.NewRegister(t)
	name := lockName(t)
	k := keysOf(name)
	direct := rdbAt(t, srv.Addr())
	p := redistest.NewProxy(t, srv.Addr())

	sc, serrs := clientWithErrors(t, rdbAt(t, p.Addr()))
	t.Cleanup(p.Heal)
	sm := sc.NewMutex(name, WithLease(faultLease), WithFencing())
	sg := newFaultGoroutine(t)
	sg.do(t, 5*time.Second, "warm-up", func() { // loads the scripts and opens a connection
		if sm.TryLock() {
			sm.Unlock()
		}
	})

	p.SetLatency(latency)
	var (
		ok            bool
		tryErr        error
		count         int
		began, answer time.Time
	)
	tdone := sg.async(func() {
		began = time.Now()
		ok, tryErr = sm.TryLockContext(context.Background())
		answer = time.Now()
		count = sm.HoldCount()
	})
	faultEventually(t, faultLease, func() error { // the request reached the server and was granted there
		if n, err := direct.Exists(context.Background(), k.hash).Result(); err != nil || n == 0 {
			return fmt.Errorf("lock key not there: %d %v", n, err)
		}
		return nil
	})

	oc, oerrs := clientWithErrors(t, rdbAt(t, srv.Addr()))
	om := oc.NewMutex(name, WithLease(faultLease), WithFencing())
	og := newFaultGoroutine(t)
	odone, o := faultLockAndWrite(og, testCtx(t, 20*time.Second), om, reg, "other")

	faultAwait(t, tdone, latency+3*time.Second, "TryLockContext with late replies")
	if ok || count != 0 {
		t.Errorf("TryLockContext with a reply %v late: held %v, HoldCount %d (err %v); want not held", latency, ok, count, tryErr)
	}
	if took := answer.Sub(began); took < latency {
		t.Errorf("TryLockContext answered after %v, before the late reply (%v) could arrive", took, latency)
	}
	faultAwait(t, odone, 3*faultLease, "the other Client's lock")
	if o.err != nil || !o.wrote {
		t.Fatalf("other Client: LockContext %v, write %v %v", o.err, o.wrote, o.werr)
	}
	if !o.at.Before(answer) {
		t.Errorf("the other Client acquired at %v, after the late reply (%v): the interleaving was not exercised", o.at, answer)
	}
	// Releasing the late grant must not have touched the other holder.
	if isClosed(o.lost) {
		t.Error("the other Client's hold was lost")
	}
	if n, err := direct.HLen(context.Background(), k.hash).Result(); err != nil || n != 1 {
		t.Errorf("holders on the server: %d (%v), want 1", n, err)
	}
	if err := faultUnlock(t, og, om); err != nil {
		t.Errorf("other Client: UnlockContext: %v", err)
	}

	// Waiting with late replies: every grant is late, so it never holds.
	var lockErr error
	sg.do(t, 5*latency+5*time.Second, "LockContext with late replies", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		lockErr = sm.LockContext(ctx)
		count = sm.HoldCount()
	})
	if !errors.Is(lockErr, context.DeadlineExceeded) || count != 0 {
		t.Errorf("LockContext with late replies: %v, HoldCount %d; want the deadline's error and nothing held", lockErr, count)
	}
	// Whatever the server granted it runs out within a lease: no phantom hold.
	faultEventually(t, 2*faultLease+time.Second, func() error {
		n, err := direct.Exists(context.Background(), k.hash, k.queue).Result()
		if err != nil || n != 0 {
			return fmt.Errorf("%d of the lock's keys remain (%v)", n, err)
		}
		return nil
	})

	p.Heal()
	d, r := faultLockAndWrite(sg, testCtx(t, 10*time.Second), sm, reg, "healed")
	faultAwait(t, d, 5*time.Second, "lock after the latency ended")
	if r.err != nil || !r.wrote {
		t.Errorf("after the latency ended: LockContext %v, write %v %v", r.err, r.wrote, r.werr)
	}
	if err := faultUnlock(t, sg, sm); err != nil {
		t.Errorf("after the latency ended: UnlockContext: %v", err)
	}
	if _, stale := reg.Check(t); len(stale) != 0 {
		t.Errorf("stale writes: %v", stale)
	}
	if n := serrs.count(ErrLockLost) + oerrs.count(ErrLockLost); n != 0 {
		t.Errorf("lost holds reported: %v %v", serrs, oerrs)
	}
}

// TestFaultConnectionReset: the connection breaks after the server applied a
// lock or unlock script and before its reply arrives (the uncontended
// scripts and the full ones); go-redis (or remutex) sends it again. Counts
// must not change twice, no hold may remain, and no loss may be reported.
func TestFaultConnectionReset(t *testing.T) {
	skipShort(t, "a fault suite")
	srv := redistest.Start(t)
	name := lockName(t)
	k := keysOf(name)
	direct := rdbAt(t, srv.Addr())
	p := redistest.NewProxy(t, srv.Addr())
	c, errs := clientWithErrors(t, rdbAt(t, p.Addr()))
	m := c.NewMutex(name, WithLease(faultLease), WithFencing())
	g := newFaultGoroutine(t)
	ctx := context.Background()

	// count is the single owner field's value on the server ("" for none).
	count := func() string {
		t.Helper()
		vals, err := direct.HVals(ctx, k.hash).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(vals) > 1 {
			t.Fatalf("%d owners on the server: %v", len(vals), vals)
		}
		if len(vals) == 0 {
			return ""
		}
		return vals[0]
	}
	counter := func() int64 {
		t.Helper()
		n, err := direct.Get(ctx, k.fence).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	cuts := 0
	step := func(what, script string, f func() error, wantHold int, wantServer string) {
		t.Helper()
		p.CutReplyTo(script)
		var err error
		var hold int
		g.do(t, 10*time.Second, what, func() {
			err = f()
			hold = m.HoldCount()
		})
		cuts++
		if got := p.ReplyCuts(); got != cuts {
			t.Fatalf("%s: %d replies cut, want %d (the fault did not happen)", what, got, cuts)
		}
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
		if hold != wantHold {
			t.Errorf("%s: HoldCount %d, want %d", what, hold, wantHold)
		}
		if got := count(); got != wantServer {
			t.Errorf("%s: count on the server %q, want %q", what, got, wantServer)
		}
	}
	lockCtx := func() error { return m.LockContext(ctx) }
	unlockCtx := func() error { return m.UnlockContext(ctx) }
	lock := func() error { m.Lock(); return nil }
	unlock := func() error { m.Unlock(); return nil }
	acquireSHA, releaseSHA := mutexScripts.acquire.Hash(), mutexScripts.release.Hash()
	// The Context forms go the uncontended way (quick_lock.lua, and HDEL for
	// the final release: a resent quick_lock.lua finds the hash and hands over
	// to acquire.lua, a resent HDEL finds nothing), the others the contended
	// way (acquire.lua, release.lua for a nested release, and for the final
	// one HDEL with wake.lua in the same pipeline, whose replies are cut
	// together).
	calm := func() { m.spec.Quick.Until.Store(0) }
	contended := func() { m.spec.Quick.Until.Store(math.MaxInt64) }

	g.do(t, 5*time.Second, "warm-up", func() { // loads the scripts and seeds the fence counter
		if err := m.LockContext(ctx); err == nil {
			_ = m.UnlockContext(ctx)
		}
	})
	before := counter()
	var fence int64
	var lost <-chan struct{}
	calm()
	step("LockContext", quickLock.Hash(), lockCtx, 1, "1")
	g.do(t, time.Second, "Fence", func() { fence, lost = m.Fence(), m.Lost() })
	if after := counter(); fence != before+1 || after != before+1 {
		t.Errorf("fence %d and counter %d after one acquisition sent twice, want both %d", fence, after, before+1)
	}
	step("nested LockContext", acquireSHA, lockCtx, 2, "2")
	step("UnlockContext 2→1", releaseSHA, unlockCtx, 1, "1")
	calm()
	step("final UnlockContext", "hdel", unlockCtx, 0, "")
	if isClosed(lost) {
		t.Error("Lost closed for a hold that was unlocked normally")
	}
	contended()
	step("Lock", acquireSHA, lock, 1, "1")
	step("nested Lock", acquireSHA, lock, 2, "2")
	step("Unlock 2→1", releaseSHA, unlock, 1, "1")
	step("final Unlock", "hdel", unlock, 0, "")

	if n, err := direct.Exists(ctx, k.hash, k.queue).Result(); err != nil || n != 0 {
		t.Errorf("%d of the lock's keys remain (%v): a phantom hold", n, err)
	}
	oc, _ := clientWithErrors(t, rdbAt(t, srv.Addr()))
	om := oc.NewMutex(name, WithLease(faultLease))
	if ok, err := om.TryLockContext(ctx); !ok || err != nil {
		t.Errorf("another Client's TryLock after the resets: %v %v, want the lock free", ok, err)
	} else if err := om.UnlockContext(ctx); err != nil {
		t.Errorf("another Client's Unlock: %v", err)
	}
	if n := errs.count(ErrLockLost); n != 0 {
		t.Errorf("false losses reported: %v", errs)
	}
}

// faultHoldTwice locks m twice on g (count 2) with a write in between and
// returns the hold's fence and Lost channel.
func faultHoldTwice(t testing.TB, g *faultGoroutine, m *DistMutex, reg *redistest.Register, writer string) (int64, <-chan struct{}) {
	t.Helper()
	d, r := faultLockAndWrite(g, testCtx(t, 10*time.Second), m, reg, writer)
	faultAwait(t, d, 5*time.Second, writer+"'s lock")
	if r.err != nil || !r.wrote {
		t.Fatalf("%s: LockContext %v, write %v %v", writer, r.err, r.wrote, r.werr)
	}
	var err error
	g.do(t, 5*time.Second, writer+"'s nested lock", func() { err = m.LockContext(context.Background()) })
	if err != nil {
		t.Fatalf("%s: nested LockContext: %v", writer, err)
	}
	return r.fence, r.lost
}

// faultUnlockLost unlocks a lost hold of count 2 on g: UnlockContext must
// report ErrLockLost, Unlock must not panic, and nothing must remain held.
func faultUnlockLost(t testing.TB, g *faultGoroutine, m *DistMutex) {
	t.Helper()
	var (
		err   error
		p     interface{}
		count int
	)
	g.do(t, 10*time.Second, "unlock of a lost hold", func() {
		err = m.UnlockContext(context.Background())
		p = faultPanic(m.Unlock)
		count = m.HoldCount()
	})
	if !errors.Is(err, ErrLockLost) {
		t.Errorf("UnlockContext of a lost hold: %v, want ErrLockLost", err)
	}
	if p != nil {
		t.Errorf("Unlock of a lost hold panicked: %v", p)
	}
	if count != 0 {
		t.Errorf("HoldCount after unlocking a lost hold: %d, want 0", count)
	}
}

// TestFaultServerRestarted: redis-server is SIGKILLed and started again,
// empty, while a lock is held. The holder learns of the loss, Unlock reports
// it, a new Client acquires, and fences keep rising.
func TestFaultServerRestarted(t *testing.T) {
	skipShort(t, "a fault suite")
	t.Parallel()
	srv := redistest.Start(t)
	reg := redistest.NewRegister(t)
	name := lockName(t)
	c, errs := clientWithErrors(t, rdbAt(t, srv.Addr()))
	m := c.NewMutex(name, WithLease(faultLease), WithFencing())
	g := newFaultGoroutine(t)
	f1, lost := faultHoldTwice(t, g, m, reg, "holder")

	srv.Restart(t)
	faultAwait(t, lost, faultLease+time.Second, "Lost after the restart")
	errs.await(t, ErrLockLost, time.Second, "the loss after the restart")
	faultUnlockLost(t, g, m)

	nc, _ := clientWithErrors(t, rdbAt(t, srv.Addr()))
	nm := nc.NewMutex(name, WithLease(faultLease), WithFencing())
	ng := newFaultGoroutine(t)
	d, r := faultLockAndWrite(ng, testCtx(t, 10*time.Second), nm, reg, "after-restart")
	faultAwait(t, d, 5*time.Second, "lock after the restart")
	if r.err != nil || !r.wrote {
		t.Fatalf("after the restart: LockContext %v, write %v %v", r.err, r.wrote, r.werr)
	}
	if r.fence <= f1 {
		t.Errorf("fence after the restart %d, want greater than %d", r.fence, f1)
	}
	if err := faultUnlock(t, ng, nm); err != nil {
		t.Errorf("UnlockContext: %v", err)
	}
	if _, stale := reg.Check(t); len(stale) != 0 {
		t.Errorf("stale writes: %v", stale)
	}
}

// TestFaultServerPaused: redis-server is SIGSTOPped for two leases. The
// holder declares its hold lost while the server is stopped; afterwards the
// waiter holds, and it alone.
func TestFaultServerPaused(t *testing.T) {
	skipShort(t, "a fault suite")
	t.Parallel()
	srv := redistest.Start(t)
	reg := redistest.NewRegister(t)
	name := lockName(t)
	k := keysOf(name)
	direct := rdbAt(t, srv.Addr())

	hc, _ := clientWithErrors(t, rdbAt(t, srv.Addr()))
	hm := hc.NewMutex(name, WithLease(faultLease), WithFencing())
	hg := newFaultGoroutine(t)
	f1, lost := faultHoldTwice(t, hg, hm, reg, "holder")

	wc, werrs := clientWithErrors(t, rdbAt(t, srv.Addr()))
	wm := wc.NewMutex(name, WithLease(faultLease), WithFencing())
	wg := newFaultGoroutine(t)
	wdone, w := faultLockAndWrite(wg, testCtx(t, 30*time.Second), wm, reg, "waiter")
	faultSubscribed(t, direct, k.channel)

	srv.Signal(t, syscall.SIGSTOP)
	stopped := time.Now()
	t.Cleanup(func() { srv.Signal(t, syscall.SIGCONT) }) // harmless when running
	faultAwait(t, lost, faultLease+time.Second, "the holder's Lost while the server is stopped")
	time.Sleep(time.Until(stopped.Add(2 * faultLease))) // the pause is the fault
	if isClosed(wdone) {
		t.Fatalf("the waiter returned while the server was stopped: %v", w.err)
	}
	srv.Signal(t, syscall.SIGCONT)

	faultAwait(t, wdone, 3*faultLease+time.Second, "the waiter after the server resumed")
	if w.err != nil || !w.wrote {
		t.Fatalf("waiter: LockContext %v, write %v %v", w.err, w.wrote, w.werr)
	}
	if w.fence <= f1 {
		t.Errorf("waiter's fence %d, want greater than the holder's %d", w.fence, f1)
	}
	faultUnlockLost(t, hg, hm)
	if ok, err := reg.Write(context.Background(), f1, "holder-after"); ok || err != nil {
		t.Errorf("a write with the lost hold's fence: accepted %v (%v), want refused", ok, err)
	}
	if n, err := direct.HLen(context.Background(), k.hash).Result(); err != nil || n != 1 {
		t.Errorf("holders on the server: %d (%v), want 1", n, err)
	}
	if isClosed(w.lost) {
		t.Error("the waiter's hold was lost")
	}
	if err := faultUnlock(t, wg, wm); err != nil {
		t.Errorf("waiter: UnlockContext: %v", err)
	}
	if _, stale := reg.Check(t); len(stale) != 1 || stale[0].Writer != "holder-after" {
		t.Errorf("stale writes: %v, want only the lost holder's", stale)
	}
	if n := werrs.count(ErrLockLost); n != 0 {
		t.Errorf("the waiter's Client reported losses: %v", werrs)
	}
}

// TestFaultScriptFlush: SCRIPT FLUSH between acquire, renewal, nested lock,
// wake-up and release; everything still works (EVALSHA falls back to EVAL).
func TestFaultScriptFlush(t *testing.T) {
	skipShort(t, "a fault suite")
	srv := redistest.Start(t)
	name := lockName(t)
	k := keysOf(name)
	ctx := context.Background()
	direct := rdbAt(t, srv.Addr())
	flush := func() { // and check, in the same transaction, that it took effect
		t.Helper()
		var exists *redis.BoolSliceCmd
		_, err := direct.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.ScriptFlush(ctx)
			exists = p.ScriptExists(ctx, mutexScripts.acquire.Hash(), mutexScripts.release.Hash(), renewScript.Hash())
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range exists.Val() {
			if e {
				t.Fatalf("script %d still loaded after SCRIPT FLUSH", i)
			}
		}
	}
	cmds := newCommandLog()
	rdb := rdbAt(t, srv.Addr())
	rdb.AddHook(cmds)
	c, errs := clientWithErrors(t, rdb)
	m := c.NewMutex(name, WithLease(faultLease), WithFencing())
	g := newFaultGoroutine(t)

	flush()
	var err error
	var lost <-chan struct{}
	g.do(t, 5*time.Second, "LockContext", func() { err = m.LockContext(ctx); lost = m.Lost() })
	if err != nil {
		t.Fatalf("LockContext after SCRIPT FLUSH: %v", err)
	}

	flush()
	flushed := time.Now()
	cmds.await(t, flushed, faultLease, "a renewal after SCRIPT FLUSH", func(c loggedCommand) bool {
		return len(c.args) > 1 && c.args[0] == "eval" && c.args[1] == renewScript.Src && c.err == nil
	})
	if isClosed(lost) {
		t.Fatal("hold lost after a renewal past SCRIPT FLUSH")
	}
	if pttl, err := direct.Do(ctx, "pttl", k.hash).Int64(); err != nil || pttl <= (faultLease*2/3).Milliseconds() {
		t.Errorf("PTTL after the renewal: %d ms (%v), want renewed to about the lease", pttl, err)
	}

	flush()
	g.do(t, 5*time.Second, "nested LockContext", func() { err = m.LockContext(ctx) })
	if err != nil {
		t.Fatalf("nested LockContext after SCRIPT FLUSH: %v", err)
	}
	flush()
	if err := faultUnlock(t, g, m); err != nil {
		t.Fatalf("UnlockContext 2→1 after SCRIPT FLUSH: %v", err)
	}

	wc, werrs := clientWithErrors(t, rdbAt(t, srv.Addr()))
	wm := wc.NewMutex(name, WithLease(faultLease), WithFencing())
	wg := newFaultGoroutine(t)
	reg := redistest.NewRegister(t)
	flush()
	wdone, w := faultLockAndWrite(wg, testCtx(t, 10*time.Second), wm, reg, "waiter")
	faultSubscribed(t, direct, k.channel)
	flush()
	if err := faultUnlock(t, g, m); err != nil {
		t.Fatalf("final UnlockContext after SCRIPT FLUSH: %v", err)
	}
	faultAwait(t, wdone, 2*faultLease, "the waiter after the release")
	if w.err != nil || !w.wrote {
		t.Fatalf("waiter: LockContext %v, write %v %v", w.err, w.wrote, w.werr)
	}
	flush()
	if err := faultUnlock(t, wg, wm); err != nil {
		t.Errorf("waiter: UnlockContext after SCRIPT FLUSH: %v", err)
	}
	if isClosed(lost) {
		t.Error("Lost closed for a hold that was unlocked normally")
	}
	if n, err := direct.Exists(ctx, k.hash, k.queue).Result(); err != nil || n != 0 {
		t.Errorf("%d of the lock's keys remain (%v)", n, err)
	}
	if errs.len()+werrs.len() != 0 {
		t.Errorf("errors reported: %v %v", errs, werrs)
	}
}

// TestFaultEviction: with maxmemory and volatile-lru, filling the memory
// evicts the lock's key; the holder learns of the loss. With the memory still
// full, acquiring meets OOM, which comes back as an error at once.
func TestFaultEviction(t *testing.T) {
	skipShort(t, "a fault suite")
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru")
	name := lockName(t)
	k := keysOf(name)
	ctx := context.Background()
	direct := rdbAt(t, srv.Addr())
	c, errs := clientWithErrors(t, rdbAt(t, srv.Addr()))
	m := c.NewMutex(name, WithLease(faultLease), WithFencing())
	g := newFaultGoroutine(t)
	reg := redistest.NewRegister(t)
	f1, lost := faultHoldTwice(t, g, m, reg, "holder")

	// Keys without a TTL can't be evicted under volatile-lru: the lock's hash,
	// which has one, goes first, then writes fail with OOM.
	big := strings.Repeat("x", 64<<10)
	for i := 0; ; i++ {
		err := direct.Set(ctx, "filler:"+strconv.Itoa(i), big, 0).Err()
		if err != nil {
			if !strings.HasPrefix(err.Error(), "OOM") {
				t.Fatalf("filling the memory: %v", err)
			}
			break
		}
		if i > 1000 {
			t.Fatal("no OOM after 64 MiB with maxmemory 4mb")
		}
	}
	if n, err := direct.Exists(ctx, k.hash).Result(); err != nil || n != 0 {
		t.Fatalf("the lock's key was not evicted: exists %d (%v)", n, err)
	}
	faultAwait(t, lost, faultLease+time.Second, "Lost after the lock's key was evicted")
	errs.await(t, ErrLockLost, time.Second, "the loss after the eviction")
	faultUnlockLost(t, g, m)

	// Keep the server over its limit, with nothing left to evict.
	used, err := direct.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	var usedBytes int64
	for _, l := range strings.Split(used, "\r\n") {
		if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
			usedBytes, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if err := direct.ConfigSet(ctx, "maxmemory", strconv.FormatInt(usedBytes/2, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	nc, _ := clientWithErrors(t, rdbAt(t, srv.Addr()))
	nm := nc.NewMutex(name, WithLease(faultLease), WithFencing())
	ng := newFaultGoroutine(t)
	var (
		lockErr, tryErr error
		tryOK           bool
		took            time.Duration
		count           int
		p               interface{}
	)
	ng.do(t, 10*time.Second, "locking with the memory full", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		lockErr = nm.LockContext(ctx)
		took = time.Since(start)
		tryOK, tryErr = nm.TryLockContext(ctx)
		p = faultPanic(nm.Lock)
		count = nm.HoldCount()
	})
	if lockErr == nil || !strings.Contains(lockErr.Error(), "OOM") || errors.Is(lockErr, context.DeadlineExceeded) {
		t.Errorf("LockContext with the memory full: %v, want the OOM error", lockErr)
	}
	if took > 2*time.Second {
		t.Errorf("LockContext took %v to report OOM, want it at once", took)
	}
	if tryOK || tryErr == nil || !strings.Contains(tryErr.Error(), "OOM") {
		t.Errorf("TryLockContext with the memory full: %v %v, want false and the OOM error", tryOK, tryErr)
	}
	if s := fmt.Sprint(p); !strings.HasPrefix(s, "remutex: ") || !strings.Contains(s, "OOM") {
		t.Errorf("Lock with the memory full panicked with %v, want a remutex: panic naming OOM", p)
	}
	if count != 0 {
		t.Errorf("HoldCount after the OOM errors: %d, want 0", count)
	}
	if n, err := direct.Exists(ctx, k.hash).Result(); err != nil || n != 0 {
		t.Errorf("the failed acquisitions left the lock's key (%d, %v)", n, err)
	}

	if err := direct.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	d, r := faultLockAndWrite(ng, testCtx(t, 10*time.Second), nm, reg, "after")
	faultAwait(t, d, 5*time.Second, "lock once memory is available")
	if r.err != nil || !r.wrote || r.fence <= f1 {
		t.Errorf("once memory is available: LockContext %v, fence %d (before %d), write %v %v", r.err, r.fence, f1, r.wrote, r.werr)
	}
	if err := faultUnlock(t, ng, nm); err != nil {
		t.Errorf("UnlockContext: %v", err)
	}
}

// TestFaultACL: a user who may not run scripts gets a prompt, clear error
// (Lock panics with it); users who may not subscribe, or may not use the
// lock's channel at all, still lock and wake through polling.
func TestFaultACL(t *testing.T) {
	skipShort(t, "a fault suite")
	srv := redistest.Start(t)
	ctx := context.Background()
	direct := rdbAt(t, srv.Addr())
	user := func(t *testing.T, name string, rules ...interface{}) *redis.Options {
		t.Helper()
		args := append([]interface{}{"acl", "setuser", name, "reset", "on", ">pw", "~*"}, knownRules(t, direct, rules...)...)
		if err := direct.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		return &redis.Options{Addr: srv.Addr(), Username: name, Password: "pw"}
	}

	t.Run("no-eval", func(t *testing.T) {
		opt := user(t, "noeval", "&*", "+@all", "-eval", "-evalsha", "-eval_ro", "-evalsha_ro")
		c, _ := clientWithErrors(t, newRDB(t, opt))
		m := c.NewMutex(lockName(t), WithLease(faultLease))
		g := newFaultGoroutine(t)
		var (
			lockErr, tryErr error
			took            time.Duration
			p               interface{}
		)
		g.do(t, 10*time.Second, "locking without EVAL", func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			lockErr = m.LockContext(ctx)
			took = time.Since(start)
			_, tryErr = m.TryLockContext(ctx)
			p = faultPanic(m.Lock)
		})
		if lockErr == nil || !strings.Contains(lockErr.Error(), "NOPERM") || errors.Is(lockErr, context.DeadlineExceeded) {
			t.Errorf("LockContext without EVAL: %v, want the NOPERM error", lockErr)
		}
		if took > time.Second {
			t.Errorf("LockContext without EVAL took %v, want a prompt error", took)
		}
		if tryErr == nil || !strings.Contains(tryErr.Error(), "NOPERM") {
			t.Errorf("TryLockContext without EVAL: %v, want the NOPERM error", tryErr)
		}
		if s := fmt.Sprint(p); !strings.HasPrefix(s, "remutex: ") || !strings.Contains(s, "NOPERM") {
			t.Errorf("Lock without EVAL panicked with %v, want a remutex: panic with the NOPERM text", p)
		}
		if n, err := direct.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Errorf("keys written without EVAL: %d (%v)", n, err)
		}
	})

	polling := []struct {
		name  string
		rules []interface{}
	}{
		{"no-subscribe", []interface{}{"&*", "+@all", "-subscribe", "-psubscribe", "-ssubscribe"}},
		{"no-channels", []interface{}{"resetchannels", "+@all"}},
	}
	for _, tc := range polling {
		t.Run(tc.name, func(t *testing.T) {
			opt := user(t, strings.ReplaceAll(tc.name, "-", ""), tc.rules...)
			name := lockName(t)
			k := keysOf(name)
			var logs faultLogBuffer
			hc, herrs := clientWithErrors(t, newRDB(t, opt))
			wc, werrs := clientWithErrors(t, newRDB(t, opt), WithLogger(logs.logger()))
			hm := hc.NewMutex(name, WithLease(faultLease), WithFencing())
			wm := wc.NewMutex(name, WithLease(faultLease), WithFencing())
			hg, wg := newFaultGoroutine(t), newFaultGoroutine(t)
			reg := redistest.NewRegister(t)
			for round := 0; round < 2; round++ {
				d, h := faultLockAndWrite(hg, testCtx(t, 10*time.Second), hm, reg, "holder")
				faultAwait(t, d, 5*time.Second, "holder's lock")
				if h.err != nil || !h.wrote {
					t.Fatalf("round %d: holder: LockContext %v, write %v %v", round, h.err, h.wrote, h.werr)
				}
				wdone, w := faultLockAndWrite(wg, testCtx(t, 10*time.Second), wm, reg, "waiter")
				faultEventually(t, 5*time.Second, func() error { // the waiter queued up
					if n, err := direct.Exists(ctx, k.queue).Result(); err != nil || n == 0 {
						return fmt.Errorf("no queue entry (%v)", err)
					}
					return nil
				})
				if err := faultUnlock(t, hg, hm); err != nil {
					t.Errorf("round %d: holder: UnlockContext: %v", round, err)
				}
				faultAwait(t, wdone, 2*faultLease, "the polling waiter")
				if w.err != nil || !w.wrote {
					t.Fatalf("round %d: waiter: LockContext %v, write %v %v", round, w.err, w.wrote, w.werr)
				}
				if err := faultUnlock(t, wg, wm); err != nil {
					t.Errorf("round %d: waiter: UnlockContext: %v", round, err)
				}
			}
			if n := strings.Count(logs.String(), "SUBSCRIBE denied"); n != 1 {
				t.Errorf("the fallback to polling was logged %d times, want once; log:\n%s", n, logs.String())
			}
			if _, stale := reg.Check(t); len(stale) != 0 {
				t.Errorf("stale writes: %v", stale)
			}
			if herrs.count(ErrLockLost)+werrs.count(ErrLockLost) != 0 {
				t.Errorf("losses reported: %v %v", herrs, werrs)
			}
		})
	}
}

// TestFaultCancelWhileWaiting: waits cancelled a few milliseconds after the
// call leave nothing behind: no hold, no renewal, no queue entry, no grant
// that would block the lock, and no subscription once it lingered out.
func TestFaultCancelWhileWaiting(t *testing.T) {
	skipShort(t, "a fault suite")
	t.Parallel()
	srv := redistest.Start(t)
	name := lockName(t)
	k := keysOf(name)
	ctx := context.Background()
	direct := rdbAt(t, srv.Addr())

	hc, _ := clientWithErrors(t, rdbAt(t, srv.Addr()))
	hm := hc.NewMutex(name, WithLease(faultLease), WithFencing())
	hg := newFaultGoroutine(t)
	var err error
	hg.do(t, 5*time.Second, "holder's lock", func() { err = hm.LockContext(ctx) })
	if err != nil {
		t.Fatal(err)
	}

	cmds := newCommandLog()
	wrdb := rdbAt(t, srv.Addr())
	wrdb.AddHook(cmds)
	wc, werrs := clientWithErrors(t, wrdb)
	wm := wc.NewMutex(name, WithLease(faultLease), WithFencing())
	wg := newFaultGoroutine(t)
	for i, delay := range []time.Duration{5, 5, 5, 5, 5, 1, 2, 3, 8, 13, 30, 100, 300} {
		delay *= time.Millisecond
		var count int
		wg.do(t, 5*time.Second, "a cancelled LockContext", func() {
			ctx, cancel := context.WithCancel(context.Background())
			stop := time.AfterFunc(delay, cancel)
			err = wm.LockContext(ctx)
			stop.Stop()
			cancel()
			count = wm.HoldCount()
		})
		if !errors.Is(err, context.Canceled) || count != 0 {
			t.Fatalf("wait %d cancelled after %v: %v, HoldCount %d; want context.Canceled and nothing held", i, delay, err, count)
		}
	}
	// Each wait left the queue by a call that follows it in the background:
	// nothing is sent once they are through.
	awaitIdle(t, wc)
	returned := time.Now()
	if n, err := direct.Exists(ctx, k.queue).Result(); err != nil || n != 0 {
		t.Errorf("queue keys left by the cancelled waits: %d (%v)", n, err)
	}
	// The holder releases: a grant to a waiter that gave up would hold the lock now.
	if err := faultUnlock(t, hg, hm); err != nil {
		t.Fatalf("holder: UnlockContext: %v", err)
	}
	if n, err := direct.Exists(ctx, k.hash, k.queue).Result(); err != nil || n != 0 {
		t.Errorf("right after the release: %d of the lock's keys remain (%v)", n, err)
	}
	faultEventually(t, 2*time.Second, func() error {
		n, err := subscribers(direct, k.channel)
		if err != nil || n != 0 {
			return fmt.Errorf("subscribers of %s* = %d (%v), want 0", k.channel, n, err)
		}
		return nil
	})

	time.Sleep(time.Until(returned.Add(3 * faultLease))) // a leaked grant or renewal would show now
	if n, err := direct.Exists(ctx, k.hash, k.queue).Result(); err != nil || n != 0 {
		t.Errorf("after 3 leases: %d of the lock's keys exist (%v)", n, err)
	}
	for _, c := range cmds.since(returned) {
		t.Errorf("the Client whose waits were cancelled sent %v afterwards", c.args)
	}
	var count int
	wg.do(t, time.Second, "HoldCount", func() { count = wm.HoldCount() })
	if count != 0 {
		t.Errorf("HoldCount: %d, want 0", count)
	}
	if n, err := subscribers(direct, k.channel); err != nil || n != 0 {
		t.Errorf("subscribers of %s* = %d (%v), want 0", k.channel, n, err)
	}
	if n := werrs.count(ErrLockLost); n != 0 {
		t.Errorf("losses reported: %v", werrs)
	}
}

// TestFaultNoStarvation: a hog goroutine that locks again every 10 ms does
// not starve another Client's waiter, which gets 10 acquisitions within 30s.
func TestFaultNoStarvation(t *testing.T) {
	skipShort(t, "a fault suite")
	srv := redistest.Start(t)
	reg := redistest.NewRegister(t)
	name := lockName(t)

	hc, herrs := clientWithErrors(t, rdbAt(t, srv.Addr()))
	hm := hc.NewMutex(name, WithLease(faultLease), WithFencing())
	stop := make(chan struct{})
	hogDone := make(chan error, 1)
	var hogHolds int
	go func() {
		hogDone <- func() error {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return nil
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := hm.LockContext(ctx)
				cancel()
				if err != nil {
					return fmt.Errorf("hog: LockContext: %w", err)
				}
				hogHolds++
				ok, err := reg.Begin(context.Background(), hm.Fence(), "hog."+strconv.Itoa(i))
				time.Sleep(10 * time.Millisecond) // the hog's critical section
				ok2, err2 := reg.End(context.Background(), hm.Fence(), "hog."+strconv.Itoa(i))
				if err := errors.Join(err, err2, hm.UnlockContext(context.Background())); err != nil || !ok || !ok2 {
					return fmt.Errorf("hog: write %v %v, unlock: %v", ok, ok2, err)
				}
			}
		}()
	}()
	hogStopped := false
	stopHog := func() {
		if !hogStopped {
			hogStopped = true
			close(stop)
			if err := <-hogDone; err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(stopHog)

	wc, werrs := clientWithErrors(t, rdbAt(t, srv.Addr()))
	wm := wc.NewMutex(name, WithLease(faultLease), WithFencing())
	wg := newFaultGoroutine(t)
	ctx := testCtx(t, 30*time.Second)
	start := time.Now()
	for i := 0; i < 10; i++ {
		d, r := faultLockAndWrite(wg, ctx, wm, reg, "waiter."+strconv.Itoa(i))
		faultAwait(t, d, 31*time.Second, "the waiter's acquisition "+strconv.Itoa(i))
		if r.err != nil {
			t.Fatalf("acquisition %d after %v: %v", i, time.Since(start), r.err)
		}
		if !r.wrote {
			t.Errorf("waiter's write %d refused (%v)", i, r.werr)
		}
		if err := faultUnlock(t, wg, wm); err != nil {
			t.Errorf("waiter: UnlockContext %d: %v", i, err)
		}
	}
	t.Logf("10 acquisitions against the hog in %v", time.Since(start))
	stopHog()
	if hogHolds == 0 {
		t.Error("the hog never held the lock: there was no contention")
	}
	if _, stale := reg.Check(t); len(stale) != 0 {
		t.Errorf("stale writes: %v", stale)
	}
	if herrs.count(ErrLockLost)+werrs.count(ErrLockLost) != 0 {
		t.Errorf("losses reported: %v %v", herrs, werrs)
	}
}

// TestFaultSoak: several child processes with several goroutines each lock,
// write to the register and unlock, while holders are SIGKILLed at random.
// The register must show no overlap and strictly rising fences, no live
// process may lose a hold, and every write a live process reported is there.
// REMUTEX_SOAK sets the duration (default 15s).
func TestFaultSoak(t *testing.T) {
	t.Parallel() // its own servers; it waits on them (see TestMain)
	skipShort(t, "a soak")
	duration := 15 * time.Second
	if s := os.Getenv("REMUTEX_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("REMUTEX_SOAK=%q: %v", s, err)
		}
		duration = d
	}
	const children, goroutines = 3, 3
	srv := redistest.Start(t)
	reg := redistest.NewRegister(t)
	name := lockName(t)

	var all []*redistest.Child
	spawn := func(id int) *redistest.Child {
		c := startChild(t, childConfig{
			Role: "soak", Addr: srv.Addr(), Name: name, Lease: faultLease,
			Register: reg.Addr(), RegisterKey: reg.Key(), ID: strconv.Itoa(id), Goroutines: goroutines,
		})
		c.Expect(t, "ready", 20*time.Second)
		all = append(all, c)
		return c
	}
	live := make([]*redistest.Child, children)
	for i := range live {
		live[i] = spawn(i)
	}
	next := children
	kills := 0
	end := time.Now().Add(duration)
	for time.Now().Before(end) {
		time.Sleep(500*time.Millisecond + rand.N(time.Second)) // the random kill schedule
		i := rand.N(len(live))
		victim := live[i]
		victim.Drop("h")
		victim.Expect(t, "h", 10*time.Second) // it just took the lock: kill it inside
		victim.Kill()
		kills++
		live[i] = spawn(next)
		next++
	}
	for _, c := range live {
		c.Send(t, "stop")
	}
	for _, c := range live {
		c.Expect(t, "done", 30*time.Second)
	}

	reported := 0
	for _, c := range all {
		for c.Has("bad") {
			f, _ := c.Take("bad")
			t.Errorf("child %s: %v", c.ID(), f)
		}
		for c.Has("w") {
			c.Take("w")
			reported++
		}
	}
	accepted, stale := reg.Check(t)
	if len(stale) != 0 {
		t.Errorf("%d stale writes: %v", len(stale), stale)
	}
	if len(accepted) < reported || len(accepted) > reported+kills {
		t.Errorf("register holds %d writes; children reported %d and %d were killed", len(accepted), reported, kills)
	}
	if reported < 20 || kills == 0 {
		t.Errorf("only %d holds and %d kills in %v: the soak did not exercise anything", reported, kills, duration)
	}
	t.Logf("%v: %d holds written, %d holders killed, %d processes", duration, reported, kills, len(all))
}

// TestFaultFenceAfterFailedUnlock: a final Unlock that cannot reach Redis
// leaves the hold's field there until its lease ends. The same goroutine's
// next Lock must not continue that hold as if its own call had been resent:
// its fencing token would repeat. It releases the leftover first, and gets a
// new token.
func TestFaultFenceAfterFailedUnlock(t *testing.T) {
	skipShort(t, "a fault suite")
	srv := redistest.Shared(t)
	p := redistest.NewProxy(t, srv.Addr())
	c := clientOn(t, newRDB(t, &redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1}))
	t.Cleanup(p.Heal)
	m := c.NewMutex(lockName(t), WithFencing())
	g := newFaultGoroutine(t)
	var first, second int64
	var unlockErr, lockErr error
	g.do(t, hangGuard, "Lock", func() {
		m.Lock()
		first = m.Fence()
	})
	p.SetBlackhole(true)
	g.do(t, hangGuard, "UnlockContext", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		unlockErr = m.UnlockContext(ctx)
	})
	if unlockErr == nil {
		t.Fatal("UnlockContext through a blackhole: got nil, want an error")
	}
	if n, err := rdbAt(t, srv.Addr()).HLen(context.Background(), keysOf(m.Name()).hash).Result(); err != nil || n != 1 {
		t.Fatalf("fields of the hash after the failed Unlock: %d (%v), want the hold's, left there", n, err)
	}
	p.Heal()
	g.do(t, hangGuard, "LockContext", func() {
		lockErr = m.LockContext(testCtx(t, hangGuard))
		second = m.Fence()
	})
	if lockErr != nil {
		t.Fatalf("LockContext after the failed Unlock: %v", lockErr)
	}
	if second <= first {
		t.Errorf("fencing token of the next hold: %d, want more than the first hold's %d", second, first)
	}
	g.do(t, hangGuard, "Unlock", m.Unlock)
}
