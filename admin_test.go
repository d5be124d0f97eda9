package remutex

import (
	"context"
	"errors"
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

// clientIDForm is the form of a Client id: <32 hex>.<host>.<pid>.
var clientIDForm = regexp.MustCompile(`^[0-9a-f]{32}\.[A-Za-z0-9._-]+\.\d+$`)

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
		id := clientID(strings.Repeat("0", 32), got, 42)
		assert.Regexp(t, clientIDForm, id, "Client id with host %q", tc.in)
		h, pid := ownerOrigin(id + ":7")
		assert.Equal(t, got, h, "host parsed back from %q", id)
		assert.Equal(t, 42, pid, "pid parsed back from %q", id)
	}

	assert.Equal(t, `a\*b\?c\[d\]e\\f`, globEscape(`a*b?c[d]e\f`), "globEscape")

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
		waitFor(t, "the waiter queued", func() bool { return rdb.ZCard(ctx, k.queue).Val() == 1 })

		released, err = admin.ForceUnlock(ctx, name, owner)
		require.NoError(t, err)
		assert.True(t, released, "ForceUnlock of the holder")
		msg := await(t, ps.Channel(), "a message to the waiter's Client")
		assert.Regexp(t, `^(w|g \d+) `, msg.Payload, "the message: a wake-up or a grant")
		require.NoError(t, await(t, w.locked, "the waiter to get the lock"))
		assert.Greater(t, w.fence.Load(), fence, "the waiter's fencing token")

		await(t, lost, "the holder's Lost to close")
		assert.ErrorIs(t, m.UnlockContext(ctx), ErrLockLost, "the holder's UnlockContext")
		// The handler runs after Lost closed, outside the Client's mutex: await it.
		errs.await(t, ErrLockLost, hangGuard, "the holder's error handler to hear of the loss")
		w.release()
		require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
		assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash, k.queue, k.alive).Val(), "keys left")
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
		} {
			name := lockName(t) + "." + tc.what
			k := keysOf(name)
			key := tc.key(k)
			require.NoError(t, tc.plant(key))
			dump := rdb.Dump(ctx, key).Val()
			_, err := c.Inspect(ctx, name)
			var wt *WrongTypeError
			if assert.ErrorAs(t, err, &wt, "Inspect, %s", tc.what) {
				assert.Equal(t, key, wt.Key, "%s: WrongTypeError.Key", tc.what)
				assert.Equal(t, tc.typ, wt.Type, "%s: WrongTypeError.Type", tc.what)
				assert.Contains(t, err.Error(), name, "%s: the error names the lock", tc.what)
			}
			_, err = c.ForceUnlock(ctx, name)
			assert.ErrorAs(t, err, &wt, "ForceUnlock, %s", tc.what)
			assert.Equal(t, dump, rdb.Dump(ctx, key).Val(), "%s: the data at %s", tc.what, key)
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
