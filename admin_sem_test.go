package remutex

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests of Inspect and ForceUnlock on a DistSemaphore (admin.go).

// semKeyNames are the keys of a semaphore under the default prefix.
type semKeyNames struct {
	holders, fence, queue, size string
}

func semKeysOf(name string) semKeyNames {
	k := semKeys(DefaultKeyPrefix, name)
	return semKeyNames{holders: k[0], fence: k[1], queue: k[2], size: k[3]}
}

// semAcquire is an Acquire on a goroutine of its own. Its context is
// cancelled at cleanup, which ends a wait, and its goroutine joined.
type semAcquire struct {
	acquired chan error // the result of Acquire
	lost     <-chan struct{}
	fence    int64 // lost and fence are set before acquired gets nil
	exited   chan struct{}
}

// goAcquire acquires n permits of s on a goroutine of its own (see
// semAcquire).
func goAcquire(t *testing.T, s *DistSemaphore, n int64) *semAcquire {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := &semAcquire{acquired: make(chan error, 1), exited: make(chan struct{})}
	go func() {
		defer close(a.exited)
		err := s.Acquire(ctx, n)
		if err == nil {
			a.lost, a.fence = s.Lost(), s.Fence()
		}
		a.acquired <- err
	}()
	t.Cleanup(func() {
		cancel()
		<-a.exited
	})
	return a
}

// notAcquired fails the test if a's Acquire returned already.
func (a *semAcquire) notAcquired(t *testing.T, what string) {
	t.Helper()
	select {
	case err := <-a.acquired:
		t.Fatalf("%s: Acquire returned (%v), want it still waiting", what, err)
	default:
	}
}

// holderOf returns the holder in info whose owner token is of Client c.
func holderOf(t *testing.T, info LockInfo, c *Client) Holder {
	t.Helper()
	for _, h := range info.Holders {
		if strings.HasPrefix(h.Owner, c.id+":") {
			return h
		}
	}
	t.Fatalf("no holder of Client %s in %+v", c.id, info.Holders)
	return Holder{}
}

// TestInspectSemaphore reads a semaphore of size 3 held by one Client (a
// lone holder, whose deadline is its key's expiry), then by two Clients
// with 1 and 2 permits and a third Client waiting for 2 permits.
func TestInspectSemaphore(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := semKeysOf(name)
		ctx := testCtx(t, hangGuard)
		const lease = 10 * time.Second
		admin := b.client(t)
		ca, cb, cw := b.client(t), b.client(t), b.client(t)

		info, err := admin.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, "", info.Kind, "Kind before the semaphore is used")
		assert.Zero(t, info.Size, "Size before the semaphore is used")

		sa := ca.NewSemaphore(name, 3, WithLease(lease), WithFencing())
		require.NoError(t, sa.Acquire(ctx, 1))
		info, err = admin.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, "semaphore", info.Kind, "Kind")
		assert.Equal(t, k.holders, info.Key, "Key: the holders hash")
		assert.Equal(t, int64(3), info.Size, "Size")
		if assert.Len(t, info.Holders, 1, "a lone holder") {
			assertHolder(t, info.Holders[0], ca, false, 1, lease)
			assert.Equal(t, info.Holders[0].TTL, info.TTL, "the semaphore's TTL: its holder's")
		}
		assert.Equal(t, sa.Fence(), info.Fence, "fence: the holder's token")
		assert.Nil(t, info.Others, "others")

		sb := cb.NewSemaphore(name, 3, WithLease(lease), WithFencing())
		require.NoError(t, sb.Acquire(ctx, 2))
		w := goAcquire(t, cw.NewSemaphore(name, 3, WithLease(lease), WithFencing()), 2)
		info = inspectUntil(t, admin, name, "the waiter queued and subscribed", func(i LockInfo) bool {
			return len(i.Waiters) == 1 && i.Subscribers == 1
		})

		assert.Equal(t, "semaphore", info.Kind, "Kind")
		assert.Equal(t, int64(3), info.Size, "Size")
		if assert.Len(t, info.Holders, 2, "holders") {
			assert.Less(t, info.Holders[0].Owner, info.Holders[1].Owner, "holders sorted by owner token")
			assertHolder(t, holderOf(t, info, ca), ca, false, 1, lease)
			assertHolder(t, holderOf(t, info, cb), cb, false, 2, lease)
			assert.Equal(t, max(info.Holders[0].TTL, info.Holders[1].TTL), info.TTL, "the semaphore's TTL: its longest lease")
		}
		assert.Equal(t, sb.Fence(), info.Fence, "fence: the latest holder's token")
		assert.Zero(t, info.Readers, "readers")
		if assert.Len(t, info.Waiters, 1, "waiters") {
			wt := info.Waiters[0]
			assertWaiter(t, wt, cw, false)
			assert.Equal(t, 2, wt.Permits, "the permits the waiter asks for")
			assert.WithinDuration(t, time.Now(), wt.Since, time.Hour, "waiter's arrival") // a sanity bound
		}
		assert.Zero(t, info.WritersWaiting, "writers waiting")
		assert.Nil(t, info.Others, "others")

		// Nothing was written: both still hold, the waiter waits.
		assert.Equal(t, int64(1), sa.Held())
		assert.Equal(t, int64(2), sb.Held())
		w.notAcquired(t, "the waiter while all permits are held")
		require.NoError(t, sb.ReleaseContext(ctx, 2))
		require.NoError(t, await(t, w.acquired, "the waiter once 2 permits were released"))
		info, err = admin.Inspect(ctx, name)
		require.NoError(t, err)
		assertHolder(t, holderOf(t, info, cw), cw, false, 2, lease)
		assert.Empty(t, info.Waiters, "waiters once the waiter holds")
	})
}

