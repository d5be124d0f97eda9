package remutex

// Interleavings of the wait path that only show rarely, provoked.

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// queuedWaiter is a lock held by one Client and a goroutine of another
// Client waiting for it in the queue, under the entry its first call wrote.
type queuedWaiter struct {
	k      lockKeyNames
	ctx    context.Context
	rdb    *redis.Client
	holder *DistMutex
	wc     *Client
	wm     *DistMutex
	w      *bgLock
	entry  string
}

func queueWaiter(t *testing.T, b *testBackend) *queuedWaiter {
	t.Helper()
	name := lockName(t)
	q := &queuedWaiter{k: keysOf(name), ctx: context.Background(), rdb: b.rdb(t), holder: b.client(t).NewMutex(name), wc: b.client(t)}
	q.holder.Lock()
	q.wm = q.wc.NewMutex(name)
	q.w = goLock(t, q.wm)
	awaitInQueue(t, q.rdb, q.k.queue, 1) // and listening, to be handed the lock
	e, err := q.rdb.LRange(q.ctx, q.k.queue, 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, e, 1, "queue entries")
	q.entry = e[0]
	return q
}

// TestStaleGrantAfterEntryGone: a waiter's queue entry vanishes (it was
// handed the lock, whose claim ran out before the grant message arrived, or
// it expired). The waiter queues again under a new entry, and the old grant,
// arriving late, is not taken for the new wait: that would let two holders in.
func TestStaleGrantAfterEntryGone(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		q := queueWaiter(t, b)
		k, ctx, rdb, holder, wc, w, old := q.k, q.ctx, q.rdb, q.holder, q.wc, q.w, q.entry
		require.NoError(t, rdb.Del(ctx, k.queue).Err()) // the entry is gone
		if b.mr != nil {
			b.mr.FastForward(maxQueueTTL) // the waiter's next refresh is due
		}
		waitFor(t, "the waiter queued again under a new entry", func() bool {
			e := rdb.LRange(ctx, k.queue, 0, -1).Val()
			return len(e) == 1 && e[0] != old
		})
		// The grant of the old entry arrives now: it must not reach the
		// waiter (dispatch hands a grant over synchronously, or not at all).
		wc.dispatch(k.channel+wc.id, "g 0 "+old)
		wc.mu.Lock()
		for _, wt := range wc.locks[k.hash].waiters {
			assert.False(t, wt.granted, "waiter %s took the grant of %s", wt.key, old)
		}
		wc.mu.Unlock()
		holder.Unlock()
		require.NoError(t, await(t, w.locked, "the waiter to get the lock after the release"))
		w.release()
		require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
	})
}

// TestWaiterBacksOffOnErrors: a waiter whose calls fail with a transient
// error (a dropped connection, a failover in progress) retries with
// backoff, also once its subscription is confirmed: it never spins.
func TestWaiterBacksOffOnErrors(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		holder := b.client(t).NewMutex(name)
		holder.Lock()
		var (
			mu    sync.Mutex
			calls []time.Time
			fail  atomic.Bool
		)
		rdb := b.rdb(t)
		rdb.AddHook(hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if s, _ := scriptCall(cmd); s == "acquire" && fail.Load() {
				mu.Lock()
				calls = append(calls, time.Now())
				mu.Unlock()
				err := transientErr()
				cmd.SetErr(err)
				return err
			}
			return next(ctx, cmd)
		}})
		fail.Store(true)
		w := goLock(t, clientOn(t, rdb).NewMutex(name))
		waitFor(t, "ten failed calls", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(calls) >= 10
		})
		mu.Lock()
		for i := 1; i < len(calls); i++ {
			// The backoff starts at 10ms, with jitter down to half of it.
			assert.GreaterOrEqual(t, calls[i].Sub(calls[i-1]), 4*time.Millisecond, "pause before retry %d", i)
		}
		mu.Unlock()
		fail.Store(false)
		holder.Unlock()
		require.NoError(t, await(t, w.locked, "the waiter to get the lock once Redis answers"))
		w.release()
		require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
	})
}

