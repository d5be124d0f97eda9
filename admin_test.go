package remutex

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// Tests of the inspection and admin API (admin.go) and of Client ids that
// name their host and process.

// clientIDForm is the form of a Client id: <22 base64url>.<host>.<pid>.
var clientIDForm = regexp.MustCompile(`^[A-Za-z0-9_-]{22}\.[A-Za-z0-9._-]+\.\d+$`)

func TestClientID(t *testing.T) {
	c := clientOn(t, rdbAt(t, "127.0.0.1:1")) // sends nothing
	assert.Regexp(t, clientIDForm, c.id, "Client id")
	assert.True(t, strings.HasSuffix(c.id, "."+strconv.Itoa(os.Getpid())), "Client id %q: want it to end in .<pid> %d", c.id, os.Getpid())
	host, pid := ownerOrigin(c.id + ":1")
	assert.Equal(t, hostname(), host, "host of an owner token")
	assert.Equal(t, os.Getpid(), pid, "pid of an owner token")

	// Host names become what scripts and channels can carry: no ':' (the
	// end of the Client id in an owner token), braces or white space.
	for _, tc := range []struct{ in, want string }{
		{"db-1.example.com", "db-1.example.com"},
		{"", "unknown"},
		{"a:b{c}d e\tf\n", "a_b_c_d_e_f_"},
		{"höst", "h__st"},
		{strings.Repeat("h", 100), strings.Repeat("h", maxHostLen)},
	} {
		got := hostPart(tc.in)
		assert.Equal(t, tc.want, got, "hostPart(%q)", tc.in)
		id := clientID(strings.Repeat("A", 22), got, 42)
		assert.Regexp(t, clientIDForm, id, "Client id with host %q", tc.in)
		h, pid := ownerOrigin(id + ":7")
		assert.Equal(t, got, h, "host parsed back from %q", id)
		assert.Equal(t, 42, pid, "pid parsed back from %q", id)
	}

	// Tokens of another form have no origin.
	for _, owner := range []string{strings.Repeat("d", 32) + ":1", "x", "a.b:1", "a.b.c:1"} {
		h, pid := ownerOrigin(owner)
		assert.True(t, h == "" && pid == 0, "ownerOrigin(%q): got (%q, %d), want (\"\", 0)", owner, h, pid)
	}
}

// TestInspect reads a free lock, then one held (nested, fenced) with a
// waiter from another Client queued and subscribed.
func TestInspect(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		// Glob characters in the name: Subscribers must count this lock's
		// channels only, not those of a lock whose name the pattern matches.
		base := lockName(t)
		name := base + "x*?x"
		other := base + "x-other-ax" // matched, like name, by name's channels unescaped as a pattern
		ctx := testCtx(t, hangGuard)
		admin := b.client(t)
		ca, cb, cc := b.client(t), b.client(t), b.client(t)

		info, err := admin.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, LockInfo{Name: name, Key: keysOf(name).hash, Holders: []Holder{}, Waiters: []Waiter{}}, info, "a free lock")

		m := ca.NewMutex(name, WithFencing(), WithLease(10*time.Second))
		m.Lock()
		m.Lock()
		defer m.Unlock()
		defer m.Unlock()
		hm := cc.NewMutex(other)
		hm.Lock()
		defer hm.Unlock()
		w := goLock(t, cb.NewMutex(name))
		goLock(t, cc.NewMutex(other)) // another Client waits for the other lock
		rdb := b.rdb(t)
		waitFor(t, "the waiters queued and subscribed", func() bool {
			i, err := admin.Inspect(ctx, name)
			subs := rdb.PubSubNumSub(ctx, keysOf(name).channel+cb.id, keysOf(other).channel+cc.id).Val()
			return err == nil && len(i.Waiters) == 1 && subs[keysOf(name).channel+cb.id] == 1 && subs[keysOf(other).channel+cc.id] == 1
		})

		info, err = admin.Inspect(ctx, name)
		require.NoError(t, err)
		host, _ := os.Hostname()
		assert.Equal(t, name, info.Name)
		assert.Equal(t, keysOf(name).hash, info.Key)
		if assert.Len(t, info.Holders, 1, "holders") {
			h := info.Holders[0]
			assert.True(t, strings.HasPrefix(h.Owner, ca.id+":"), "holder %q: want an owner token of Client %s", h.Owner, ca.id)
			assert.Equal(t, 2, h.Count, "hold count")
			assert.Equal(t, hostPart(host), h.Host, "holder's host")
			assert.Equal(t, os.Getpid(), h.PID, "holder's pid")
		}
		assert.True(t, info.TTL > 0 && info.TTL <= 10*time.Second, "TTL: got %v, want within the 10s lease", info.TTL)
		assert.Equal(t, m.Fence(), info.Fence, "fence")
		if assert.Len(t, info.Waiters, 1, "waiters") {
			wt := info.Waiters[0]
			assert.True(t, strings.HasPrefix(wt.Owner, cb.id+":"), "waiter %q: want an owner token of Client %s", wt.Owner, cb.id)
			assert.Equal(t, hostPart(host), wt.Host, "waiter's host")
			assert.Equal(t, os.Getpid(), wt.PID, "waiter's pid")
			// The server's clock, on this machine: a generous sanity bound.
			assert.WithinDuration(t, time.Now(), wt.Since, time.Hour, "waiter's arrival")
		}
		assert.Equal(t, 1, info.Subscribers, "subscribers: the waiting Client only, not the other lock's")

		// Nothing was written: the holder still holds, the waiter waits.
		assert.Equal(t, 2, m.HoldCount())
		select {
		case err := <-w.locked:
			t.Fatalf("the waiter got the lock (%v) while it was held", err)
		default:
		}
	})
}

