package remutex

// Faults for DistRWMutex: a reader process that crashes (SIGKILL) or dies of
// a misuse panic, a Redis restart, and renewals blackholed by a proxy.

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// rwRole is a child that works a DistRWMutex (WithFencing) under the
// parent's commands, one per stdin line, all on one goroutine:
//
//	rlock      RLock; emits "rlocked <fence>"
//	lock       Lock; emits "locked <fence>"
//	runlock!   RUnlock, not recovered: a misuse panic kills the process
//	unlock!    Unlock, not recovered
//	exit       closes the Client and exits
func rwRole(cfg childConfig) int {
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	c := NewClient(rdb, WithLogger(slog.New(slog.DiscardHandler)))
	rw := c.NewRWMutex(cfg.Name, WithLease(cfg.Lease), WithFencing())
	redistest.Emit("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "rlock":
			rw.RLock()
			redistest.Emit("rlocked", rw.Fence())
		case "lock":
			rw.Lock()
			redistest.Emit("locked", rw.Fence())
		case "runlock!":
			rw.RUnlock()
		case "unlock!":
			rw.Unlock()
		case "exit":
			_ = c.Close()
			_ = rdb.Close()
			return 0
		}
	}
	return 0
}

// startRWChild starts a child in the role "rw" on lock name at addr.
func startRWChild(t testing.TB, addr, name string, lease time.Duration) *redistest.Child {
	t.Helper()
	ch := startChild(t, childConfig{Role: "rw", Addr: addr, Name: name, Lease: lease, ID: "rw"})
	ch.Expect(t, "ready", hangGuard)
	return ch
}

// TestRWMutexCrashedReader: a reader process holds alone (another reader,
// with a long lease, came and went, so the readers key lives long); a
// writer waits. While the process lives and renews, the writer waits, past
// several of its leases; once it is SIGKILLed, the writer gets in after at
// most its lease, long before the readers key would expire.
func TestRWMutexCrashedReader(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		// The reader process's renewals keep its hold on a busy machine.
		const lease, long = 1500 * time.Millisecond, 20 * time.Second
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		ctx := context.Background()
		other := b.client(t).NewRWMutex(name, WithLease(long))
		o := newFaultGoroutine(t)
		o.do(t, hangGuard, "RLock", other.RLock)
		child := startRWChild(t, b.addr, name, lease)
		child.Send(t, "rlock")
		child.Expect(t, "rlocked", hangGuard)
		w := newFaultGoroutine(t)
		wrw := b.client(t).NewRWMutex(name, WithLease(long))
		locked := w.async(wrw.Lock)
		awaitQueued(t, rdb, k, 1)
		o.do(t, hangGuard, "RUnlock", other.RUnlock)

		time.Sleep(2*lease + lease/2) // the time that passes is the point
		notYet(t, locked, "the writer while the reader process lives")
		assert.Equal(t, rwState{0, 1, 1}, rwStateOf(t, rdb, k), "writers, readers, queued while the reader process lives")
		child.Kill()
		killed := time.Now()
		at := faultAwait(t, locked, hangGuard, "the writer once the reader process died")
		took := at.Sub(killed)
		t.Logf("the writer got in %v after the reader process was killed (lease %v)", took, lease)
		assert.Less(t, took, lease+time.Second, "the writer's wait after the reader process died: want at most about its lease")
		if ttl := rdb.PTTL(ctx, k.readers).Val(); ttl > 0 {
			t.Logf("the readers key would have lived %v more", ttl)
		}
		w.do(t, hangGuard, "Unlock", wrw.Unlock)
	})
}

// TestRWMutexMisuseKillsProcess: RUnlock without a read hold and Unlock by
// a reader, not recovered, kill the process with sync's kind of message;
// the dead reader's hold then ends with its lease and a writer gets in.
func TestRWMutexMisuseKillsProcess(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		const lease = 300 * time.Millisecond
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		for _, tc := range []struct{ cmds, want string }{
			{"runlock!", "panic: remutex: RUnlock of unlocked DistRWMutex"},
			{"rlock unlock!", "panic: remutex: Unlock of unlocked DistRWMutex"},
		} {
			child := startRWChild(t, b.addr, name, lease)
			for _, cmd := range strings.Fields(tc.cmds) {
				child.Send(t, cmd)
				if cmd == "rlock" {
					child.Expect(t, "rlocked", hangGuard)
				}
			}
			faultAwait(t, child.Exited(), hangGuard, tc.cmds+": the child to die")
			assert.Contains(t, child.Stderr(), tc.want, "%s: the child's stderr", tc.cmds)
		}
		assert.Equal(t, int64(1), rdb.ZCard(context.Background(), k.readers).Val(), "read holds right after the reader died")
		b.fastForward(lease) // miniredis's keys expire only so: a lone reader's hold ends with its key
		var err error
		w := newFaultGoroutine(t)
		rw := b.client(t).NewRWMutex(name)
		w.do(t, hangGuard, "LockContext", func() { err = rw.LockContext(testCtx(t, hangGuard)) })
		require.NoError(t, err, "LockContext once the dead reader's lease ran out")
		w.do(t, hangGuard, "Unlock", rw.Unlock)
	})
}

