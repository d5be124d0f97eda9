package remutex

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// Leases: renewal by the watchdog, lost holds, scripts applied twice, and
// fencing tokens.

// renewRecorder is a hook that records every successful pipeline that carries
// the renew script: per pipeline, the keys of each renew call in it.
type renewRecorder struct {
	mu    sync.Mutex
	calls [][][]string
	seen  chan struct{} // signalled after each one
}

func newRenewRecorder() *renewRecorder { return &renewRecorder{seen: make(chan struct{}, 1)} }

func (r *renewRecorder) hook() redis.Hook {
	return hookFuncs{pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		err := next(ctx, cmds)
		var renews [][]string
		for _, cmd := range cmds {
			if s, keys := scriptCall(cmd); s == "renew" && cmd.Err() == nil {
				renews = append(renews, keys)
			}
		}
		if len(renews) > 0 {
			r.mu.Lock()
			r.calls = append(r.calls, renews)
			r.mu.Unlock()
			select {
			case r.seen <- struct{}{}:
			default:
			}
		}
		return err
	}}
}

func (r *renewRecorder) pipelines() [][][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][][]string(nil), r.calls...)
}

// TestWatchdogBatchesRenewals: one watchdog goroutine per Client renews all
// its holds, all that are due in one pipelined round trip; the goroutine
// count does not grow with the number of holds.
func TestWatchdogBatchesRenewals(t *testing.T) {
	// Serial: it counts the process's goroutines.
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		const holds = 20
		// Renewals every second; holds due within 250ms share a round trip,
		// and the 20 Locks below take far less than that.
		const lease = 3 * time.Second
		rec := newRenewRecorder()
		rdb := b.rdb(t)
		rdb.AddHook(rec.hook())
		c := clientOn(t, rdb)
		var ms []*DistMutex
		var keys []string
		for i := 0; i < holds; i++ {
			n := fmt.Sprintf("%s.%d", name, i)
			ms = append(ms, c.NewMutex(n, WithLease(lease)))
			keys = append(keys, keysOf(n).hash)
		}

		ms[0].Lock()
		oneHold := runtime.NumGoroutine()
		for _, m := range ms[1:] {
			m.Lock()
		}
		allHolds := runtime.NumGoroutine()
		// A goroutine per hold would add holds-1; allow for the short-lived
		// goroutine of a renewal in flight.
		assert.LessOrEqual(t, allHolds-oneHold, 2, "goroutines: got %d with one hold, %d with %d holds", oneHold, allHolds, holds)

		for len(rec.pipelines()) < 2 {
			await(t, rec.seen, "a renewal")
		}
		for i, p := range rec.pipelines()[:2] {
			if assert.Len(t, p, 1, "renew calls in renewal pipeline %d", i) {
				assert.ElementsMatch(t, keys, p[0], "keys renewed by renewal pipeline %d", i)
			}
		}
		for _, m := range ms {
			assert.False(t, isClosed(m.Lost()), "Lost of %s: got closed, want open", m.Name())
			m.Unlock()
		}
	})
}

