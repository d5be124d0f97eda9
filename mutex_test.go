package remutex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// DistMutex is a sync.Locker: it can stand where a sync.Mutex stood.
var _ sync.Locker = (*DistMutex)(nil)

// The public API, with the exact names and signatures users call.
var (
	_ func(redis.UniversalClient, ...Option) *Client   = NewClient
	_ func(*Client, string, ...MutexOption) *DistMutex = (*Client).NewMutex
	_ func(*Client) error                              = (*Client).Close

	_ func(*DistMutex)                                = (*DistMutex).Lock
	_ func(*DistMutex)                                = (*DistMutex).Unlock
	_ func(*DistMutex) bool                           = (*DistMutex).TryLock
	_ func(*DistMutex, context.Context) error         = (*DistMutex).LockContext
	_ func(*DistMutex, context.Context) (bool, error) = (*DistMutex).TryLockContext
	_ func(*DistMutex, context.Context) error         = (*DistMutex).UnlockContext
	_ func(*DistMutex) int                            = (*DistMutex).HoldCount
	_ func(*DistMutex) <-chan struct{}                = (*DistMutex).Lost
	_ func(*DistMutex) int64                          = (*DistMutex).Fence
	_ func(*DistMutex) string                         = (*DistMutex).Name

	_ func(string) Option             = WithKeyPrefix
	_ func(*slog.Logger) Option       = WithLogger
	_ func(func(error)) Option        = WithErrorHandler
	_ func(time.Duration) MutexOption = WithLease
	_ func() MutexOption              = WithoutRenewal
	_ func() MutexOption              = WithFencing
	_ func() MutexOption              = NonReentrant

	_ error = (*WrongTypeError)(nil)
)

func TestErrorsAreDistinct(t *testing.T) {
	errs := map[string]error{"ErrNotHeld": ErrNotHeld, "ErrLockLost": ErrLockLost, "ErrClosed": ErrClosed}
	for name, err := range errs {
		require.NotNil(t, err, name)
		assert.True(t, strings.HasPrefix(err.Error(), "remutex: "), "%s = %q, want prefix %q", name, err, "remutex: ")
		for other, err2 := range errs {
			if other != name {
				assert.False(t, errors.Is(err, err2), "errors.Is(%s, %s) = true, want false", name, other)
			}
		}
	}
}

// panicValue runs f and returns what it panicked with, as text.
func panicValue(f func()) (msg string, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			msg, panicked = fmt.Sprint(r), true
		}
	}()
	f()
	return "", false
}

// inGoroutine runs f on a new goroutine and waits for it: the calls f makes
// belong to another goroutine than the test's.
func inGoroutine[T any](t *testing.T, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	return await(t, ch, "the goroutine's result")
}

// bgLock holds a lock on a goroutine of its own: it locks at once, then
// unlocks when told to. Its goroutine is joined at cleanup.
type bgLock struct {
	locked    chan error // the result of LockContext
	unlock    chan struct{}
	unlocked  chan error // the result of UnlockContext
	exited    chan struct{}
	once      sync.Once
	holdCount atomic.Int64 // HoldCount right after locking
	fence     atomic.Int64 // Fence right after locking
}

func goLock(t *testing.T, m *DistMutex) *bgLock {
	t.Helper()
	return goLockContext(t, m, context.Background())
}

func goLockContext(t *testing.T, m *DistMutex, ctx context.Context) *bgLock {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	g := &bgLock{locked: make(chan error, 1), unlock: make(chan struct{}), unlocked: make(chan error, 1), exited: make(chan struct{})}
	go func() {
		defer close(g.exited)
		err := m.LockContext(ctx)
		g.holdCount.Store(int64(m.HoldCount()))
		g.fence.Store(m.Fence())
		g.locked <- err
		if err != nil {
			return
		}
		select {
		case <-g.unlock:
		case <-ctx.Done():
		}
		g.unlocked <- m.UnlockContext(context.Background())
	}()
	t.Cleanup(func() {
		cancel()
		<-g.exited
	})
	return g
}

func (g *bgLock) release() { g.once.Do(func() { close(g.unlock) }) }