// TestForceUnlock frees a lock held by another Client: the lock's waiter is
// told by a message on its Client's channel, as after an Unlock, and the
// holder finds its hold lost.
func TestForceUnlock(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := testCtx(t, hangGuard)
		rdb := b.rdb(t)
		admin := b.client(t)
		ca, errs := clientWithErrors(t, b.rdb(t))
		cb := b.client(t)

		released, err := admin.ForceUnlock(ctx, name)
		assert.NoError(t, err, "ForceUnlock of a free lock")
		assert.False(t, released, "ForceUnlock of a free lock")

		m := ca.NewMutex(name, WithFencing(), WithLease(600*time.Millisecond))
		m.Lock()
		lost := m.Lost()
		fence := m.Fence()
		info, err := admin.Inspect(ctx, name)
		require.NoError(t, err)
		require.Len(t, info.Holders, 1)
		owner := info.Holders[0].Owner

		// Owners that do not hold it: nothing is released.
		released, err = admin.ForceUnlock(ctx, name, owner+"0", "someone:1")
		assert.NoError(t, err)
		assert.False(t, released, "ForceUnlock of owners that do not hold the lock")
		assert.Equal(t, []string{owner}, rdb.HKeys(ctx, k.hash).Val(), "holders after that")

		ps := rdb.Subscribe(ctx, k.channel+cb.id) // the waiter's Client's channel
		t.Cleanup(func() { _ = ps.Close() })
		_, err = ps.Receive(ctx)
		require.NoError(t, err)
		w := goLock(t, cb.NewMutex(name, WithFencing()))
		awaitInQueue(t, rdb, k.queue, 1)

		released, err = admin.ForceUnlock(ctx, name, owner)
		require.NoError(t, err)
		assert.True(t, released, "ForceUnlock of the holder")
		// ForceUnlock releases as an uncontended Unlock does (HDEL, then a
		// wake of the queue): the waiter is told by a message, unless its own
		// refresh comes between the two, finds the lock free and takes it.
		select {
		case msg := <-ps.Channel():
			assert.Regexp(t, `^(w|g \d+) `, msg.Payload, "the message: a wake-up or a grant")
			require.NoError(t, await(t, w.locked, "the waiter to get the lock"))
		case err := <-w.locked:
			require.NoError(t, err, "the waiter's LockContext, by its own call")
		case <-time.After(hangGuard):
			t.Fatalf("neither a message to the waiter's Client nor the waiter's Lock after %v", hangGuard)
		}
		assert.Greater(t, w.fence.Load(), fence, "the waiter's fencing token")

		await(t, lost, "the holder's Lost to close")
		assert.ErrorIs(t, m.UnlockContext(ctx), ErrLockLost, "the holder's UnlockContext")
		// The handler runs after Lost closed, outside the Client's mutex: await it.
		errs.await(t, ErrLockLost, hangGuard, "the holder's error handler to hear of the loss")
		w.release()
		require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
		assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash, k.queue).Val(), "keys left")
	})
}