// cpuTime returns the CPU time the process has used.
func cpuTime(t testing.TB) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestWatchdogIdleWhileRenewalInFlight: while a renewal is in flight (here
// held up by a network that stopped delivering), a hold that falls due
// waits for it without the watchdog spinning. Time passing is the thing
// tested: the holds are taken apart so that they fall due at different times,
// and the process's CPU time is measured over a second in which one renewal
// hangs and the other hold is due.
func TestWatchdogIdleWhileRenewalInFlight(t *testing.T) {
	// Serial: it measures the CPU time of the whole process.
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		const lease = 3 * time.Second // renewals every 1s, batched within 250ms
		p := redistest.NewProxy(t, b.addr)
		prdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
		t.Cleanup(func() { _ = prdb.Close() })
		sent := make(chan struct{})
		var once sync.Once
		prdb.AddHook(hookFuncs{pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			for _, cmd := range cmds {
				if s, _ := scriptCall(cmd); s == "renew" {
					once.Do(func() {
						p.Pause() // the first renewal hangs
						close(sent)
					})
				}
			}
			return next(ctx, cmds)
		}})
		c := clientOn(t, prdb)
		t.Cleanup(p.Resume) // before the Client closes
		first := c.NewMutex(name+".1", WithLease(lease))
		second := c.NewMutex(name+".2", WithLease(lease))
		first.Lock()
		time.Sleep(lease / 6) // the second hold falls due 500ms after the first
		second.Lock()
		await(t, sent, "the first hold's renewal")
		time.Sleep(lease / 5) // now the second hold is due, the first's renewal hangs
		require.False(t, isClosed(first.Lost()), "the first hold was lost before the measurement")
		cpu0, wall0 := cpuTime(t), time.Now()
		time.Sleep(lease / 4) // ends well before the first hold's deadline
		cpu, wall := cpuTime(t)-cpu0, time.Since(wall0)
		assert.Less(t, cpu, wall/5, "CPU time over %v with a renewal in flight and a hold due: got %v, want the watchdog idle", wall, cpu)
		require.False(t, isClosed(first.Lost()), "the first hold was lost during the measurement")
		p.Resume()
		first.Unlock()
		second.Unlock()
	})
}

// TestFailingRenewalsLoseTheHold: renewals that fail are retried sooner
// than the normal schedule, but not in a busy loop, and when the validity
// deadline passes without a success the hold is lost.
func TestFailingRenewalsLoseTheHold(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		const lease = 1500 * time.Millisecond
		var attempts atomic.Int64
		rdb := b.rdb(t)
		rdb.AddHook(hookFuncs{pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			for _, cmd := range cmds {
				if s, _ := scriptCall(cmd); s == "renew" {
					attempts.Add(1)
					err := transientErr()
					for _, cmd := range cmds {
						cmd.SetErr(err)
					}
					return err
				}
			}
			return next(ctx, cmds)
		}})
		errs := newErrorLog()
		m := clientOn(t, rdb, WithErrorHandler(errs.handler)).NewMutex(name, WithLease(lease))
		m.Lock()
		await(t, m.Lost(), "Lost to close")
		// A renewal is due after lease/3; retries follow every lease/12 or so
		// until the validity deadline: about ten attempts, not thousands.
		n := attempts.Load()
		assert.GreaterOrEqual(t, n, int64(2), "renewal attempts: want the failed one retried")
		assert.LessOrEqual(t, n, int64(30), "renewal attempts within one lease: want a few retries, not a busy loop")
		waitFor(t, "the error handler to hear of the loss", func() bool { return len(errs.matching(ErrLockLost)) > 0 })
		assert.ErrorIs(t, m.UnlockContext(context.Background()), ErrLockLost)
	})
}

// TestHoldOutlivesLease: a hold lives on, renewed, well past its lease. On
// miniredis the keys' clock is moved along with real time.
func TestHoldOutlivesLease(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		rdb := b.rdb(t)
		const lease = 3 * time.Second // renewals a busy machine holds up keep the hold
		errs := newErrorLog()
		m := b.client(t, WithErrorHandler(errs.handler)).NewMutex(name, WithLease(lease))
		m.Lock()
		lost := m.Lost()
		start := time.Now()
		for time.Since(start) < 5*lease {
			b.elapse(lease / 50)
			require.False(t, isClosed(lost), "Lost after %v: got closed, want open", time.Since(start))
			require.Equal(t, []string{"1"}, hashCounts(t, rdb, k.hash), "hold counts in Redis after %v", time.Since(start))
		}
		require.NoError(t, m.UnlockContext(ctx))
		assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash).Val(), "key after Unlock")
		assert.Empty(t, errs.all(), "errors reported")
	})
}