func TestNameHoldCountFenceLost(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		c := b.client(t)
		m := c.NewMutex(name)
		fm := c.NewMutex(name+".fenced", WithFencing())

		assert.Equal(t, name, m.Name())
		assert.Equal(t, 0, m.HoldCount())
		assert.Equal(t, int64(0), m.Fence())
		assert.True(t, isClosed(m.Lost()), "Lost() of a goroutine holding nothing: got open, want closed")

		m.Lock()
		fm.Lock()
		assert.Equal(t, 1, m.HoldCount())
		assert.Equal(t, int64(0), m.Fence(), "Fence without WithFencing")
		assert.Greater(t, fm.Fence(), int64(0), "Fence with WithFencing")
		assert.False(t, isClosed(m.Lost()), "Lost() of a live hold: got closed, want open")

		// Another goroutine holds nothing.
		type view struct {
			count  int
			fence  int64
			closed bool
		}
		other := inGoroutine(t, func() view { return view{fm.HoldCount(), fm.Fence(), isClosed(fm.Lost())} })
		assert.Equal(t, view{0, 0, true}, other, "another goroutine's view of the hold")

		lost := m.Lost()
		m.Unlock()
		fm.Unlock()
		assert.Equal(t, 0, m.HoldCount())
		assert.False(t, isClosed(lost), "an unlocked hold's Lost channel: got closed, want open")
		assert.True(t, isClosed(m.Lost()))
	})
}

func TestKeyPrefix(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		rdb := b.rdb(t)
		ctx := context.Background()

		def := b.client(t).NewMutex(name)
		def.Lock()
		assert.Equal(t, int64(1), rdb.Exists(ctx, "remutex:{"+name+"}").Val(), "default prefix key")
		def.Unlock()

		p1 := b.client(t, WithKeyPrefix("p1:")).NewMutex(name)
		p2 := b.client(t, WithKeyPrefix("p2:")).NewMutex(name)
		p1.Lock()
		assert.Equal(t, int64(1), rdb.Exists(ctx, "p1:{"+name+"}").Val(), "key under prefix p1:")
		assert.True(t, p2.TryLock(), "TryLock under another prefix: got false, want true")
		p2.Unlock()
		same := b.client(t, WithKeyPrefix("p1:")).NewMutex(name)
		assert.False(t, same.TryLock(), "TryLock under the same prefix: got true, want false")
		p1.Unlock()
	})
}

func TestConstructionPanics(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		var counter commandLog
		rdb := b.rdb(t)
		rdb.AddHook(&counter)
		c := NewClient(rdb)
		t.Cleanup(func() { _ = c.Close() })

		long := strings.Repeat("x", MaxNameLen+1)
		cases := []struct {
			name string
			f    func()
		}{
			{"nil redis client", func() { NewClient(nil) }},
			{"typed nil redis client", func() { NewClient((*redis.Client)(nil)) }},
			{"nil client option", func() { NewClient(rdb, nil) }},
			{"nil logger", func() { NewClient(rdb, WithLogger(nil)) }},
			{"nil Client", func() { (*Client)(nil).NewMutex("x") }},
			{"empty name", func() { c.NewMutex("") }},
			{"name over 1 KiB", func() { c.NewMutex(long) }},
			{"name starting with }", func() { c.NewMutex("}x") }},
			{"nil mutex option", func() { c.NewMutex("x", nil) }},
			{"lease 0", func() { c.NewMutex("x", WithLease(0)) }},
			{"negative lease", func() { c.NewMutex("x", WithLease(-time.Second)) }},
			{"lease below 50ms", func() { c.NewMutex("x", WithLease(MinLease-time.Nanosecond)) }},
			{"lease above 24h", func() { c.NewMutex("x", WithLease(MaxLease+time.Nanosecond)) }},
		}
		for _, tc := range cases {
			msg, panicked := panicValue(tc.f)
			if assert.True(t, panicked, "%s: got no panic, want one", tc.name) {
				assert.True(t, strings.HasPrefix(msg, "remutex: "), "%s: got panic %q, want prefix %q", tc.name, msg, "remutex: ")
			}
		}

		// The limits themselves are valid.
		valid := []struct {
			name string
			f    func()
		}{
			{"name of 1 KiB", func() { c.NewMutex(strings.Repeat("x", MaxNameLen)) }},
			{"lease 50ms", func() { c.NewMutex("x", WithLease(MinLease)) }},
			{"lease 24h", func() { c.NewMutex("x", WithLease(MaxLease)) }},
			{"all options", func() { c.NewMutex("x", WithLease(time.Second), WithoutRenewal(), WithFencing(), NonReentrant()) }},
			{"client options", func() {
				cc := NewClient(rdb, WithKeyPrefix("p:"), WithLogger(slog.Default()), WithErrorHandler(func(error) {}))
				_ = cc.Close()
			}},
		}
		for _, tc := range valid {
			msg, panicked := panicValue(tc.f)
			assert.False(t, panicked, "%s: got panic %q, want none", tc.name, msg)
		}

		dials, cmds := counter.counts()
		assert.Equal(t, 0, dials, "connections dialled by construction")
		assert.Empty(t, cmds, "commands sent by construction")
	})
}