// TestAdminErrors: invalid names send nothing, keys of another type are
// reported and left alone, a closed Client and a quorum Client refuse.
func TestAdminErrors(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		var counter commandLog
		crdb := b.rdb(t)
		crdb.AddHook(&counter)
		c := clientOn(t, crdb)

		for _, name := range []string{"", "}x", strings.Repeat("n", MaxNameLen+1)} {
			assert.ErrorIs(t, CheckName(name), ErrInvalidName, "CheckName(%.20q)", name)
			_, err := c.Inspect(ctx, name)
			assert.ErrorIs(t, err, ErrInvalidName, "Inspect(%.20q)", name)
			if err != nil {
				assert.True(t, strings.HasPrefix(err.Error(), "remutex: ") && strings.Count(err.Error(), "remutex") == 1, "error %q: want one \"remutex: \" prefix", err)
			}
			released, err := c.ForceUnlock(ctx, name)
			assert.ErrorIs(t, err, ErrInvalidName, "ForceUnlock(%.20q)", name)
			assert.False(t, released)
		}
		assert.NoError(t, CheckName("x"))
		assert.NoError(t, CheckName(strings.Repeat("n", MaxNameLen)))
		dials, cmds := counter.counts()
		assert.Equal(t, 0, dials, "connections dialled for invalid names")
		assert.Empty(t, cmds, "commands sent for invalid names")

		rdb := b.rdb(t)
		for _, tc := range []struct {
			what  string
			key   func(lockKeyNames) string
			plant func(key string) error
			typ   string
		}{
			{"string at the hash key", func(k lockKeyNames) string { return k.hash }, func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }, "string"},
			{"list at the fence key", func(k lockKeyNames) string { return k.fence }, func(key string) error { return rdb.RPush(ctx, key, "precious").Err() }, "list"},
			{"text at the fence key", func(k lockKeyNames) string { return k.fence }, func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }, nonInteger},
			{"hash at the queue key", func(k lockKeyNames) string { return k.queue }, func(key string) error { return rdb.HSet(ctx, key, "f", "precious").Err() }, "hash"},
			{"string at the read/write lock's writer key", func(k lockKeyNames) string { return k.hash + ":rw" }, func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }, "string"},
			{"hash at the read/write lock's readers key", func(k lockKeyNames) string { return k.hash + ":rw:readers" }, func(key string) error { return rdb.HSet(ctx, key, "f", "precious").Err() }, "hash"},
			{"text at the read/write lock's fence key", func(k lockKeyNames) string { return k.hash + ":rw:fence" }, func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }, nonInteger},
			{"string at the read/write lock's queue key", func(k lockKeyNames) string { return k.hash + ":rw:waiting" }, func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }, "string"},
		} {
			name := lockName(t) + "." + tc.what
			k := keysOf(name)
			key := tc.key(k)
			require.NoError(t, tc.plant(key))
			wantAdminWrongType(t, c, rdb, name, key, tc.typ, tc.what)
		}

		closed := b.client(t)
		require.NoError(t, closed.Close())
		_, err := closed.Inspect(ctx, "x")
		assert.ErrorIs(t, err, ErrClosed, "Inspect after Close")
		_, err = closed.ForceUnlock(ctx, "x")
		assert.ErrorIs(t, err, ErrClosed, "ForceUnlock after Close")

		done, cancel := context.WithCancel(ctx)
		cancel()
		_, err = c.Inspect(done, "x")
		assert.ErrorIs(t, err, context.Canceled, "Inspect with a cancelled context")
	})
}

func TestAdminQuorum(t *testing.T) {
	rdbs := make([]redis.UniversalClient, 3)
	for i := range rdbs {
		rdbs[i] = rdbAt(t, miniredis.RunT(t).Addr())
	}
	q := NewQuorumClient(rdbs, WithLogger(testLogger(t)))
	t.Cleanup(func() { _ = q.Close() })
	ctx := testCtx(t, hangGuard)
	_, err := q.Inspect(ctx, "x")
	assert.ErrorIs(t, err, errors.ErrUnsupported, "Inspect on a quorum")
	released, err := q.ForceUnlock(ctx, "x")
	assert.ErrorIs(t, err, errors.ErrUnsupported, "ForceUnlock on a quorum")
	assert.False(t, released)
	_, err = q.Inspect(ctx, "")
	assert.ErrorIs(t, err, ErrInvalidName, "Inspect of an invalid name on a quorum")
}