// TestSlowAcquireReplyIsRenewedInTime: the first renewal of a hold is
// scheduled from the send time of its acquire, like its validity deadline,
// so a hold whose acquire reply came late is still renewed before that
// deadline. The hook delays the reply of the first acquire by 3/4 of the
// lease (the script ran at once).
func TestSlowAcquireReplyIsRenewedInTime(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		// Without renewal the hold would end 4s - 105ms after the acquire was
		// sent; the reply comes after 3s, the renewal must follow at once.
		const lease = 4 * time.Second
		var once sync.Once
		rdb := b.rdb(t)
		require.NoError(t, rdb.ScriptLoad(context.Background(), renewScript.Src.(string)).Err()) // spare the renewal a NOSCRIPT round
		rdb.AddHook(hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			err := next(ctx, cmd)
			if s, _ := scriptCall(cmd); s == "acquire" && err == nil {
				once.Do(func() { time.Sleep(lease * 3 / 4) })
			}
			return err
		}})
		m := clientOn(t, rdb).NewMutex(name, WithLease(lease))
		m.Lock()
		lost := m.Lost()
		start := time.Now()
		for time.Since(start) < lease/2 {
			b.elapse(lease / 100)
			require.False(t, isClosed(lost), "Lost %v after the slow acquire returned: got closed, want open", time.Since(start))
		}
		require.NoError(t, m.UnlockContext(context.Background()))
	})
}

func TestWithoutRenewalExpires(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		rdb := b.rdb(t)
		const lease = 150 * time.Millisecond
		rec := newRenewRecorder()
		crdb := b.rdb(t)
		crdb.AddHook(rec.hook())
		errs := newErrorLog()
		m := clientOn(t, crdb, WithErrorHandler(errs.handler)).NewMutex(name, WithLease(lease), WithoutRenewal())
		m.Lock()
		m.Lock() // a nested Lock does not extend a fixed lease
		pttl := rdb.PTTL(ctx, k.hash).Val()
		assert.True(t, pttl > 0 && pttl <= lease, "PTTL: got %v, want (0, %v]", pttl, lease)

		await(t, m.Lost(), "Lost to close when the lease runs out")
		b.fastForward(lease)
		waitFor(t, "the key to expire", func() bool { return rdb.Exists(ctx, k.hash).Val() == 0 })
		assert.ErrorIs(t, m.UnlockContext(ctx), ErrLockLost, "UnlockContext of an expired hold")
		assert.ErrorIs(t, m.UnlockContext(ctx), ErrLockLost, "UnlockContext of an expired hold")
		assert.ErrorIs(t, m.UnlockContext(ctx), ErrNotHeld, "UnlockContext after the last")
		waitFor(t, "the error handler to hear of the loss", func() bool { return len(errs.matching(ErrLockLost)) > 0 })
		assert.Empty(t, rec.pipelines(), "renewals of a WithoutRenewal hold")
	})
}

func TestLostWhenKeyDeleted(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		for _, tc := range []struct {
			name     string
			takeOver bool // another Client takes the lock after the delete
		}{{"deleted", false}, {"taken over", true}} {
			t.Run(tc.name, func(t *testing.T) {
				name := lockName(t)
				k := keysOf(name)
				ctx := context.Background()
				rdb := b.rdb(t)
				errs := newErrorLog()
				m := b.client(t, WithErrorHandler(errs.handler)).NewMutex(name, WithLease(300*time.Millisecond))
				m.Lock()
				m.Lock()
				lost := m.Lost()
				require.NoError(t, rdb.Del(ctx, k.hash).Err())
				other := b.client(t).NewMutex(name)
				if tc.takeOver {
					require.True(t, other.TryLock(), "TryLock after the delete: got false, want true")
				}

				await(t, lost, "Lost to close")
				err := await(t, errs.ch, "the error handler to hear of the loss")
				assert.ErrorIs(t, err, ErrLockLost)
				assert.Contains(t, err.Error(), name, "the error names the lock")
				assert.ErrorIs(t, m.UnlockContext(ctx), ErrLockLost)
				assert.NotPanics(t, m.Unlock, "Unlock of a lost hold")
				assert.Equal(t, 0, m.HoldCount())
				if tc.takeOver {
					// Unlocking the lost hold did not touch the new holder's.
					assert.Len(t, hashCounts(t, rdb, k.hash), 1, "holds in Redis")
					assert.False(t, inGoroutine(t, m.TryLock), "TryLock while the other Client holds: got true, want false")
					other.Unlock()
				}
				assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash).Val(), "key at the end")
			})
		}
	})
}