func TestReentrancy(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		rdb := b.rdb(t)
		ctx := context.Background()
		c1, c2 := b.client(t), b.client(t)
		m := c1.NewMutex(name) // default lease: 30s

		for i := 1; i <= 3; i++ {
			m.Lock()
			require.Equal(t, i, m.HoldCount(), "HoldCount after Lock #%d", i)
			assert.Equal(t, []string{fmt.Sprint(i)}, hashCounts(t, rdb, k.hash), "hold counts in Redis after Lock #%d", i)
		}
		m.Unlock()
		m.Unlock()
		require.Equal(t, 1, m.HoldCount(), "HoldCount after Lock×3, Unlock×2")
		assert.Equal(t, []string{"1"}, hashCounts(t, rdb, k.hash), "hold counts in Redis after Lock×3, Unlock×2")

		// Still held: not by another goroutine of the same Client, through
		// this DistMutex or another of the same name, nor by another Client.
		assert.False(t, inGoroutine(t, m.TryLock), "TryLock by another goroutine: got true, want false")
		assert.False(t, inGoroutine(t, c1.NewMutex(name).TryLock), "TryLock by another goroutine via another DistMutex: got true, want false")
		assert.False(t, c2.NewMutex(name).TryLock(), "TryLock by another Client: got true, want false")
		pttl := rdb.PTTL(ctx, k.hash).Val()
		assert.True(t, pttl > DefaultLease-5*time.Second && pttl <= DefaultLease, "PTTL of %s: got %v, want about the lease %v", k.hash, pttl, DefaultLease)

		// A TryLock of the holding goroutine nests.
		require.True(t, m.TryLock(), "TryLock by the holder: got false, want true")
		assert.Equal(t, 2, m.HoldCount())
		m.Unlock()

		// A waiter in another Client gets the lock when the last Unlock frees it
		// (well before the 30s lease could run out).
		waiter := goLock(t, c2.NewMutex(name))
		waitFor(t, "the waiter subscribed to "+k.channel, func() bool { return numSub(t, rdb, k.channel) > 0 })
		m.Unlock()
		assert.Equal(t, 0, m.HoldCount())
		require.NoError(t, await(t, waiter.locked, "the waiter to acquire"))
		assert.Equal(t, int64(1), waiter.holdCount.Load(), "the waiter's HoldCount")
		waiter.release()
		require.NoError(t, await(t, waiter.unlocked, "the waiter to unlock"))
		assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash).Val(), "key after the last Unlock")
	})
}

// hashCounts returns the hold counts stored in a lock's hash.
func hashCounts(t testing.TB, rdb *redis.Client, key string) []string {
	t.Helper()
	m, err := rdb.HGetAll(context.Background(), key).Result()
	require.NoError(t, err)
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// numSub returns the subscribers of channel (PUBSUB NUMSUB).
// numSub counts the subscribers of the channels that begin with prefix: a
// lock's channels are P{N}:released:<client id>, one per Client.
func numSub(t testing.TB, rdb *redis.Client, prefix string) int64 {
	t.Helper()
	n, err := subscribers(rdb, prefix)
	require.NoError(t, err)
	return n
}

func subscribers(rdb *redis.Client, prefix string) (int64, error) {
	ctx := context.Background()
	chans, err := rdb.PubSubChannels(ctx, prefix+"*").Result()
	if err != nil || len(chans) == 0 {
		return 0, err
	}
	m, err := rdb.PubSubNumSub(ctx, chans...).Result()
	var n int64
	for _, k := range m {
		n += k
	}
	return n, err
}

func TestExclusion(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		const clients, goroutines, rounds = 2, 4, 10
		var inside, overlaps, total atomic.Int64
		var wg sync.WaitGroup
		rdb := b.rdb(t)
		for i := 0; i < clients; i++ {
			m := b.client(t).NewMutex(name)
			for j := 0; j < goroutines; j++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := 0; r < rounds; r++ {
						m.Lock()
						if inside.Add(1) != 1 {
							overlaps.Add(1)
						}
						rdb.Get(context.Background(), name) // a round trip inside
						inside.Add(-1)
						total.Add(1)
						m.Unlock()
					}
				}()
			}
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		await(t, done, "all goroutines to finish")
		assert.Equal(t, int64(0), overlaps.Load(), "critical sections that overlapped")
		assert.Equal(t, int64(clients*goroutines*rounds), total.Load())
	})
}