// TestAdminCluster: on a Redis 7 cluster the waiter's subscription is a
// shard channel on the lock's master, and ForceUnlock wakes it there.
func TestAdminCluster(t *testing.T) {
	t.Parallel()
	redistest.RequireShardedPubSub(t)
	tc := redistest.StartCluster(t, 3, 0)
	ctx := testCtx(t, hangGuard)
	prefix := topoPrefix(t)
	name := "admin"
	admin := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	ca := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	cb := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	hash := prefix + "{" + name + "}"
	owner := tc.Owner(t, tc.Masters[0], tc.Slot(t, hash))

	m := ca.NewMutex(name, WithFencing())
	require.NoError(t, m.LockContext(ctx))
	lost := m.Lost()
	w := lockAsync(t, cb.NewMutex(name, WithFencing()), nil, "")
	waitFor(t, "the waiter queued and subscribed", func() bool {
		info, err := admin.Inspect(ctx, name)
		require.NoError(t, err)
		return len(info.Waiters) == 1 && info.Subscribers == 1
	})
	assert.Equal(t, int64(1), owner.ShardSubs(t, hash+":released:"+cb.id), "the waiter's shard subscription on the lock's master")
	info, err := admin.Inspect(ctx, name)
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	assert.True(t, strings.HasPrefix(info.Holders[0].Owner, ca.id+":"), "holder %q: want Client %s", info.Holders[0].Owner, ca.id)
	assert.Equal(t, m.Fence(), info.Fence)

	released, err := admin.ForceUnlock(ctx, name)
	require.NoError(t, err)
	assert.True(t, released)
	r := await(t, w.locked, "the waiter's LockContext to return")
	require.NoError(t, r.err)
	assert.Greater(t, r.fence, info.Fence, "the waiter's fencing token")
	await(t, lost, "the holder's Lost to close")
	assert.ErrorIs(t, m.UnlockContext(ctx), ErrLockLost)
	w.unlock()
	require.NoError(t, await(t, w.unlocked, "the waiter's UnlockContext"))
}

// adminHold holds a lock on a goroutine of its own: it locks at once, then
// unlocks when told to. Its context is cancelled at cleanup, which ends a
// wait, and its goroutine joined.
type adminHold struct {
	locked   chan error // the result of the lock call
	lost     <-chan struct{}
	fence    int64 // lost and fence are set before locked gets nil
	release  chan struct{}
	unlocked chan error // the result of the unlock call
	exited   chan struct{}
}