// TestLostHoldNestedCalls: a hold that was lost has ended for its
// goroutine: TryLock, the Context forms and Lock take the lock anew (never
// reporting a hold Redis does not have), and the lost hold's Unlock, owed
// after those of the new holds, reports ErrLockLost without panicking.
func TestLostHoldNestedCalls(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		rdb := b.rdb(t)
		errs := newErrorLog()
		m := b.client(t, WithErrorHandler(errs.handler)).NewMutex(name, WithLease(300*time.Millisecond))
		m.Lock()
		require.NoError(t, rdb.Del(ctx, k.hash).Err())
		await(t, m.Lost(), "Lost to close")
		waitFor(t, "the error handler to hear of the loss", func() bool { return len(errs.all()) > 0 })
		assert.Equal(t, 0, m.HoldCount(), "HoldCount of a lost hold")

		assert.True(t, m.TryLock(), "TryLock after the hold was lost: got false, want true (a new hold)")
		assert.Equal(t, 1, m.HoldCount(), "HoldCount of the new hold")
		assert.False(t, isClosed(m.Lost()), "Lost of the new hold: got closed, want open")
		require.NoError(t, m.UnlockContext(ctx), "UnlockContext of the new hold")
		ok, err := m.TryLockContext(ctx)
		assert.True(t, ok && err == nil, "TryLockContext after the hold was lost: got (%v, %v), want (true, nil)", ok, err)
		require.NoError(t, m.UnlockContext(ctx))
		require.NoError(t, m.LockContext(ctx), "LockContext after the hold was lost")
		m.Lock()
		assert.Equal(t, 2, m.HoldCount(), "HoldCount after a nested Lock of the new hold")
		m.Unlock()
		m.Unlock()
		assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash).Val(), "key after the new holds' Unlocks")
		assert.Len(t, errs.matching(ErrLockLost), 1, "losses reported")

		assert.ErrorIs(t, m.UnlockContext(ctx), ErrLockLost, "the lost hold's owed Unlock")
		assert.Equal(t, 0, m.HoldCount())
		assert.Panics(t, m.Unlock, "Unlock with every Unlock paid")
	})
}

// TestLostWhenRedisUnreachable: when Redis stops answering, the hold is lost
// by its local validity deadline, before the key can expire on the server.
func TestLostWhenRedisUnreachable(t *testing.T) {
	// Serial: the loss must be declared within the drift margin (~130ms)
	// before the server's expiry, and the test reads PTTL inside it.
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		direct := b.rdb(t)
		p := redistest.NewProxy(t, b.addr)
		prdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
		t.Cleanup(func() { _ = prdb.Close() })
		errs := newErrorLog()
		c := clientOn(t, prdb, WithErrorHandler(errs.handler))
		t.Cleanup(p.Resume) // before the Client closes
		// The drift margin (lease/40 + 5ms) is what separates the local
		// deadline from the server's expiry: 5s leaves 52ms for reading PTTL.
		const lease = 5 * time.Second
		m := c.NewMutex(name, WithLease(lease))
		m.Lock()
		m.Lock()
		lost := m.Lost()
		require.NoError(t, direct.Ping(ctx).Err()) // connected before the clock matters

		p.Pause()
		await(t, lost, "Lost to close")
		pttl, err := direct.PTTL(ctx, k.hash).Result()
		require.NoError(t, err)
		assert.Greater(t, pttl, time.Duration(0), "PTTL on the server when Lost closed")
		p.Resume()
		waitFor(t, "the error handler to hear of the loss", func() bool { return len(errs.matching(ErrLockLost)) > 0 })

		assert.ErrorIs(t, m.UnlockContext(ctx), ErrLockLost)
		assert.NotPanics(t, m.Unlock, "Unlock of a lost hold")
		assert.Equal(t, 0, m.HoldCount())
		// The last Unlock deleted what was left of the hold on the server.
		assert.Equal(t, int64(0), direct.Exists(ctx, k.hash).Val(), "key after the last Unlock")
	})
}

