package remutex

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// TestLateUndoOfAPinnedRead: a read under the goroutine's own write hold has
// an owner token of its own (naming the write hold's), so a late copy of
// the undo of one such read, arriving after the goroutine read again,
// leaves the new read hold alone: after the write Unlock, no writer gets in
// beside it.
func TestLateUndoOfAPinnedRead(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		p := redistest.NewFaultProxy(t, b.addr)
		rdb := newRDB(t, &redis.Options{Addr: p.Addr(), ReadTimeout: deliveryReadTimeout})
		name := lockName(t)
		rw := clientOn(t, rdb).NewRWMutex(name)
		other := b.client(t).NewRWMutex(name)
		check := rdbAt(t, b.addr)
		for _, s := range []*luaScript{quickLock, quickRLock, wakeScript, rwWake, readScripts.acquire, readScripts.release, writeScripts.acquire, writeScripts.release, writeScripts.leave} {
			if err := check.ScriptLoad(testCtx(t, hangGuard), s.Src.(string)).Err(); err != nil {
				t.Fatal(err)
			}
		}
		g := newFaultGoroutine(t)
		g.do(t, hangGuard, "warm-up", func() { rw.Lock(); rw.RLock(); rw.RUnlock(); rw.Unlock() })
		g.do(t, hangGuard, "Lock+RLock", func() { rw.Lock(); rw.RLock() })
		late := p.Delay(redistest.Match{Args: []string{rw.r.spec.hash()}, Times: 1}, lateDelay)
		var err error
		g.do(t, hangGuard, "RUnlockContext cut off", func() {
			ctx, cancel := context.WithTimeout(context.Background(), cutOffAfter)
			defer cancel()
			err = rw.RUnlockContext(ctx)
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("RUnlockContext: %v", err)
		}
		faultAwait(t, late.Matched(1), hangGuard, "undo held")
		g.do(t, hangGuard, "RLock again", func() { rw.RLock() })
		if isClosed(late.Done(1)) {
			t.Fatal("late copy arrived too early")
		}
		faultAwait(t, late.Done(1), hangGuard, "late copy applied")
		rkey := rw.r.spec.KeyArgs[3].(string)
		n, _ := check.ZCard(context.Background(), rkey).Result()
		t.Logf("readers in Redis after the late copy: %d", n)
		g.do(t, hangGuard, "Unlock write (downgrade)", func() { rw.Unlock() })
		var lost <-chan struct{}
		var rc int
		g.do(t, hangGuard, "Lost", func() { lost = rw.Lost(); rc = rw.r.HoldCount() })
		if other.TryLock() {
			t.Errorf("another Client took the write lock while the goroutine holds a read (HoldCount %d, Lost closed %v): two holders", rc, isClosed(lost))
			other.Unlock()
		}
		g.do(t, hangGuard, "RUnlock", func() { _ = rw.RUnlockContext(context.Background()) })
	})
}
