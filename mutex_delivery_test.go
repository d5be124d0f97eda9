package remutex

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// Tests of delayed delivery: a call cut off by its context is undone by a
// posted release or leave, sent again until one copy is answered. A copy
// written to a connection that go-redis gave up on (its read timeout) is
// still on its way, and arrives after the goroutine's next Lock was
// granted. No call of an earlier acquisition, however late it arrives, may
// change a later one: the goroutine's new hold stays in Redis, and nobody
// else gets the lock.

// lateDelay is how long the proxy holds the first copy of an undo: long
// past go-redis's read timeout (deliveryReadTimeout), so that it is sent
// again and answered on another connection, and the goroutine locks again,
// before the held copy arrives.
const lateDelay = 2 * time.Second

// deliveryReadTimeout is go-redis's ReadTimeout here: it gives up on a
// stalled connection quickly, and sends the call again on a new one.
const deliveryReadTimeout = 100 * time.Millisecond

// cutOffAfter is the deadline of a call that is cut off: it ends while Redis's
// reply is on its way.
const cutOffAfter = 50 * time.Millisecond

// deliveryRig is a mutex whose Client reaches Redis through a FaultProxy,
// the goroutine that owns its holds, the same lock on another Client
// straight on Redis, and a client that reads Redis.
type deliveryRig struct {
	p     *redistest.FaultProxy
	m     *DistMutex
	g     *faultGoroutine
	other *DistMutex
	check *redis.Client
	hash  string
}

func newDeliveryRig(t *testing.T, b *testBackend) *deliveryRig {
	t.Helper()
	return newDeliveryRigWith(t, b, func(*redis.Options) {})
}

// newDeliveryRigWith is newDeliveryRig with go-redis options changed by opt.
func newDeliveryRigWith(t *testing.T, b *testBackend, opt func(*redis.Options)) *deliveryRig {
	t.Helper()
	p := redistest.NewFaultProxy(t, b.addr)
	o := &redis.Options{Addr: p.Addr(), ReadTimeout: deliveryReadTimeout}
	opt(o)
	rdb := newRDB(t, o)
	name := lockName(t)
	r := &deliveryRig{p: p, m: clientOn(t, rdb).NewMutex(name), g: newFaultGoroutine(t),
		other: b.client(t).NewMutex(name), check: rdbAt(t, b.addr)}
	r.hash = r.m.spec.hash()
	// Every script is on the server, so that each call is one EVALSHA,
	// whose SHA1 the faults match.
	for _, s := range []*luaScript{quickLock, wakeScript, mutexScripts.acquire, mutexScripts.release, mutexScripts.leave} {
		if err := r.check.ScriptLoad(testCtx(t, hangGuard), s.Src.(string)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	r.g.do(t, hangGuard, "warm-up", func() { r.m.Lock(); r.m.Unlock() })
	return r
}

// holdUndo holds the first copy of the undo (a call of script on the lock)
// for lateDelay.
func (r *deliveryRig) holdUndo(script *luaScript) *redistest.Fault {
	return r.p.Delay(redistest.Match{Args: []string{script.Hash(), r.hash}, Times: 1}, lateDelay)
}

// dropNextReply cuts off the next call on the lock: Redis applies it, and
// its reply never comes.
func (r *deliveryRig) dropNextReply() *redistest.Fault {
	return r.p.DropReply(redistest.Match{Args: []string{r.hash}, Times: 1})
}

// lockAgain locks on the goroutine again, once the undo's first copy is
// held, and returns the new hold's Lost channel. The held copy must still
// be on its way when the Lock returns.
func (r *deliveryRig) lockAgain(t *testing.T, late *redistest.Fault) <-chan struct{} {
	t.Helper()
	faultAwait(t, late.Matched(1), hangGuard, "the undo's first copy held")
	var lost <-chan struct{}
	r.g.do(t, hangGuard, "Lock after the cut-off call", func() {
		r.m.Lock()
		lost = r.m.Lost()
	})
	if isClosed(late.Done(1)) {
		t.Fatalf("the undo's held copy arrived before the next Lock returned (held %v): the interleaving was not exercised", lateDelay)
	}
	return lost
}

// checkIntact waits for the held copy of the undo to be answered by Redis,
// then checks that the goroutine's hold is intact, and ends it.
func (r *deliveryRig) checkIntact(t *testing.T, late *redistest.Fault, lost <-chan struct{}) {
	t.Helper()
	faultAwait(t, late.Done(1), hangGuard, "the undo's held copy answered by Redis")
	ctx := testCtx(t, hangGuard)
	if n, err := r.check.HLen(ctx, r.hash).Result(); err != nil || n != 1 {
		t.Errorf("fields of the lock's hash after the late copy arrived: got (%d, %v), want (1, nil): the goroutine's hold", n, err)
	}
	var count int
	r.g.do(t, hangGuard, "HoldCount", func() { count = r.m.HoldCount() })
	if count != 1 {
		t.Errorf("HoldCount: got %d, want 1", count)
	}
	if isClosed(lost) {
		t.Error("Lost closed after the late copy arrived, want the hold intact")
	}
	if r.other.TryLock() {
		t.Error("another Client's TryLock after the late copy arrived: got true, want false: two holders")
		r.other.Unlock()
	}
	var err error
	r.g.do(t, hangGuard, "UnlockContext", func() { err = r.m.UnlockContext(ctx) })
	if err != nil {
		t.Errorf("UnlockContext of the intact hold: got %v, want nil", err)
	}
}

// TestLateUndoOfTryLockContext: a TryLockContext is cut off (Redis granted
// it, the reply is dropped); the release posted to undo it is held on its
// connection, sent again on another and answered. The goroutine locks
// again; then the held release arrives.
func TestLateUndoOfTryLockContext(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		r := newDeliveryRig(t, b)
		late := r.holdUndo(mutexScripts.release)
		cut := r.dropNextReply()
		var ok bool
		var err error
		r.g.do(t, hangGuard, "TryLockContext cut off", func() {
			ctx, cancel := context.WithTimeout(context.Background(), cutOffAfter)
			defer cancel()
			ok, err = r.m.TryLockContext(ctx)
		})
		if ok || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryLockContext whose reply was dropped: got (%v, %v), want (false, DeadlineExceeded)", ok, err)
		}
		faultAwait(t, cut.Done(1), hangGuard, "the acquisition applied, its reply dropped")
		lost := r.lockAgain(t, late)
		r.checkIntact(t, late, lost)
	})
}