// goRW holds rw's write lock, or with read its read lock, on a goroutine of
// its own (see adminHold).
func goRW(t *testing.T, rw *DistRWMutex, read bool) *adminHold {
	t.Helper()
	lock, unlock := rw.LockContext, rw.UnlockContext
	if read {
		lock, unlock = rw.RLockContext, rw.RUnlockContext
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &adminHold{locked: make(chan error, 1), release: make(chan struct{}), unlocked: make(chan error, 1), exited: make(chan struct{})}
	go func() {
		defer close(h.exited)
		err := lock(ctx)
		if err == nil {
			h.lost, h.fence = rw.Lost(), rw.Fence()
		}
		h.locked <- err
		if err != nil {
			return
		}
		select {
		case <-h.release:
		case <-ctx.Done():
		}
		h.unlocked <- unlock(context.Background())
	}()
	t.Cleanup(func() {
		cancel()
		<-h.exited
	})
	return h
}

// awaitLocked waits for h to hold its lock.
func (h *adminHold) awaitLocked(t *testing.T, what string) {
	t.Helper()
	require.NoError(t, await(t, h.locked, what))
}

// unlock tells h to unlock and returns the unlock call's result.
func (h *adminHold) unlock(t *testing.T, what string) error {
	t.Helper()
	close(h.release)
	return await(t, h.unlocked, what)
}

// notLocked fails the test if h holds its lock already.
func (h *adminHold) notLocked(t *testing.T, what string) {
	t.Helper()
	select {
	case err := <-h.locked:
		t.Fatalf("%s: got the lock (%v), want it still waiting", what, err)
	default:
	}
}

// inspectUntil inspects lock name until cond holds, and returns what it read.
func inspectUntil(t *testing.T, c *Client, name, what string, cond func(LockInfo) bool) LockInfo {
	t.Helper()
	var info LockInfo
	waitFor(t, what, func() bool {
		var err error
		info, err = c.Inspect(context.Background(), name)
		require.NoError(t, err)
		return cond(info)
	})
	return info
}

// assertHolder checks one hold that Inspect reported: its owner's Client,
// mode, count, and a lease within lease.
func assertHolder(t *testing.T, h Holder, c *Client, read bool, count int, lease time.Duration) {
	t.Helper()
	assert.True(t, strings.HasPrefix(h.Owner, c.id+":"), "holder %q: want an owner token of Client %s", h.Owner, c.id)
	assert.Equal(t, read, h.Read, "holder %q: Read", h.Owner)
	assert.Equal(t, count, h.Count, "holder %q: hold count", h.Owner)
	assert.True(t, h.TTL > 0 && h.TTL <= lease, "holder %q: TTL %v, want within the %v lease", h.Owner, h.TTL, lease)
	assert.Equal(t, os.Getpid(), h.PID, "holder %q: pid", h.Owner)
}

// assertWaiter checks one queue entry that Inspect reported.
func assertWaiter(t *testing.T, w Waiter, c *Client, read bool) {
	t.Helper()
	assert.True(t, strings.HasPrefix(w.Owner, c.id+":"), "waiter %q: want an owner token of Client %s", w.Owner, c.id)
	assert.Equal(t, read, w.Read, "waiter %q: Read", w.Owner)
	assert.Equal(t, os.Getpid(), w.PID, "waiter %q: pid", w.Owner)
}

// TestInspectRWMutex reads a DistRWMutex held for writing (nested, fenced)
// with two readers and then a writer queued, then held by the two readers
// that the write's Unlock let in, the writer still queued, and at last
// free; and Inspect costs one script call.
func TestInspectRWMutex(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		const lease = 10 * time.Second
		var calls commandLog
		ardb := b.rdb(t)
		ardb.AddHook(&calls)
		admin := clientOn(t, ardb)
		cw, cr1, cr2, cw2 := b.client(t), b.client(t), b.client(t), b.client(t)

		w := cw.NewRWMutex(name, WithFencing(), WithLease(lease))
		g := newFaultGoroutine(t)
		var fence int64
		g.do(t, hangGuard, "Lock twice", func() { w.Lock(); w.Lock(); fence = w.Fence() })
		r1 := goRW(t, cr1.NewRWMutex(name, WithLease(lease)), true)
		awaitQueued(t, rdb, k, 1)
		r2 := goRW(t, cr2.NewRWMutex(name, WithLease(lease)), true)
		awaitQueued(t, rdb, k, 2)
		w2 := goRW(t, cw2.NewRWMutex(name, WithLease(lease)), false)
		inspectUntil(t, admin, name, "three waiters queued and subscribed", func(i LockInfo) bool {
			return len(i.Waiters) == 3 && i.Subscribers == 3
		})
		start := time.Now()
		info, err := admin.Inspect(context.Background(), name)
		require.NoError(t, err)
		assert.Equal(t, 1, scriptCalls(calls.since(start)), "script calls of one Inspect")
		assert.Equal(t, 3, info.Subscribers, "subscribers: the three waiting Clients")

		assert.Equal(t, "rwmutex", info.Kind, "Kind")
		assert.Equal(t, k.w, info.Key, "Key: the writer hash")
		if assert.Len(t, info.Holders, 1, "holders") {
			assertHolder(t, info.Holders[0], cw, false, 2, lease)
			assert.Equal(t, info.Holders[0].TTL, info.TTL, "the lock's TTL: its writer's")
		}
		assert.Equal(t, fence, info.Fence, "fence: the writer's token")
		assert.Zero(t, info.Readers, "readers")
		if assert.Len(t, info.Waiters, 3, "waiters") {
			assertWaiter(t, info.Waiters[0], cr1, true)
			assertWaiter(t, info.Waiters[1], cr2, true)
			assertWaiter(t, info.Waiters[2], cw2, false)
		}
		assert.Equal(t, 1, info.WritersWaiting, "writers waiting")
		assert.Nil(t, info.Others, "others: no mutex of the name")

		// The write's Unlock lets in both readers at the head of the queue.
		g.do(t, hangGuard, "Unlock twice", func() { w.Unlock(); w.Unlock() })
		r1.awaitLocked(t, "the first reader once the writer left")
		r2.awaitLocked(t, "the second reader once the writer left")
		info, err = admin.Inspect(context.Background(), name)
		require.NoError(t, err)
		assert.Equal(t, "rwmutex", info.Kind, "Kind while read")
		if assert.Len(t, info.Holders, 2, "holders while read") {
			readers := []*Client{cr1, cr2}
			if info.Holders[0].Owner > info.Holders[1].Owner {
				t.Errorf("holders not sorted by owner: %q, %q", info.Holders[0].Owner, info.Holders[1].Owner)
			}
			if strings.HasPrefix(info.Holders[0].Owner, cr2.id) {
				readers[0], readers[1] = cr2, cr1
			}
			for i, h := range info.Holders {
				assertHolder(t, h, readers[i], true, 1, lease)
			}
			assert.Equal(t, max(info.Holders[0].TTL, info.Holders[1].TTL), info.TTL, "the lock's TTL: its longest read lease")
		}
		assert.Equal(t, 2, info.Readers, "readers")
		if assert.Len(t, info.Waiters, 1, "waiters while read") {
			assertWaiter(t, info.Waiters[0], cw2, false)
		}
		assert.Equal(t, 1, info.WritersWaiting, "writers waiting while read")
		assert.Equal(t, fence, info.Fence, "fence while read")
		w2.notLocked(t, "the writer while two readers hold")

		require.NoError(t, r1.unlock(t, "the first reader's RUnlock"))
		require.NoError(t, r2.unlock(t, "the second reader's RUnlock"))
		w2.awaitLocked(t, "the writer once the readers left")
		require.NoError(t, w2.unlock(t, "the writer's Unlock"))
		info, err = admin.Inspect(context.Background(), name)
		require.NoError(t, err)
		assert.Equal(t, "rwmutex", info.Kind, "Kind of a free read/write lock with a fence counter")
		assert.Empty(t, info.Holders, "holders of the free lock")
		assert.Zero(t, info.TTL, "TTL of the free lock")
		assert.Equal(t, fence, info.Fence, "fence: the counter stays (the second writer takes no token)")
	})
}