// childFence reads the child's "locked <fence>" event.
func childFence(t *testing.T, ch *redistest.Child) int64 {
	t.Helper()
	f := ch.Expect(t, "locked", hangGuard)
	require.Len(t, f, 1, "the child said locked %q, want \"locked <fence>\"", f)
	fence, err := strconv.ParseInt(f[0], 10, 64)
	require.NoError(t, err, "the child said locked %q, want \"locked <fence>\"", f)
	return fence
}

// TestKilledHolderProcess: a holder process that dies (SIGKILL) blocks the
// lock until its lease runs out, then a waiter gets it with a higher fencing
// token.
func TestKilledHolderProcess(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		rdb := b.rdb(t)
		const lease = 1500 * time.Millisecond // the child keeps its hold until the waiter queues, on a busy machine too
		child := startChildHolder(t, b.addr, name, lease)
		childToken := childFence(t, child)

		w := goLock(t, b.client(t).NewMutex(name, WithFencing()))
		waitFor(t, "the waiter in the queue", func() bool { return rdb.LLen(ctx, k.queue).Val() == 1 })
		child.Kill()
		b.fastForward(lease)
		require.NoError(t, await(t, w.locked, "the waiter to get the lock"))
		assert.Greater(t, w.fence.Load(), childToken, "the waiter's fencing token vs the dead holder's")
		w.release()
		require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
	})
}

// TestPausedHolderProcess: a holder process paused (SIGSTOP) past its lease
// loses the lock to a waiter; when it runs again its Lost channel closes and
// its Unlock reports ErrLockLost without touching the new holder's hold.
func TestPausedHolderProcess(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		rdb := b.rdb(t)
		const lease = 1500 * time.Millisecond // the child keeps its hold until the waiter queues, on a busy machine too
		child := startChildHolder(t, b.addr, name, lease)
		childToken := childFence(t, child)

		wc := b.client(t)
		w := goLock(t, wc.NewMutex(name, WithFencing()))
		waitFor(t, "the waiter in the queue", func() bool { return rdb.LLen(ctx, k.queue).Val() == 1 })
		child.Signal(t, syscall.SIGSTOP)
		b.fastForward(lease)
		require.NoError(t, await(t, w.locked, "the waiter to get the lock"))
		assert.Greater(t, w.fence.Load(), childToken, "the waiter's fencing token vs the paused holder's")

		child.Signal(t, syscall.SIGCONT)
		assert.Equal(t, []string{"true"}, child.Expect(t, "lost", hangGuard), "the child's report: lost, and UnlockContext said ErrLockLost")
		fields := rdb.HKeys(ctx, k.hash).Val()
		if assert.Len(t, fields, 1, "holds in Redis after the child unlocked") {
			assert.True(t, strings.HasPrefix(fields[0], wc.id+":"), "holder in Redis: got %s, want the waiter's client", fields[0])
		}
		w.release()
		require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
	})
}

// doubleScripts is a hook that sends every script call twice, as go-redis
// does when the reply to the first was lost.
func doubleScripts() redis.Hook {
	return hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		// (As go-redis does: a command marked NoRetry, a release, is never
		// sent again by the redis client.)
		if s, _ := scriptCall(cmd); s != "" && !cmd.NoRetry() {
			_ = next(ctx, cmd)
		}
		return next(ctx, cmd)
	}}
}