// TestLateUndoOfLockContext: a LockContext waits in the queue while
// another Client holds the lock, and its context ends; the leave posted
// to undo it is held on its connection, sent again on another and
// answered. The other Client unlocks, the goroutine locks again; then the
// held leave arrives.
func TestLateUndoOfLockContext(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		r := newDeliveryRig(t, b)
		og := newFaultGoroutine(t)
		og.do(t, hangGuard, "the other Client's Lock", r.other.Lock)
		late := r.holdUndo(mutexScripts.leave)
		var err error
		r.g.do(t, hangGuard, "LockContext cut off while waiting", func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err = r.m.LockContext(ctx)
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("LockContext while another Client holds: got %v, want DeadlineExceeded", err)
		}
		faultAwait(t, late.Matched(1), hangGuard, "the leave's first copy held")
		og.do(t, hangGuard, "the other Client's Unlock", r.other.Unlock)
		lost := r.lockAgain(t, late)
		r.checkIntact(t, late, lost)
	})
}

// TestLateUndoOfUnlockContext: an UnlockContext is cut off (Redis applied
// the release, the reply is dropped); the release posted behind it is held
// on its connection, sent again on another and answered. The goroutine
// locks again; then the held release arrives.
func TestLateUndoOfUnlockContext(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		r := newDeliveryRig(t, b)
		r.g.do(t, hangGuard, "Lock", r.m.Lock)
		late := r.holdUndo(mutexScripts.release)
		cut := r.dropNextReply()
		var err error
		r.g.do(t, hangGuard, "UnlockContext cut off", func() {
			ctx, cancel := context.WithTimeout(context.Background(), cutOffAfter)
			defer cancel()
			err = r.m.UnlockContext(ctx)
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("UnlockContext whose reply was dropped: got %v, want DeadlineExceeded", err)
		}
		faultAwait(t, cut.Done(1), hangGuard, "the release applied, its reply dropped")
		lost := r.lockAgain(t, late)
		r.checkIntact(t, late, lost)
	})
}

