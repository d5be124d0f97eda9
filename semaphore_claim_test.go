package remutex

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// TestSemaphoreClaimTakenForTheLease: a call of sem_acquire.lua that serves
// the queue (a holder's lease ran out) and finds its own caller among those
// served takes the permits for the full lease, which its caller counts from
// the call's send time: Redis keeps them that long.
func TestSemaphoreClaimTakenForTheLease(t *testing.T) {
	t.Parallel() // its own keys; a claim is a safety check, which load cannot make fail (see TestMain)
	skipShort(t, "a soak (twelve rounds past a claim)")
	srv := redistest.Shared(t)
	b := &testBackend{name: "redis-server", addr: srv.Addr(), srv: srv}
	check := rdbAt(t, b.addr)
	for i := 0; i < 12; i++ {
		ctx := testCtx(t, hangGuard) // (per round: twelve rounds take longer)
		name := lockName(t) + fmt.Sprint(i)
		// z's lease is the wait of x and o: long enough that a loaded
		// machine's round trip does not outlast it (a reply after it is no
		// acquisition, and x would not queue behind z).
		z := b.client(t).NewSemaphore(name, 2, WithLease(time.Second), WithoutRenewal())
		x := b.client(t).NewSemaphore(name, 2)
		o := b.client(t).NewSemaphore(name, 2)
		y := b.client(t).NewSemaphore(name, 2)
		// TryAcquireContext: the semaphore is free, and TryAcquire's 300ms
		// is not what the test is about.
		if ok, err := z.TryAcquireContext(ctx, 2); !ok || err != nil {
			t.Fatalf("z: TryAcquireContext on a free semaphore: got (%v, %v), want (true, nil)", ok, err)
		}
		xd, od := make(chan error, 1), make(chan error, 1)
		go func() { xd <- x.Acquire(context.Background(), 1) }()
		// x first in the queue
		for n := int64(0); n == 0; n, _ = check.LLen(ctx, o.m.spec.Keys[2]).Result() {
			time.Sleep(time.Millisecond)
		}
		go func() { od <- o.Acquire(context.Background(), 1) }()
		if err := <-xd; err != nil {
			t.Fatal(err)
		}
		if err := <-od; err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // past a claim, before o's first renewal (lease/3)
		all, _ := check.HGetAll(ctx, o.m.spec.Keys[0]).Result()
		if o.Held() == 1 && !isClosed(o.Lost()) && y.TryAcquire(1) {
			t.Errorf("run %d: y took a permit while x and o hold one each of 2 (holders in Redis %v): over-admission", i, all)
			return
		}
		o.Release(1)
		x.Release(1)
	}
}