// TestForceUnlockSemaphore frees the 2 permits of one holder of a semaphore
// of size 3: the waiter that asks for 2 is handed them by a message to its
// Client, as after a Release, the other holder keeps its permit, and the
// freed holder finds its permits lost.
func TestForceUnlockSemaphore(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := semKeysOf(name)
		ctx := testCtx(t, hangGuard)
		rdb := b.rdb(t)
		const short = 2400 * time.Millisecond // renewed every 800ms: a loss is found soon, a busy machine loses no hold
		admin := b.client(t)
		ca := b.client(t)
		cb, errs := clientWithErrors(t, b.rdb(t))
		cw := b.client(t)

		sa := ca.NewSemaphore(name, 3, WithLease(short), WithFencing())
		require.NoError(t, sa.Acquire(ctx, 1))
		sb := cb.NewSemaphore(name, 3, WithLease(short), WithFencing())
		require.NoError(t, sb.Acquire(ctx, 2))
		lostB, fenceB := sb.Lost(), sb.Fence()
		ps := rdb.Subscribe(ctx, k.holders+releasedInfix+cw.id) // the waiter's Client's channel
		t.Cleanup(func() { _ = ps.Close() })
		_, err := ps.Receive(ctx)
		require.NoError(t, err)
		w := goAcquire(t, cw.NewSemaphore(name, 3, WithLease(short), WithFencing()), 2)
		awaitInQueue(t, rdb, k.queue, 1)

		info, err := admin.Inspect(ctx, name)
		require.NoError(t, err)
		require.Len(t, info.Holders, 2)
		ownerA, ownerB := holderOf(t, info, ca).Owner, holderOf(t, info, cb).Owner

		released, err := admin.ForceUnlock(ctx, name, "someone:1")
		require.NoError(t, err)
		assert.False(t, released, "ForceUnlock of an owner that holds nothing")
		assert.ElementsMatch(t, []string{ownerA, ownerB}, rdb.HKeys(ctx, k.holders).Val(), "holders after that")

		released, err = admin.ForceUnlock(ctx, name, ownerB)
		require.NoError(t, err)
		assert.True(t, released, "ForceUnlock of the holder of 2 permits")
		msg := await(t, ps.Channel(), "a grant to the waiter's Client")
		assert.Regexp(t, `^g \d+ \d+:S:\d+-\d+\.\d+\.2:`, msg.Payload, "the message: a grant of the waiter's entry, 2 permits")
		require.NoError(t, await(t, w.acquired, "the waiter to be handed the permits"))
		assert.Greater(t, w.fence, fenceB, "the waiter's fencing token")

		info, err = admin.Inspect(ctx, name)
		require.NoError(t, err)
		if assert.Len(t, info.Holders, 2, "holders after the forced release") {
			assert.Equal(t, ownerA, holderOf(t, info, ca).Owner, "the other holder keeps its permit")
			assertHolder(t, holderOf(t, info, ca), ca, false, 1, short)
			assertHolder(t, holderOf(t, info, cw), cw, false, 2, short)
		}
		assert.Empty(t, info.Waiters, "waiters after the forced release")
		assert.Equal(t, int64(1), sa.Held(), "the other holder's permits")

		await(t, lostB, "the freed holder's Lost to close")
		assert.ErrorIs(t, sb.ReleaseContext(ctx, 2), ErrLockLost, "the freed holder's ReleaseContext")
		errs.await(t, ErrLockLost, hangGuard, "the freed holder's error handler to hear of the loss")

		released, err = admin.ForceUnlock(ctx, name)
		require.NoError(t, err)
		assert.True(t, released, "ForceUnlock of every holder")
		assert.Zero(t, rdb.Exists(ctx, k.holders, k.queue).Val(), "holders and queue left")
		assert.Equal(t, "3", rdb.Get(ctx, k.size).Val(), "the size is kept")
		info, err = admin.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, "semaphore", info.Kind, "Kind of a free semaphore: its size is kept")
		assert.Empty(t, info.Holders, "holders of the free semaphore")
		assert.Zero(t, info.TTL, "TTL of the free semaphore")
		assert.Equal(t, int64(3), info.Size, "Size of the free semaphore")
	})
}