// TestRWMutexServerRestarted: a restart without persistence loses every
// hold: the read holds and the write hold (of another name) are reported
// lost, their unlocks say ErrLockLost, and new holds get fences above the
// old ones (the counter is seeded from the server's clock).
func TestRWMutexServerRestarted(t *testing.T) {
	t.Parallel()
	eachFreshBackend(t, func(t *testing.T, b *testBackend) {
		const lease = 500 * time.Millisecond
		name := lockName(t)
		c, errs := clientWithErrors(t, b.rdb(t))
		rw := c.NewRWMutex(name, WithLease(lease), WithFencing())
		wrw := c.NewRWMutex(name+".w", WithLease(lease), WithFencing())
		r, w := newFaultGoroutine(t), newFaultGoroutine(t)
		var rlost, wlost <-chan struct{}
		var f1, f2 int64
		r.do(t, hangGuard, "Lock, Unlock, RLock", func() {
			rw.Lock()
			f1 = rw.Fence()
			rw.Unlock()
			rw.RLock()
			rlost = rw.Lost()
		})
		w.do(t, hangGuard, "Lock", func() { wrw.Lock(); f2, wlost = wrw.Fence(), wrw.Lost() })
		b.restart(t)
		await(t, rlost, "the read hold's Lost after the restart")
		await(t, wlost, "the write hold's Lost after the restart")
		waitFor(t, "the error handler to hear of two losses", func() bool { return errs.count(ErrLockLost) >= 2 })
		var rerr, werr error
		r.do(t, hangGuard, "RUnlockContext", func() { rerr = rw.RUnlockContext(context.Background()) })
		w.do(t, hangGuard, "UnlockContext", func() { werr = wrw.UnlockContext(context.Background()) })
		assert.ErrorIs(t, rerr, ErrLockLost, "RUnlockContext after the restart")
		assert.ErrorIs(t, werr, ErrLockLost, "UnlockContext after the restart")
		var g1, g2 int64
		r.do(t, hangGuard, "Lock", func() { rw.Lock(); g1 = rw.Fence(); rw.Unlock() })
		w.do(t, hangGuard, "Lock", func() { wrw.Lock(); g2 = wrw.Fence(); wrw.Unlock() })
		assert.Greater(t, g1, f1, "the fence after the restart")
		assert.Greater(t, g2, f2, "the fence after the restart")
	})
}

// TestRWMutexRenewalBlackholed: after a renewal, the holder's connection
// stops delivering (renewals vanish): it declares the hold lost within its
// lease, while the server still has it, and the waiter of another Client
// gets in only then.
// For a reader holding and a writer waiting, and the other way round.
func TestRWMutexRenewalBlackholed(t *testing.T) {
	// Serial: the loss must be declared within the drift margin before the server's expiry.
	for _, read := range []bool{true, false} {
		t.Run(map[bool]string{true: "Reader", false: "Writer"}[read], func(t *testing.T) {
			testRWBlackholed(t, read)
		})
	}
}

func testRWBlackholed(t *testing.T, read bool) {
	const lease = time.Second
	srv := redistest.Start(t)
	name := lockName(t)
	k, direct := rwKeysOf(name), rdbAt(t, srv.Addr())
	p := redistest.NewProxy(t, srv.Addr())
	renewed := make(chan struct{}, 1)
	hc, herrs := clientWithErrors(t, rdbAt(t, p.Addr()), WithHook(func(ev Event) {
		if ev.Kind == EventRenewed {
			select {
			case renewed <- struct{}{}:
			default:
			}
		}
	}))
	t.Cleanup(p.Heal) // before hc closes: a blackholed renewal would hold Close up
	hrw := hc.NewRWMutex(name, WithLease(lease))
	wrw := clientOn(t, direct).NewRWMutex(name, WithLease(lease))
	h, w := newFaultGoroutine(t), newFaultGoroutine(t)
	hold, release, wait, waitDone := hrw.RLock, hrw.RUnlockContext, wrw.Lock, wrw.Unlock
	if !read {
		hold, release, wait, waitDone = hrw.Lock, hrw.UnlockContext, wrw.RLock, wrw.RUnlock
	}
	var lost <-chan struct{}
	h.do(t, hangGuard, "hold", func() { hold(); lost = hrw.Lost() })
	locked := w.async(wait)
	awaitQueued(t, direct, k, 1)
	await(t, renewed, "a renewal of the hold")

	p.SetBlackhole(true)
	blackholed := time.Now()
	lostAt := faultAwait(t, lost, lease+time.Second, "the holder's Lost after its connection went dark")
	assert.Less(t, lostAt.Sub(blackholed), lease, "loss declared after the blackhole began: want within the lease")
	assert.Equal(t, int64(1), rwHoldsOn(t, direct, k, read), "holds on the server when the holder declared the loss (the holder must know first)")
	at := faultAwait(t, locked, lease+2*time.Second, "the waiter once the hold expired")
	assert.True(t, at.After(lostAt), "the waiter got in at %v, before the holder knew of the loss at %v", at, lostAt)

	p.Heal()
	var err error
	h.do(t, hangGuard, "unlock", func() { err = release(context.Background()) })
	assert.True(t, errors.Is(err, ErrLockLost), "the holder's unlock after the loss: got %v, want ErrLockLost", err)
	herrs.await(t, ErrLockLost, time.Second, "the holder's loss")
	w.do(t, hangGuard, "unlock", waitDone)
}

// rwHoldsOn counts the live read holds (read) or the write holds on the
// server.
func rwHoldsOn(t testing.TB, rdb *redis.Client, k rwKeyNames, read bool) int64 {
	t.Helper()
	ctx := context.Background()
	if !read {
		return rdb.HLen(ctx, k.w).Val()
	}
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	n, err := rdb.ZCount(ctx, k.readers, "("+strconv.FormatInt(now.UnixMilli(), 10), "+inf").Result()
	require.NoError(t, err)
	return n
}