// scriptCalls counts the script calls (EVALSHA, EVAL) among cmds.
func scriptCalls(cmds []loggedCommand) int {
	n := 0
	for _, c := range cmds {
		if cmd := strings.ToLower(fmt.Sprint(c.args[0])); cmd == "evalsha" || cmd == "eval" {
			n++
		}
	}
	return n
}

// TestForceUnlockRWMutex frees a DistRWMutex held for writing by another
// Client: the two readers queued at its head are handed the lock by a
// message each, as after an Unlock, and the writer queued behind them stays
// queued; the holder finds its hold lost. Then the read holds are released,
// one owner's first: the last one hands the lock to the waiting writer.
func TestForceUnlockRWMutex(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		ctx := testCtx(t, hangGuard)
		const short = 2400 * time.Millisecond // renewed every 800ms: a loss is found soon, a busy machine loses no hold
		admin := b.client(t)
		cw, errs := clientWithErrors(t, b.rdb(t))
		cr1, cr2, cw2 := b.client(t), b.client(t), b.client(t)

		w := goRW(t, cw.NewRWMutex(name, WithFencing(), WithLease(short)), false)
		w.awaitLocked(t, "the writer")
		ps := rdb.Subscribe(ctx, k.readers+releasedInfix+cr1.id, k.readers+releasedInfix+cr2.id, k.w+releasedInfix+cw2.id)
		t.Cleanup(func() { _ = ps.Close() })
		for range 3 {
			_, err := ps.Receive(ctx)
			require.NoError(t, err)
		}
		r1 := goRW(t, cr1.NewRWMutex(name, WithLease(short)), true)
		awaitQueued(t, rdb, k, 1)
		r2 := goRW(t, cr2.NewRWMutex(name, WithLease(short)), true)
		awaitQueued(t, rdb, k, 2)
		w2 := goRW(t, cw2.NewRWMutex(name, WithFencing(), WithLease(short)), false)
		awaitQueued(t, rdb, k, 3)

		released, err := admin.ForceUnlock(ctx, name, "someone:1")
		require.NoError(t, err)
		assert.False(t, released, "ForceUnlock of an owner that holds nothing")
		assert.Equal(t, rwState{1, 0, 3}, rwStateOf(t, rdb, k), "writers, readers, queued after that")

		released, err = admin.ForceUnlock(ctx, name)
		require.NoError(t, err)
		assert.True(t, released, "ForceUnlock of the writer")
		msgs := map[string]string{}
		for range 2 {
			msg := await(t, ps.Channel(), "a grant to each reader's Client")
			msgs[msg.Channel] = msg.Payload
		}
		for _, c := range []*Client{cr1, cr2} {
			assert.Regexp(t, `^g 0 `, msgs[k.readers+releasedInfix+c.id], "the message to reader Client %s: a grant", c.id)
		}
		r1.awaitLocked(t, "the first reader, handed the lock")
		r2.awaitLocked(t, "the second reader, handed the lock")
		await(t, w.lost, "the writer's Lost to close")
		assert.ErrorIs(t, w.unlock(t, "the writer's UnlockContext"), ErrLockLost)
		errs.await(t, ErrLockLost, hangGuard, "the writer's error handler to hear of the loss")
		w2.notLocked(t, "the queued writer while the readers hold")

		info, err := admin.Inspect(ctx, name)
		require.NoError(t, err)
		require.Equal(t, 2, info.Readers, "readers after the forced release")
		assert.Equal(t, 1, info.WritersWaiting, "writers waiting after the forced release")
		first, last := r1, r2 // by owner token, as Inspect sorts them
		if strings.HasPrefix(info.Holders[0].Owner, cr2.id) {
			first, last = r2, r1
		}
		released, err = admin.ForceUnlock(ctx, name, info.Holders[0].Owner)
		require.NoError(t, err)
		assert.True(t, released, "ForceUnlock of one reader")
		assert.Equal(t, rwState{0, 1, 1}, rwStateOf(t, rdb, k), "writers, readers, queued with one reader left")
		w2.notLocked(t, "the queued writer while a reader holds")
		await(t, first.lost, "the released reader's Lost to close")
		assert.ErrorIs(t, first.unlock(t, "the released reader's RUnlockContext"), ErrLockLost)

		released, err = admin.ForceUnlock(ctx, name)
		require.NoError(t, err)
		assert.True(t, released, "ForceUnlock of the last reader")
		msg := await(t, ps.Channel(), "a grant to the waiting writer's Client")
		assert.Equal(t, k.w+releasedInfix+cw2.id, msg.Channel, "the message's channel")
		assert.Regexp(t, `^g \d+ `, msg.Payload, "the message to the writer's Client: a grant")
		w2.awaitLocked(t, "the waiting writer, handed the lock")
		assert.Greater(t, w2.fence, w.fence, "the second writer's fencing token")
		await(t, last.lost, "the last reader's Lost to close")
		assert.ErrorIs(t, last.unlock(t, "the last reader's RUnlockContext"), ErrLockLost)
		require.NoError(t, w2.unlock(t, "the second writer's Unlock"))
		assert.Zero(t, rdb.Exists(ctx, k.w, k.readers, k.queue).Val(), "keys left")
	})
}