// TestLateUndoOfUnlock: a plain Unlock on a go-redis client with
// ContextTimeoutEnabled sends its release on its own goroutine; Redis
// applies it and the reply is dropped. Unlock returns after UnlockTimeout,
// before go-redis's ReadTimeout (1.2s here), and posts the release again;
// that copy is held on its connection, sent again on another once
// ReadTimeout ends the wait for it, and answered. The goroutine locks
// again; then the held copy arrives.
func TestLateUndoOfUnlock(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		r := newDeliveryRigWith(t, b, func(o *redis.Options) { o.ContextTimeoutEnabled, o.ReadTimeout = true, 1200*time.Millisecond })
		r.g.do(t, hangGuard, "Lock", r.m.Lock)
		late := r.holdUndo(mutexScripts.release)
		cut := r.dropNextReply()
		var took time.Duration
		r.g.do(t, hangGuard, "Unlock cut off", func() {
			start := time.Now()
			r.m.Unlock()
			took = time.Since(start)
		})
		if took > UnlockTimeout+deadlineSlack {
			t.Errorf("Unlock whose reply was dropped returned after %v, want within %v (+%v)", took, UnlockTimeout, deadlineSlack)
		}
		faultAwait(t, cut.Done(1), hangGuard, "the release applied, its reply dropped")
		lost := r.lockAgain(t, late)
		r.checkIntact(t, late, lost)
	})
}

// TestLateCopiesOfTheHandOffRelease: the final release of a lock seen
// contended is HDEL and wake.lua in one pipeline (see transport's
// handRelease). Both are delivered again, late, on other connections,
// after the goroutine has locked again and another Client has queued
// behind it: the late HDEL names the earlier acquisition and finds nothing
// of the newer one, and the late wake.lua finds the lock held and hands
// nothing to the waiter.
func TestLateCopiesOfTheHandOffRelease(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		r := newDeliveryRig(t, b)
		r.m.spec.Quick.Contended()
		r.g.do(t, hangGuard, "Lock", r.m.Lock)
		lateDel := r.p.Duplicate(redistest.Match{Args: []string{"hdel", r.hash}, Times: 1}, lateDelay)
		late := r.p.Duplicate(redistest.Match{Args: []string{wakeScript.Hash(), r.hash}, Times: 1}, lateDelay)
		var err error
		r.g.do(t, hangGuard, "UnlockContext", func() { err = r.m.UnlockContext(testCtx(t, hangGuard)) })
		if err != nil {
			t.Fatalf("UnlockContext: %v", err)
		}
		faultAwait(t, lateDel.Matched(1), hangGuard, "the release's HDEL sent")
		lost := r.lockAgain(t, late)

		ctx, cancel := context.WithCancel(testCtx(t, hangGuard))
		defer cancel()
		waiter := b.client(t).NewMutex(r.m.Name())
		waited := make(chan error, 1)
		go func() { waited <- waiter.LockContext(ctx) }()
		awaitInQueue(t, r.check, keysOf(r.m.Name()).queue, 1)
		if isClosed(late.Done(1)) || isClosed(lateDel.Done(1)) {
			t.Fatalf("a late copy arrived before the waiter queued (held %v): the interleaving was not exercised", lateDelay)
		}
		faultAwait(t, lateDel.Done(1), hangGuard, "the late HDEL answered by Redis")
		faultAwait(t, late.Done(1), hangGuard, "the late wake.lua answered by Redis")
		select {
		case err := <-waited:
			t.Fatalf("the waiter returned (%v) while the goroutine held the lock: the late wake.lua handed it over", err)
		default:
		}
		r.checkIntact(t, late, lost) // (unlocks: the waiter is handed the lock)
		if err := await(t, waited, "the waiter, handed the lock by the goroutine's release"); err != nil {
			t.Fatalf("waiter: %v", err)
		}
		_ = waiter.UnlockContext(ctx)
	})
}