// TestLockContextEndsDuringFirstCall: the context of a LockContext ends
// while its first call is out, after Redis applied it (the reply is lost).
// Nothing may stay behind: no hold, no queue entry.
func TestLockContextEndsDuringFirstCall(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		for _, busy := range []bool{false, true} {
			name := lockName(t)
			k := keysOf(name)
			ctx := context.Background()
			rdb := b.rdb(t)
			var holder *DistMutex
			if busy {
				holder = b.client(t).NewMutex(name)
				holder.Lock()
			}
			wctx, cancel := context.WithCancel(ctx)
			var once sync.Once
			wrdb := b.rdb(t)
			wrdb.AddHook(hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
				err := next(ctx, cmd)
				if s, _ := scriptCall(cmd); s == "acquire" && err == nil {
					lost := false
					once.Do(func() { lost = true })
					if lost {
						cancel() // the reply is lost with the context's end
						cmd.SetErr(context.Canceled)
						return context.Canceled
					}
				}
				return err
			}})
			wc := clientOn(t, wrdb)
			m := wc.NewMutex(name)
			assert.ErrorIs(t, m.LockContext(wctx), context.Canceled, "busy=%v", busy)
			assert.Equal(t, 0, m.HoldCount())
			settled(t, wc) // what undoes the lost call is sent after LockContext returns
			if busy {
				assert.Equal(t, int64(0), rdb.Exists(ctx, k.queue).Val(), "queue keys left behind (busy)")
				holder.Unlock()
			}
			assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash).Val(), "hold left behind (busy=%v)", busy)
		}
	})
}

// TestMessageBeforeWaiterRegistered: the call that queues a waiter can
// return after the message for its entry came (the lock was released, or
// handed to it, in between). The message must reach the waiter when it
// registers, not be dropped: it would then wait for its next refresh.
func TestMessageBeforeWaiterRegistered(t *testing.T) {
	for _, msg := range []string{"w", "g 7"} {
		t.Run(msg, func(t *testing.T) {
			c := clientOn(t, rdbAt(t, miniredis.RunT(t).Addr()))
			m := c.NewMutex(lockName(t))
			var a attempt
			c.mu.Lock()
			m.initAttemptLocked(&a, 1, false)
			c.mu.Unlock()
			c.dispatch(m.spec.channel, msg+" "+a.entry())
			a.enter()
			defer a.exit()
			select {
			case <-a.w.ev:
			default:
				t.Fatal("the waiter was not told of the message that came before it registered")
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			assert.Equal(t, msg != "w", a.w.granted)
			if msg != "w" {
				assert.EqualValues(t, 7, a.w.grant.fence)
			}
		})
	}
}

// TestStaleGrantOfAnEarlierEntryState: a grant message that names the
// waiter's entry as an earlier call left it (its claim ran out before the
// message came: the waiter's outbound traffic was cut meanwhile, and the
// lock moved on) is not taken, though the waiter still waits in that
// entry's place and has refreshed it since: the claim counts from the
// send time the message names, not from the latest refresh. Taking it
// would let two holders in.
func TestStaleGrantOfAnEarlierEntryState(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		q := queueWaiter(t, b)
		k, ctx, rdb, holder, wc, w, first := q.k, q.ctx, q.rdb, q.holder, q.wc, q.w, q.entry
		// The grant of that entry state would have lapsed by now: wait out
		// a claim lease (the waiter refreshes its entry meanwhile).
		<-time.After(q.wm.spec.claim + 50*time.Millisecond)
		wc.dispatch(k.channel+wc.id, "g 0 "+first)
		select {
		case err := <-w.locked:
			t.Fatalf("the waiter took a grant whose claim had run out (LockContext: %v) while another Client holds the lock", err)
		case <-time.After(100 * time.Millisecond):
		}
		if got := holder.HoldCount(); got != 1 {
			t.Fatalf("the holder's HoldCount after the stale grant: got %d, want 1", got)
		}
		if n := len(rdb.HKeys(ctx, k.hash).Val()); n != 1 {
			t.Errorf("fields of the lock after the stale grant: got %d, want the holder's alone", n)
		}
		holder.Unlock()
		require.NoError(t, await(t, w.locked, "the waiter to get the lock after the release"))
		w.release()
		require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
	})
}

// TestLateGrantKeepsTheTurn: a grant that the waiter processes past its
// claim (a busy process; here the waiter counts its claim as ended at once)
// while Redis still has the claim as the waiter's is taken by the waiter's
// next call, which finds it. The turn is not passed on to the waiter queued
// behind, as a give-back would, which then had the first waiter queue
// again at the back.
func TestLateGrantKeepsTheTurn(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, rdb := keysOf(name), b.rdb(t)
		holder := b.client(t).NewMutex(name, WithFencing())
		holder.Lock()
		first := b.client(t).NewMutex(name, WithFencing())
		first.spec.claim = time.Nanosecond // every grant comes too late
		w1 := goLock(t, first)
		awaitInQueue(t, rdb, k.queue, 1)
		w2 := goLock(t, b.client(t).NewMutex(name, WithFencing()))
		awaitInQueue(t, rdb, k.queue, 2)
		fence := holder.Fence()
		holder.Unlock()
		select {
		case err := <-w1.locked:
			require.NoError(t, err, "the first waiter's LockContext")
		case err := <-w2.locked:
			t.Fatalf("the second waiter got the lock first (LockContext: %v): the first one's late grant passed its turn on", err)
		case <-time.After(hangGuard):
			t.Fatalf("no waiter got the lock after %v", hangGuard)
		}
		if got := w1.fence.Load(); got <= fence {
			t.Errorf("the first waiter's fence: got %d, want more than the holder's %d", got, fence)
		}
		w1.release()
		require.NoError(t, await(t, w1.unlocked, "the first waiter to unlock"))
		require.NoError(t, await(t, w2.locked, "the second waiter to get the lock"))
		w2.release()
		require.NoError(t, await(t, w2.unlocked, "the second waiter to unlock"))
	})
}