// TestAdminMixedKinds: a DistMutex and a DistRWMutex of one name are two
// locks, and Inspect shows both (the mutex first, the other in Others) in
// one script call; ForceUnlock releases the holds of both, or those of the
// owners given.
func TestAdminMixedKinds(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, mk, rdb := rwKeysOf(name), keysOf(name), b.rdb(t)
		ctx := testCtx(t, hangGuard)
		var calls commandLog
		ardb := b.rdb(t)
		ardb.AddHook(&calls)
		admin := clientOn(t, ardb)
		cm, cr, cw := b.client(t), b.client(t), b.client(t)

		m := goLock(t, cm.NewMutex(name))
		require.NoError(t, await(t, m.locked, "the mutex"))
		r := goRW(t, cr.NewRWMutex(name), true)
		r.awaitLocked(t, "the read lock")
		_, err := admin.Inspect(ctx, name) // loads the script on a fresh server (EVALSHA, NOSCRIPT, EVAL)
		require.NoError(t, err)
		start := time.Now()
		info, err := admin.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, 1, scriptCalls(calls.since(start)), "script calls of one Inspect of two kinds")
		assert.Equal(t, "mutex", info.Kind, "Kind: the mutex first")
		assert.Equal(t, mk.hash, info.Key)
		if assert.Len(t, info.Holders, 1, "the mutex's holders") {
			assertHolder(t, info.Holders[0], cm, false, 1, DefaultLease)
		}
		assert.Zero(t, info.Readers, "the mutex's readers")
		require.Len(t, info.Others, 1, "others")
		o := info.Others[0]
		assert.Equal(t, "rwmutex", o.Kind, "the other's Kind")
		assert.Equal(t, k.w, o.Key, "the other's Key")
		if assert.Len(t, o.Holders, 1, "the read/write lock's holders") {
			assertHolder(t, o.Holders[0], cr, true, 1, DefaultLease)
		}
		assert.Equal(t, 1, o.Readers, "the read/write lock's readers")
		assert.Nil(t, o.Others, "the other's Others")

		released, err := admin.ForceUnlock(ctx, name, o.Holders[0].Owner)
		require.NoError(t, err)
		assert.True(t, released, "ForceUnlock of the reader")
		info, err = admin.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, "mutex", info.Kind, "Kind after the reader's release")
		assert.Len(t, info.Holders, 1, "the mutex's holders after the reader's release")
		assert.Nil(t, info.Others, "others after the reader's release")
		// Its RUnlock finds nothing: taken as a resend, done, unless its
		// watchdog found the loss first.
		if err := r.unlock(t, "the released reader's RUnlockContext"); err != nil {
			assert.ErrorIs(t, err, ErrLockLost, "the released reader's RUnlockContext")
		}

		m.release()
		require.NoError(t, await(t, m.unlocked, "the mutex's Unlock"))
		wr := goRW(t, cw.NewRWMutex(name), false)
		wr.awaitLocked(t, "the write lock")
		info, err = admin.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, "rwmutex", info.Kind, "Kind with the read/write lock alone")
		assert.Equal(t, k.w, info.Key)
		if assert.Len(t, info.Holders, 1, "the writer") {
			assertHolder(t, info.Holders[0], cw, false, 1, DefaultLease)
		}
		assert.Nil(t, info.Others)

		m2 := goLock(t, cm.NewMutex(name))
		require.NoError(t, await(t, m2.locked, "the mutex again"))
		released, err = admin.ForceUnlock(ctx, name)
		require.NoError(t, err)
		assert.True(t, released, "ForceUnlock of both kinds")
		info, err = admin.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, LockInfo{Name: name, Key: mk.hash, Holders: []Holder{}, Waiters: []Waiter{}}, info, "nothing under the name")
		assert.Zero(t, rdb.Exists(ctx, mk.hash, k.w, k.readers).Val(), "keys left")
	})
}

// wantAdminWrongType: Inspect and ForceUnlock of name, whose key holds
// foreign data of type typ, return a *WrongTypeError naming key, typ and
// the lock, and leave the data as it was.
func wantAdminWrongType(t *testing.T, c *Client, rdb *redis.Client, name, key, typ, what string) {
	t.Helper()
	ctx := context.Background()
	dump := rdb.Dump(ctx, key).Val()
	_, err := c.Inspect(ctx, name)
	var wt *WrongTypeError
	if assert.ErrorAs(t, err, &wt, "Inspect, %s", what) {
		assert.Equal(t, key, wt.Key, "%s: WrongTypeError.Key", what)
		assert.Equal(t, typ, wt.Type, "%s: WrongTypeError.Type", what)
		assert.Contains(t, err.Error(), name, "%s: the error names the lock", what)
	}
	_, err = c.ForceUnlock(ctx, name)
	assert.ErrorAs(t, err, &wt, "ForceUnlock, %s", what)
	assert.Equal(t, dump, rdb.Dump(ctx, key).Val(), "%s: the data at %s", what, key)
}