func TestUnlockOfUnlockedMutex(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		c := b.client(t)
		m := c.NewMutex(name)
		const want = "remutex: unlock of unlocked mutex"
		assertUnlockPanics(t, m, "Unlock of a never locked mutex")
		assert.ErrorIs(t, m.UnlockContext(context.Background()), ErrNotHeld)

		m.Lock()
		m.Unlock()
		assertUnlockPanics(t, m, "Unlock after the last Unlock")
		assert.ErrorIs(t, m.UnlockContext(context.Background()), ErrNotHeld)

		// Holds belong to goroutines: another goroutine holds nothing.
		m.Lock()
		msg := inGoroutine(t, func() string { s, _ := panicValue(m.Unlock); return s })
		assert.True(t, strings.HasPrefix(msg, want), "Unlock by a goroutine that does not hold the lock: panic %q, want it to begin %q", msg, want)
		err := inGoroutine(t, func() error { return m.UnlockContext(context.Background()) })
		assert.ErrorIs(t, err, ErrNotHeld)
		assert.Equal(t, 1, m.HoldCount(), "the holder's count after others' failed Unlocks")
		m.Unlock()

		nr := c.NewMutex(name+".nr", NonReentrant())
		assertUnlockPanics(t, nr, "Unlock of an unlocked NonReentrant mutex")
		assert.ErrorIs(t, nr.UnlockContext(context.Background()), ErrNotHeld)
	})
}

// assertUnlockPanics checks that m.Unlock panics with exactly the message of
// sync.Mutex's misuse, in remutex's words.
func assertUnlockPanics(t *testing.T, m *DistMutex, what string) {
	t.Helper()
	const want = "remutex: unlock of unlocked mutex"
	msg, panicked := panicValue(m.Unlock)
	if !panicked {
		t.Errorf("%s: got no panic, want %q", what, want)
		return
	}
	assert.True(t, strings.HasPrefix(msg, want), "%s: panic %q, want it to begin %q", what, msg, want)
}

