package remutex

import (
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/remutex/remutex/internal/redistest"
)

// Tests of a DistRWMutex waiter that queues in the holder's last
// millisecond: it must wake when the holder's lease ends, not at its next
// queue refresh (a third of the queue's time to live, 250ms).

// TestRWWaitReplyAtLeaseEnd calls wlock.lua and rlock.lua for a waiter
// while the writer's key has under a millisecond left (PTTL 0, on
// miniredis, whose clock the test moves): the wait they answer is at most
// 1ms, not the queue's time to live.
func TestRWWaitReplyAtLeaseEnd(t *testing.T) {
	mr := miniredis.RunT(t)
	name := lockName(t)
	holder := clientOn(t, rdbAt(t, mr.Addr())).NewRWMutex(name, WithLease(100*time.Millisecond), WithoutRenewal())
	holder.Lock()
	mr.FastForward(99*time.Millisecond + 600*time.Microsecond)
	c := clientOn(t, rdbAt(t, mr.Addr()))
	rw := c.NewRWMutex(name)
	ctx := testCtx(t, hangGuard)
	for i, side := range []*DistMutex{&rw.w, &rw.r} {
		owner := c.id + ":1"
		entry := side.spec.ClaimMs + ":" + side.spec.Flag + ":" + strconv.Itoa(10+i) + ".1:" + owner
		r, err := c.be.Acquire(ctx, &side.spec.Spec, acquireReq{Owner: owner, Want: 1, Lease: side.spec.leaseArg, Entry: entry})
		if err != nil {
			t.Fatal(err)
		}
		if r.Code != replyQueued || r.Val > 1 {
			t.Errorf("%s waiter behind a writer with PTTL 0: got reply %d, wait %dms; want queued (%d), wait at most 1ms", []string{"write", "read"}[i], r.Code, r.Val, replyQueued)
		}
	}
	_ = holder.UnlockContext(ctx)
}

// TestRWWakeAtLeaseEnd runs many rounds on a real server in which a
// writer's fixed 50ms lease runs out while a writer (then a reader) queues
// near its end: the waiter must hold the lock soon after the lease ended.
// A round counts as late past 150ms; the fault made about one round in
// eight some 250ms late, so a few late rounds (a loaded machine) pass and
// many fail.
func TestRWWakeAtLeaseEnd(t *testing.T) {
	// Serial: waiters must wake within 150ms of a 50ms lease's end.
	srv := redistest.Shared(t)
	name := lockName(t)
	const lease, rounds, lateAfter, tolerated = 50 * time.Millisecond, 40, 150 * time.Millisecond, 3
	holder := clientOn(t, rdbAt(t, srv.Addr())).NewRWMutex(name, WithLease(lease), WithoutRenewal())
	waiter := clientOn(t, rdbAt(t, srv.Addr())).NewRWMutex(name)
	for _, read := range []bool{false, true} {
		late := 0
		for i := range rounds {
			// TryLockContext, not TryLock, whose 300ms a loaded machine
			// can outlast: the lock is free.
			ctx := testCtx(t, hangGuard)
			start := time.Now()
			if ok, err := holder.TryLockContext(ctx); !ok || err != nil {
				t.Fatalf("round %d: the holder's TryLockContext: got (%v, %v), want (true, nil)", i, ok, err)
			}
			// Queue in the lease's last milliseconds, spread over them.
			time.Sleep(time.Until(start.Add(lease - time.Duration(i%4)*time.Millisecond)))
			lock, unlock := waiter.LockContext, waiter.UnlockContext
			if read {
				lock, unlock = waiter.RLockContext, waiter.RUnlockContext
			}
			if err := lock(ctx); err != nil {
				t.Fatalf("round %d: waiter: %v", i, err)
			}
			if over := time.Since(start) - lease; over > lateAfter {
				late++
				t.Logf("round %d: held %v after the holder's lease ended", i, over.Round(time.Millisecond))
			}
			if err := unlock(ctx); err != nil {
				t.Fatalf("round %d: waiter's unlock: %v", i, err)
			}
		}
		if late > tolerated {
			t.Errorf("reader %v: %d of %d waiters woke over %v after the holder's lease ended, want at most %d", read, late, rounds, lateAfter, tolerated)
		}
	}
}
