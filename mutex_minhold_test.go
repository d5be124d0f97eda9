package remutex

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// Tests of WithMinHold: a released hold keeps the lock taken until its
// minimum hold has passed since it was acquired (scheduled jobs: once per
// tick across a fleet whose clocks and schedulers differ).

// ageHold makes the calling goroutine's hold of m look acquired d ago, so
// that a test need not wait for a minimum hold to pass.
func ageHold(t *testing.T, m *DistMutex, d time.Duration) {
	t.Helper()
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	h := m.liveLocked(m.gid())
	if h == nil {
		t.Fatal("ageHold: the goroutine holds nothing")
	}
	h.acquired = h.acquired.Add(-d)
}

// TestMinHoldKeepsTheLock: Unlock ends the hold (HoldCount 0), but the key
// stays, held by nobody, for the rest of the minimum hold: others find the
// lock taken, Inspect shows it kept with the time left, and then the next
// acquisition gets it with a greater fencing token.
func TestMinHoldKeepsTheLock(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		const minHold = 400 * time.Millisecond
		c, errs := clientWithErrors(t, b.rdb(t))
		m := c.NewMutex(name, WithMinHold(minHold), WithFencing())
		other := b.client(t).NewMutex(name, WithFencing())
		ctx := testCtx(t, hangGuard)
		m.Lock()
		m.Lock()
		f1 := m.Fence()
		m.Unlock()
		m.Unlock()
		if got := m.HoldCount(); got != 0 {
			t.Errorf("HoldCount after the final Unlock: got %d, want 0", got)
		}
		if other.TryLock() {
			t.Fatalf("TryLock of another Client during the minimum hold: got true, want false")
		}
		if m.TryLock() {
			t.Fatalf("TryLock of the releasing goroutine during the minimum hold: got true, want false")
		}
		info, err := c.Inspect(ctx, name)
		if err != nil || len(info.Holders) != 1 || !info.Holders[0].Kept || info.Holders[0].TTL <= 0 || info.Holders[0].TTL > minHold {
			t.Errorf("Inspect during the minimum hold: got %+v (%v), want one holder, Kept, TTL in (0, %v]", info.Holders, err, minHold)
		}
		b.fastForward(minHold)
		waitFor(t, "the minimum hold to end", func() bool { return b.rdb(t).Exists(ctx, m.spec.hash()).Val() == 0 })
		if err := other.LockContext(ctx); err != nil {
			t.Fatalf("LockContext after the minimum hold: %v", err)
		}
		if f2 := other.Fence(); f2 <= f1 {
			t.Errorf("fencing token after the minimum hold: got %d, want more than %d", f2, f1)
		}
		_ = other.UnlockContext(ctx)
		if n := errs.len(); n != 0 {
			t.Errorf("errors reported: %v", errs)
		}
	})
}

// TestMinHoldPassed: a hold released after its minimum hold frees the lock
// at once (the uncontended release, no key kept).
func TestMinHoldPassed(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		m := b.client(t).NewMutex(name, WithMinHold(time.Second))
		m.Lock()
		ageHold(t, m, time.Second)
		m.Unlock()
		if n := b.rdb(t).Exists(context.Background(), m.spec.hash()).Val(); n != 0 {
			t.Errorf("the key after a hold longer than its minimum hold was released: EXISTS %d, want 0", n)
		}
		if !b.client(t).NewMutex(name).TryLock() {
			t.Errorf("TryLock right after: got false, want true")
		}
	})
}

// TestMinHoldForceUnlockAndLoss: ForceUnlock releases a lock kept by a
// minimum hold, and so does deleting its key; neither is a loss to the
// goroutine, whose hold had ended.
func TestMinHoldForceUnlockAndLoss(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		c, errs := clientWithErrors(t, b.rdb(t))
		m := c.NewMutex(name, WithMinHold(time.Hour))
		ctx := testCtx(t, hangGuard)
		m.Lock()
		m.Unlock()
		if released, err := c.ForceUnlock(ctx, name); !released || err != nil {
			t.Errorf("ForceUnlock of a kept lock: got (%v, %v), want (true, nil)", released, err)
		}
		if !b.client(t).NewMutex(name).TryLock() {
			t.Fatalf("TryLock after ForceUnlock of a kept lock: got false, want true")
		}
		m2 := b.client(t).NewMutex(name+"-2", WithMinHold(time.Hour))
		m2.Lock()
		m2.Unlock()
		if err := b.rdb(t).Del(ctx, m2.spec.hash()).Err(); err != nil {
			t.Fatal(err)
		}
		if !b.client(t).NewMutex(name + "-2").TryLock() {
			t.Errorf("TryLock after the kept key was deleted: got false, want true")
		}
		if n := errs.len(); n != 0 {
			t.Errorf("errors reported: %v", errs)
		}
	})
}

// TestMinHoldOptions: WithMinHold is checked at construction.
func TestMinHoldOptions(t *testing.T) {
	c := clientOn(t, rdbAt(t, "127.0.0.1:1"))
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"above a fixed lease", func() { c.NewMutex("x", WithMinHold(2*time.Second), WithLease(time.Second), WithoutRenewal()) }},
		{"below MinLease", func() { c.NewMutex("x", WithMinHold(time.Millisecond)) }},
		{"on a DistRWMutex", func() { c.NewRWMutex("x", WithMinHold(time.Second)) }},
	} {
		if v := faultPanic(tc.f); v == nil {
			t.Errorf("WithMinHold %s: no panic", tc.name)
		}
	}
	c.NewMutex("x", WithMinHold(time.Second), WithLease(time.Second), WithoutRenewal()) // at least = at most
}

// TestMinHoldOncePerTick runs the same job on three Clients whose ticks
// are 0, 50 and 100ms apart, each trying the lock at its tick (TryLock, as
// a cron job would): with a minimum hold longer than the skew and shorter
// than the tick, the job runs exactly once per tick. The last tick's
// runner then dies mid-job (it never unlocks, its fixed lease of 600ms is
// the "at most"): the next tick after that bound runs the job again.
func TestMinHoldOncePerTick(t *testing.T) {
	// Serial: its runners' TryLocks must each land within their tick.
	// Ticks of real time: a real server, whose keys expire in it.
	b := &testBackend{name: "redis-server", srv: redistest.Shared(t)}
	b.addr = b.srv.Addr()
	const tick, minHold, maxHold, ticks = time.Second, 400 * time.Millisecond, 600 * time.Millisecond, 3
	skews := []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond}
	name := lockName(t)
	var runs [ticks + 1]atomic.Int32
	var crashed atomic.Bool
	start := time.Now().Add(50 * time.Millisecond)
	var wg sync.WaitGroup
	errc := make(chan error, len(skews))
	for i, skew := range skews {
		m := b.client(t).NewMutex(name, WithMinHold(minHold), WithLease(maxHold), WithoutRenewal())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range ticks + 1 {
				time.Sleep(time.Until(start.Add(time.Duration(k)*tick + skew)))
				if !m.TryLock() {
					continue
				}
				runs[k].Add(1)
				time.Sleep(5 * time.Millisecond) // the job
				if k == ticks-1 && crashed.CompareAndSwap(false, true) {
					continue // dies mid-job: never unlocks
				}
				if err := m.UnlockContext(context.Background()); err != nil {
					errc <- fmt.Errorf("runner %d, tick %d: %w", i, k, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if !errors.Is(err, ErrLockLost) {
			t.Error(err)
		}
	}
	for k := range ticks + 1 {
		if n := runs[k].Load(); n != 1 {
			t.Errorf("tick %d: the job ran %d times, want once", k, n)
		}
	}
}