func TestWrongType(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := context.Background()
		rdb := b.rdb(t)
		c := b.client(t)
		cases := []struct {
			name      string
			opts      []MutexOption
			key       func(lockKeyNames) string
			plant     func(key string) error
			typ       string
			restore   func(key string) (string, error) // reads the planted data back
			want      string
			contended bool // send the full scripts
		}{
			{
				name:    "string at the hash key",
				key:     func(k lockKeyNames) string { return k.hash },
				plant:   func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() },
				restore: func(key string) (string, error) { return rdb.Get(ctx, key).Result() },
				typ:     "string", want: "precious",
			},
			{
				name:    "string at the queue key",
				key:     func(k lockKeyNames) string { return k.queue },
				plant:   func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() },
				restore: func(key string) (string, error) { return rdb.Get(ctx, key).Result() },
				typ:     "string", want: "precious",
			},
			{
				// The same, the lock made to look contended: the full
				// scripts run from the first call.
				name:    "string at the queue key, contended",
				key:     func(k lockKeyNames) string { return k.queue },
				plant:   func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() },
				restore: func(key string) (string, error) { return rdb.Get(ctx, key).Result() },
				typ:     "string", want: "precious", contended: true,
			},
			{
				name:    "list at the fence key",
				opts:    []MutexOption{WithFencing()},
				key:     func(k lockKeyNames) string { return k.fence },
				plant:   func(key string) error { return rdb.RPush(ctx, key, "precious").Err() },
				restore: func(key string) (string, error) { return rdb.LIndex(ctx, key, 0).Result() },
				typ:     "list", want: "precious",
			},
		}
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				name := fmt.Sprintf("%s.%d", lockName(t), i)
				k := keysOf(name)
				key := tc.key(k)
				require.NoError(t, tc.plant(key))
				m := c.NewMutex(name, tc.opts...)
				if tc.contended {
					m.spec.Quick.Until.Store(math.MaxInt64)
				}

				check := func(what string, err error) {
					t.Helper()
					var wt *WrongTypeError
					if assert.ErrorAs(t, err, &wt, what) {
						assert.Equal(t, key, wt.Key, "%s: WrongTypeError.Key", what)
						assert.Equal(t, tc.typ, wt.Type, "%s: WrongTypeError.Type", what)
						assert.Contains(t, err.Error(), name, "%s: the error names the lock", what)
					}
				}
				check("LockContext", m.LockContext(ctx))
				ok, err := m.TryLockContext(ctx)
				assert.False(t, ok, "TryLockContext: got true, want false")
				check("TryLockContext", err)
				msg, panicked := panicValue(m.Lock)
				assert.True(t, panicked, "Lock: got no panic, want one")
				assert.True(t, strings.HasPrefix(msg, "remutex: ") && strings.Contains(msg, key), "Lock panicked with %q, want a \"remutex: \" message naming %s", msg, key)
				msg, panicked = panicValue(func() { m.TryLock() })
				assert.True(t, panicked, "TryLock: got no panic, want one")
				assert.True(t, strings.HasPrefix(msg, "remutex: ") && strings.Contains(msg, key), "TryLock panicked with %q, want a \"remutex: \" message naming %s", msg, key)

				assert.Equal(t, 0, m.HoldCount())
				got, err := tc.restore(key)
				require.NoError(t, err)
				assert.Equal(t, tc.want, got, "the data at %s", key)
				assert.Equal(t, tc.typ, rdb.Type(ctx, key).Val(), "the type at %s", key)
				assert.Equal(t, time.Duration(-1), rdb.TTL(ctx, key).Val(), "the TTL of %s", key)
				for _, other := range []string{k.hash, k.fence, k.queue} {
					if other != key {
						assert.Equal(t, int64(0), rdb.Exists(ctx, other).Val(), "stray key %s", other)
					}
				}
			})
		}
	})
}

func TestScriptFlushIsHarmless(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		direct := b.rdb(t)
		var renewals atomic.Int64
		count := func(cmd redis.Cmder) {
			if s, _ := scriptCall(cmd); s == "renew" && cmd.Err() == nil {
				renewals.Add(1)
			}
		}
		rdb := b.rdb(t)
		rdb.AddHook(hookFuncs{pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			err := next(ctx, cmds)
			for _, cmd := range cmds {
				count(cmd)
			}
			return err
		}, process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			err := next(ctx, cmd)
			count(cmd)
			return err
		}})
		errs := newErrorLog()
		c := clientOn(t, rdb, WithErrorHandler(errs.handler))
		m := c.NewMutex(name, WithLease(300*time.Millisecond))
		flush := func() {
			t.Helper()
			require.NoError(t, direct.ScriptFlush(ctx).Err())
		}

		flush()
		require.NoError(t, m.LockContext(ctx), "Lock after SCRIPT FLUSH")
		flush()
		require.NoError(t, m.LockContext(ctx), "nested Lock after SCRIPT FLUSH")
		flush()
		// A renewal in flight during the flush may finish after it; the one
		// after that was sent after the flush.
		n := renewals.Load()
		waitFor(t, "two more successful renewals", func() bool { return renewals.Load() >= n+2 })
		assert.False(t, isClosed(m.Lost()), "Lost after renewals across SCRIPT FLUSH: got closed, want open")
		assert.Equal(t, []string{"2"}, hashCounts(t, direct, k.hash))
		flush()
		require.NoError(t, m.UnlockContext(ctx), "nested Unlock after SCRIPT FLUSH")
		flush()
		require.NoError(t, m.UnlockContext(ctx), "Unlock after SCRIPT FLUSH")
		assert.Equal(t, int64(0), direct.Exists(ctx, k.hash).Val(), "key after the last Unlock")
		assert.Empty(t, errs.all(), "errors reported")
	})
}

// transientErr is what a dropped connection looks like to go-redis.
func transientErr() error {
	return &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
}

// failFirstAcquires returns a hook that fails the first n calls of the
// acquire script with a network error, without sending them.
func failFirstAcquires(n *atomic.Int64) redis.Hook {
	return hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if s, _ := scriptCall(cmd); s == "acquire" && n.Add(-1) >= 0 {
			err := transientErr()
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}}
}

