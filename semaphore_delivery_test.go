package remutex

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// TestLateFirstCallOfASemaphoreWait: a late copy of a waiter's first
// queueing call, arriving after a refresh rewrote the entry, queues the
// wait a second time; when that entry comes to the head while the waiter
// holds, it is dropped, not granted again: the holding's deadline is not
// cut back to a claim, and no other holder gets in beside it.
func TestLateFirstCallOfASemaphoreWait(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		p := redistest.NewFaultProxy(t, b.addr)
		rdb := newRDB(t, &redis.Options{Addr: p.Addr(), ReadTimeout: deliveryReadTimeout})
		name := lockName(t)
		o := clientOn(t, rdb).NewSemaphore(name, 2)
		x := b.client(t).NewSemaphore(name, 2)
		y := b.client(t).NewSemaphore(name, 2)
		check := rdbAt(t, b.addr)
		ctx := testCtx(t, hangGuard)
		for _, s := range []*luaScript{quickSem, semScripts.acquire, semScripts.release, semScripts.leave} {
			if err := check.ScriptLoad(ctx, s.Src.(string)).Err(); err != nil {
				t.Fatal(err)
			}
		}
		hkey, qkey := o.m.spec.Keys[0], o.m.spec.Keys[2]
		if !x.TryAcquire(2) {
			t.Fatal("x")
		}
		late := p.Delay(redistest.Match{Args: []string{semScripts.acquire.Hash()}, Times: 1}, lateDelay)
		g := newFaultGoroutine(t)
		acquired := g.async(func() {
			if err := o.Acquire(context.Background(), 1); err != nil {
				t.Error(err)
			}
		})
		faultAwait(t, late.Done(1), hangGuard, "late copy delivered")
		q, _ := check.LRange(ctx, qkey, 0, -1).Result()
		t.Logf("queue after the late copy: %q", q)
		x.Release(1)
		faultAwait(t, acquired, hangGuard, "o acquired")
		// Wait for o's watchdog to extend its claim to the full lease.
		for i := 0; ; i++ {
			all, _ := check.HGetAll(ctx, hkey).Result()
			now, _ := check.Time(ctx).Result()
			ok := true
			for _, v := range all {
				var n, d int64
				fmt.Sscanf(v, "%d:%d", &n, &d)
				if d-now.UnixMilli() < 5000 {
					ok = false
				}
			}
			if ok || i > 300 {
				t.Logf("holders %v (now %d)", all, now.UnixMilli())
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		x.Release(1)
		all, _ := check.HGetAll(ctx, hkey).Result()
		q, _ = check.LRange(ctx, qkey, 0, -1).Result()
		t.Logf("after x released all: holders %v queue %q", all, q)
		var lost <-chan struct{}
		var held int64
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			g.do(t, hangGuard, "held", func() { held, lost = o.Held(), o.Lost() })
			if held == 1 && !isClosed(lost) && y.TryAcquire(2) {
				t.Errorf("y acquired 2 of 2 permits while o holds 1 with Lost open: over-admission")
				y.Release(2)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		g.do(t, hangGuard, "release", func() { _ = o.ReleaseContext(context.Background(), 1) })
	})
}