// TestTurnBeforeSubscription: a waiter whose turn comes before its Client's
// subscription is confirmed (its first wait on the lock, a moment after the
// call that queued it) is dropped as a gone one would be, and the next
// waiter is served. The dropped one, looking again at a polling pace while
// it hears nothing, takes the lock once it is free: it loses its turn, not
// the lock. (A test of the queue's order must therefore wait until its
// waiters listen: see awaitInQueue.)
func TestTurnBeforeSubscription(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		rdb := b.rdb(t)
		holder := b.client(t).NewMutex(name)
		holder.Lock()

		// The deaf Client's first connection, its pool's, goes through; the
		// next, its pub/sub connection, waits for the gate. While the release
		// hands the lock on, its calls wait too: the first waiter, at the head
		// and polling, could otherwise take the lock between the release's
		// two calls (HDEL, then the hand-off). A call let through before the
		// calls were held is awaited before the release (see hold).
		gate, calls := make(chan struct{}), make(chan struct{})
		var dials atomic.Int32
		var mu sync.Mutex
		holding, inFlight := false, 0
		drdb := b.rdb(t)
		hold := func(ctx context.Context, next func() error) error {
			mu.Lock()
			held := holding
			if !held {
				inFlight++
			}
			mu.Unlock()
			if !held {
				defer func() { mu.Lock(); inFlight--; mu.Unlock() }()
				return next()
			}
			select {
			case <-calls:
			case <-ctx.Done():
				return ctx.Err()
			}
			return next()
		}
		drdb.AddHook(hookFuncs{
			dial: func(ctx context.Context, network, addr string, next redis.DialHook) (net.Conn, error) {
				if dials.Add(1) > 1 {
					select {
					case <-gate:
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}
				return next(ctx, network, addr)
			},
			process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
				return hold(ctx, func() error { return next(ctx, cmd) })
			},
			pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
				return hold(ctx, func() error { return next(ctx, cmds) })
			},
		})
		deaf := clientOn(t, drdb)
		var opened, resumed sync.Once
		open := func() { opened.Do(func() { close(gate) }) }
		resume := func() { resumed.Do(func() { close(calls) }) }
		t.Cleanup(open)
		t.Cleanup(resume)
		require.False(t, deaf.NewMutex(name).TryLock(), "TryLock of the held lock") // dials the pool's connection

		first := goLock(t, deaf.NewMutex(name))
		// goLock's cleanup waits for the waiter's calls: a test that fails
		// lets them through first, so that it fails rather than hangs.
		t.Cleanup(func() { open(); resume() })
		waitFor(t, "the first waiter queued", func() bool { return rdb.LLen(ctx, k.queue).Val() == 1 })
		sc := b.client(t)
		second := goLock(t, sc.NewMutex(name))
		waitFor(t, "the second waiter queued behind it, and listening", func() bool {
			return rdb.LLen(ctx, k.queue).Val() == 2 && len(rdb.PubSubChannels(ctx, k.channel+sc.id).Val()) == 1
		})
		require.Empty(t, rdb.PubSubChannels(ctx, k.channel+deaf.id).Val(), "the first waiter's Client listening, before its gate opened")

		mu.Lock()
		holding = true
		mu.Unlock()
		waitFor(t, "the deaf Client's calls sent before they were held to return", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return inFlight == 0
		})
		holder.Unlock()
		require.NoError(t, await(t, second.locked, "the second waiter, served when the first did not listen"))
		resume()
		waitFor(t, "the first waiter queued again", func() bool {
			e := rdb.LRange(ctx, k.queue, 0, -1).Val()
			return len(e) == 1 && strings.Contains(e[0], deaf.id)
		})
		select {
		case err := <-first.locked:
			t.Fatalf("the first waiter returned (%v) while the second held the lock", err)
		default:
		}
		second.release()
		require.NoError(t, await(t, second.unlocked, "the second waiter to unlock"))
		require.NoError(t, await(t, first.locked, "the first waiter once the lock was free, its Client still deaf"))
		open()
		first.release()
		require.NoError(t, await(t, first.unlocked, "the first waiter to unlock"))
		assert.Zero(t, rdb.Exists(ctx, k.hash, k.queue).Val(), "keys left behind")
	})
}