func TestScriptsAppliedTwice(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		rdb := b.rdb(t)
		crdb := b.rdb(t)
		crdb.AddHook(doubleScripts())
		errs := newErrorLog()
		m := clientOn(t, crdb, WithErrorHandler(errs.handler)).NewMutex(name, WithFencing())

		for i := 1; i <= 3; i++ {
			require.NoError(t, m.LockContext(ctx))
			assert.Equal(t, []string{fmt.Sprint(i)}, hashCounts(t, rdb, k.hash), "hold counts in Redis after Lock #%d", i)
		}
		fence := m.Fence()
		counter, err := rdb.Get(ctx, k.fence).Int64()
		require.NoError(t, err)
		assert.Equal(t, counter, fence, "fence counter after a doubled acquire")
		for i := 2; i >= 0; i-- {
			require.NoError(t, m.UnlockContext(ctx), "Unlock down to %d", i)
			if i > 0 {
				assert.Equal(t, []string{fmt.Sprint(i)}, hashCounts(t, rdb, k.hash), "hold counts in Redis after Unlock to %d", i)
			}
		}
		assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash).Val(), "key after the doubled final release")

		require.NoError(t, m.LockContext(ctx))
		assert.Equal(t, fence+1, m.Fence(), "fence of the next acquisition")
		require.NoError(t, m.UnlockContext(ctx))

		// A hand-off through the queue, every call doubled on both sides: the
		// doubled final release hands the lock on once and reports success.
		wrdb := b.rdb(t)
		wrdb.AddHook(doubleScripts())
		wc := clientOn(t, wrdb, WithErrorHandler(errs.handler))
		require.NoError(t, m.LockContext(ctx))
		w := goLock(t, wc.NewMutex(name, WithFencing()))
		waitFor(t, "the waiter in the queue", func() bool { return rdb.LLen(ctx, k.queue).Val() == 1 })
		require.NoError(t, m.UnlockContext(ctx), "doubled final release with a hand-off")
		require.NoError(t, await(t, w.locked, "the waiter to get the lock"))
		fields, err := rdb.HGetAll(ctx, k.hash).Result()
		require.NoError(t, err)
		require.Len(t, fields, 1, "holds in Redis")
		for owner, count := range fields {
			assert.True(t, strings.HasPrefix(owner, wc.id+":"), "holder in Redis: got %s, want the waiter's client", owner)
			assert.Equal(t, "1", count, "the waiter's hold count in Redis")
		}
		w.release()
		require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
		assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash, k.queue).Val(), "keys left behind")
		assert.Empty(t, errs.all(), "errors reported")
	})
}

// TestFencing: tokens increase strictly across acquisitions by any Client,
// stay the same for nested acquisitions, and keep increasing after Redis
// loses everything (a restart without persistence).
func TestFencing(t *testing.T) {
	eachFreshBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		ctx := context.Background()
		c1, c2 := b.client(t), b.client(t)
		ms := []*DistMutex{c1.NewMutex(name, WithFencing()), c2.NewMutex(name, WithFencing()), c1.NewMutex(name, WithFencing())}
		var last int64
		acquire := func(what string, m *DistMutex) {
			t.Helper()
			require.NoError(t, m.LockContext(ctx), what)
			f := m.Fence()
			assert.Greater(t, f, last, "%s: fence", what)
			require.NoError(t, m.LockContext(ctx), what)
			assert.Equal(t, f, m.Fence(), "%s: fence of a nested acquisition", what)
			require.NoError(t, m.UnlockContext(ctx), what)
			assert.Equal(t, f, m.Fence(), "%s: fence after a nested release", what)
			require.NoError(t, m.UnlockContext(ctx), what)
			last = f
		}
		for i := 0; i < 6; i++ {
			acquire(fmt.Sprintf("acquisition %d", i), ms[i%len(ms)])
		}
		// Goroutines of one Client draw tokens of their own.
		acquire("acquisition by another goroutine", ms[0])
		got := inGoroutine(t, func() int64 {
			if err := ms[0].LockContext(ctx); err != nil {
				return -1
			}
			defer ms[0].Unlock()
			return ms[0].Fence()
		})
		assert.Greater(t, got, last, "fence drawn by another goroutine")
		last = got

		before := time.Now().UnixMicro()
		b.restart(t)
		acquire("first acquisition after the restart, same Client", ms[0])
		assert.Greater(t, last, before, "first token after the restart: want it seeded from the server clock in µs")
		acquire("acquisition after the restart, new Client", b.client(t).NewMutex(name, WithFencing()))
		acquire("acquisition after the restart, other Client", ms[1])
	})
}