func TestLockRetriesTransientErrors(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		var failures atomic.Int64
		rdb := b.rdb(t)
		rdb.AddHook(failFirstAcquires(&failures))
		errs := newErrorLog()
		c := clientOn(t, rdb, WithErrorHandler(errs.handler))
		m := c.NewMutex(name)

		failures.Store(3)
		m.Lock()
		assert.Equal(t, 1, m.HoldCount())
		heard := errs.all()
		assert.Len(t, heard, 3, "errors reported to the handler: %v", heard)
		for _, err := range heard {
			var op *net.OpError
			assert.ErrorAs(t, err, &op)
			assert.Contains(t, err.Error(), name, "the error names the lock")
		}
		m.Unlock()

		// LockContext retries too.
		failures.Store(2)
		require.NoError(t, m.LockContext(context.Background()))
		m.Unlock()
		assert.Len(t, errs.all(), 5, "errors reported to the handler")

		// TryLock makes one attempt: a transient error is reported and it
		// returns false; TryLockContext returns the error.
		failures.Store(1)
		assert.False(t, m.TryLock(), "TryLock on a transient error: got true, want false")
		assert.Len(t, errs.all(), 6, "errors reported to the handler")
		awaitIdle(t, c) // the release TryLock posts in case its call was applied: the next call goes alone
		failures.Store(1)
		ok, err := m.TryLockContext(context.Background())
		assert.False(t, ok)
		var op *net.OpError
		assert.ErrorAs(t, err, &op)
		require.True(t, m.TryLock(), "TryLock without errors: got false, want true")
		m.Unlock()
	})
}

func TestLockContextDone(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		var counter commandLog
		rdb := b.rdb(t)
		rdb.AddHook(&counter)
		c := clientOn(t, rdb)
		m := c.NewMutex(name)

		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel2()
		for _, tc := range []struct {
			ctx  context.Context
			want error
		}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
			err := m.LockContext(tc.ctx)
			assert.ErrorIs(t, err, tc.want, "LockContext")
			if err != nil {
				assert.Contains(t, err.Error(), name, "the error names the lock")
			}
			ok, err := m.TryLockContext(tc.ctx)
			assert.False(t, ok)
			assert.ErrorIs(t, err, tc.want, "TryLockContext")
		}
		assert.Equal(t, 0, m.HoldCount())
		_, cmds := counter.counts()
		assert.Empty(t, cmds, "commands sent for a done context")
	})
}

func TestCondSignal(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		m := b.client(t).NewMutex(lockName(t))
		cond := sync.NewCond(m)
		ready := false // guarded by m
		entered := make(chan struct{})
		done := make(chan bool, 1)
		go func() {
			m.Lock()
			close(entered)
			for !ready {
				cond.Wait()
			}
			ok := m.HoldCount() == 1
			m.Unlock()
			done <- ok
		}()
		await(t, entered, "the waiter to lock")
		// This Lock succeeds only once the waiter's Wait unlocked m, so the
		// waiter is waiting for the signal by then.
		m.Lock()
		ready = true
		cond.Signal()
		m.Unlock()
		assert.True(t, await(t, done, "the signalled waiter to finish"), "waiter's HoldCount after Wait: want 1")
	})
}

func TestCondBroadcast(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		m := b.client(t).NewMutex(lockName(t))
		cond := sync.NewCond(m)
		const n = 3
		ready := false // guarded by m
		entered := make(chan struct{}, n)
		done := make(chan struct{}, n)
		for i := 0; i < n; i++ {
			go func() {
				m.Lock()
				entered <- struct{}{}
				for !ready {
					cond.Wait()
				}
				m.Unlock()
				done <- struct{}{}
			}()
		}
		for i := 0; i < n; i++ {
			await(t, entered, "a waiter to lock")
		}
		m.Lock() // every waiter has entered and only Wait lets m go
		ready = true
		cond.Broadcast()
		m.Unlock()
		for i := 0; i < n; i++ {
			await(t, done, "every waiter to finish")
		}
	})
}