// TestAdminSemaphoreAmongKinds: a DistMutex and a DistSemaphore of one name
// are two locks: Inspect shows both (the mutex first), and ForceUnlock
// releases the holds of both.
func TestAdminSemaphoreAmongKinds(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, mk, rdb := semKeysOf(name), keysOf(name), b.rdb(t)
		ctx := testCtx(t, hangGuard)
		admin := b.client(t)
		cm, cs := b.client(t), b.client(t)

		m := goLock(t, cm.NewMutex(name))
		require.NoError(t, await(t, m.locked, "the mutex"))
		s := cs.NewSemaphore(name, 2)
		require.NoError(t, s.Acquire(ctx, 2))
		info, err := admin.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, "mutex", info.Kind, "Kind: the mutex first")
		require.Len(t, info.Others, 1, "others")
		o := info.Others[0]
		assert.Equal(t, "semaphore", o.Kind, "the other's Kind")
		assert.Equal(t, k.holders, o.Key, "the other's Key")
		assert.Equal(t, int64(2), o.Size, "the other's Size")
		if assert.Len(t, o.Holders, 1, "the semaphore's holders") {
			assertHolder(t, o.Holders[0], cs, false, 2, DefaultLease)
		}

		released, err := admin.ForceUnlock(ctx, name)
		require.NoError(t, err)
		assert.True(t, released, "ForceUnlock of both kinds")
		assert.Zero(t, rdb.Exists(ctx, mk.hash, k.holders).Val(), "holds left")
		// The mutex's Unlock finds nothing: taken as a resend, done, unless
		// its watchdog found the loss first.
		m.release()
		if err := await(t, m.unlocked, "the released mutex's Unlock"); err != nil {
			assert.ErrorIs(t, err, ErrLockLost)
		}
	})
}

// TestAdminSemaphoreErrors: what is not a semaphore's under its keys is
// reported as a *WrongTypeError by Inspect and ForceUnlock, and left alone.
func TestAdminSemaphoreErrors(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		c := b.client(t)
		rdb := b.rdb(t)
		for _, tc := range []struct {
			what  string
			key   func(semKeyNames) string
			plant func(key string) error
			typ   string
		}{
			{"string at the holders key", func(k semKeyNames) string { return k.holders }, func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }, "string"},
			{"field that is no holding", func(k semKeyNames) string { return k.holders }, func(key string) error { return rdb.HSet(ctx, key, "someone:1", "precious").Err() }, "foreign-field"},
			{"hash at the size key", func(k semKeyNames) string { return k.size }, func(key string) error { return rdb.HSet(ctx, key, "f", "precious").Err() }, "hash"},
			{"text at the size key", func(k semKeyNames) string { return k.size }, func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }, nonInteger},
			{"negative size", func(k semKeyNames) string { return k.size }, func(key string) error { return rdb.Set(ctx, key, "-2", 0).Err() }, nonInteger},
			{"text at the fence key", func(k semKeyNames) string { return k.fence }, func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }, nonInteger},
			{"string at the queue key", func(k semKeyNames) string { return k.queue }, func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }, "string"},
		} {
			name := lockName(t) + "." + tc.what
			key := tc.key(semKeysOf(name))
			require.NoError(t, tc.plant(key))
			wantAdminWrongType(t, c, rdb, name, key, tc.typ, tc.what)
		}
	})
}

// TestParseWaiterSemaphore decodes queue entries of each kind of lock: a
// semaphore's carry the permits asked for after the arrival.
func TestParseWaiterSemaphore(t *testing.T) {
	owner := "AAAAAAAAAAAAAAAAAAAAAA.db-1.4711:n7"
	for _, tc := range []struct {
		entry string
		want  Waiter
		flag  string
	}{
		{"750:0:3.1700000000000:" + owner, Waiter{Owner: owner, Since: time.UnixMilli(1700000000000)}, "0"},
		{"750:r:3.1700000000000:" + owner, Waiter{Owner: owner, Read: true, Since: time.UnixMilli(1700000000000)}, "r"},
		{"750:s:3.1700000000000.5:" + owner, Waiter{Owner: owner, Permits: 5, Since: time.UnixMilli(1700000000000)}, "s"},
		{"750:S:12.1700000000001.1:" + owner, Waiter{Owner: owner, Permits: 1, Since: time.UnixMilli(1700000000001)}, "S"},
	} {
		w, flag, ok := parseWaiter(tc.entry)
		if !assert.True(t, ok, "parseWaiter(%q)", tc.entry) {
			continue
		}
		tc.want.Host, tc.want.PID = "db-1", 4711
		assert.Equal(t, tc.want, w, "parseWaiter(%q)", tc.entry)
		assert.Equal(t, tc.flag, flag, "flag of %q", tc.entry)
	}
	_, _, ok := parseWaiter("750:s:3.1700000000000.5")
	assert.False(t, ok, "an entry without an owner")
}