// TestCondWaitNested documents sync.Cond on a hold count above 1: Wait calls
// Unlock once, which only lowers the count to 1, so the lock stays held while
// the goroutine waits. Nobody else can take the lock in the meantime; a
// Signal sent without the lock still wakes the waiter, whose Lock then
// raises the count back to 2.
func TestCondWaitNested(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		rdb := b.rdb(t)
		m := b.client(t).NewMutex(name)
		cond := sync.NewCond(m)
		waiting := make(chan int, 1)
		after := make(chan int, 1)
		go func() {
			m.Lock()
			m.Lock()
			waiting <- m.HoldCount()
			cond.Wait()
			n := m.HoldCount()
			m.Unlock()
			m.Unlock()
			after <- n
		}()
		require.Equal(t, 2, await(t, waiting, "the waiter to lock twice"), "HoldCount before Wait")
		waitFor(t, "the hold count in Redis to drop to 1 in Wait", func() bool {
			counts := hashCounts(t, rdb, k.hash)
			return len(counts) == 1 && counts[0] == "1"
		})
		assert.False(t, b.client(t).NewMutex(name).TryLock(), "TryLock by another Client during Wait at count 2: got true, want false")
		cond.Signal()
		assert.Equal(t, 2, await(t, after, "the waiter to wake"), "HoldCount after Wait returned")
		waitFor(t, "the lock to be free", func() bool { return rdb.Exists(context.Background(), k.hash).Val() == 0 })
	})
}

func TestNonReentrant(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		rdb := b.rdb(t)
		m := b.client(t).NewMutex(name, NonReentrant())
		other := b.client(t).NewMutex(name)

		// Unlock from another goroutine works, as with sync.Mutex.
		m.Lock()
		assert.Equal(t, 1, inGoroutine(t, m.HoldCount), "HoldCount seen by another goroutine")
		require.NoError(t, inGoroutine(t, func() error { return m.UnlockContext(ctx) }), "UnlockContext by another goroutine")
		assert.Equal(t, 0, m.HoldCount())
		require.True(t, other.TryLock(), "TryLock by another Client after the Unlock: got false, want true")
		other.Unlock()

		// A second Lock by the same goroutine blocks.
		m.Lock()
		assert.False(t, m.TryLock(), "TryLock by the holding goroutine: got true, want false")
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := m.LockContext(tctx)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded, "second LockContext by the holding goroutine")
		assert.Equal(t, 1, m.HoldCount())
		assert.Len(t, hashCounts(t, rdb, k.hash), 1, "holds in Redis")
		go m.Unlock() // any goroutine may unlock
		require.NoError(t, m.LockContext(ctx), "LockContext after another goroutine unlocked")
		m.Unlock()
		assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash, k.queue).Val(), "keys left behind")
	})
}

// TestHammer has 3 Clients × 10 goroutines × 200 rounds (every third a
// TryLock) increment a counter in Redis with GET and SET under the lock: the
// counter must equal the number of acquisitions.
//
// On miniredis the goroutines make 30 rounds each: miniredis runs every script
// in a fresh Lua interpreter and serialises all commands and published
// messages under one lock, so under -race a contended round trip takes
// 5–20ms there (0.2ms on redis-server) and the full size would take minutes.
func TestHammer(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		counter := name + ".counter"
		const clients, goroutines = 3, 10
		rounds := 200
		if !b.real() {
			rounds = 30
		}
		var acquired, inside, overlaps atomic.Int64
		errc := make(chan error, clients*goroutines)
		var wg sync.WaitGroup
		for i := 0; i < clients; i++ {
			m := b.client(t).NewMutex(name)
			rdb := b.rdb(t)
			for j := 0; j < goroutines; j++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx := context.Background()
					for r := 0; r < rounds; r++ {
						if r%3 == 2 {
							if !m.TryLock() {
								continue
							}
						} else {
							m.Lock()
						}
						if inside.Add(1) != 1 {
							overlaps.Add(1)
						}
						n, err := rdb.Get(ctx, counter).Int64()
						if err != nil && !errors.Is(err, redis.Nil) {
							errc <- err
						}
						if err := rdb.Set(ctx, counter, n+1, 0).Err(); err != nil {
							errc <- err
						}
						acquired.Add(1)
						inside.Add(-1)
						m.Unlock()
					}
				}()
			}
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Minute):
			t.Fatal("hammer did not finish in 3 minutes")
		}
		close(errc)
		for err := range errc {
			t.Errorf("counter I/O: %v", err)
		}
		got, err := b.rdb(t).Get(context.Background(), counter).Int64()
		require.NoError(t, err)
		assert.Equal(t, acquired.Load(), got, "counter vs acquisitions")
		assert.Equal(t, int64(0), overlaps.Load(), "critical sections that overlapped")
		t.Logf("%d acquisitions in %d rounds", acquired.Load(), clients*goroutines*rounds)
	})
}
