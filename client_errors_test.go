package remutex

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// Errors a user can act on: a server that wants a password, a fence counter
// that is not a number, a prefix with braces, a zero DistMutex, and Redis
// refusing connections.

// TestAuthRequired: without a password against a server that needs one,
// every call fails with an error that says so; Lock and TryLock panic with
// it, since waiting would not help.
func TestAuthRequired(t *testing.T) {
	t.Parallel()
	const password = "s3cret"
	for _, b := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"miniredis", func(t *testing.T) string {
			mr := miniredis.RunT(t)
			mr.RequireAuth(password)
			return mr.Addr()
		}},
		{"redis-server", func(t *testing.T) string { return redistest.Start(t, "--requirepass", password).Addr() }},
	} {
		t.Run(b.name, func(t *testing.T) {
			addr := b.addr(t)
			ctx := testCtx(t, hangGuard)
			c := clientOn(t, rdbAt(t, addr))
			name := lockName(t)
			m := c.NewMutex(name)

			check := func(what string, err error) {
				t.Helper()
				if assert.ErrorIs(t, err, ErrAuthRequired, what) {
					assert.Contains(t, err.Error(), "requires authentication", what)
					assert.Contains(t, err.Error(), name, "%s: the error names the lock", what)
					assert.False(t, transient(err), "%s: got a transient error, want a permanent one", what)
				}
			}
			check("LockContext", m.LockContext(ctx))
			ok, err := m.TryLockContext(ctx)
			assert.False(t, ok)
			check("TryLockContext", err)
			_, err = c.Inspect(ctx, name)
			check("Inspect", err)
			for what, f := range map[string]func(){"Lock": m.Lock, "TryLock": func() { m.TryLock() }} {
				v := faultPanic(f)
				err, _ := v.(error)
				check(what+" panics", err)
			}
			assert.Equal(t, 0, m.HoldCount())

			// With the password it works.
			ok, err = clientOn(t, newRDB(t, &redis.Options{Addr: addr, Password: password})).NewMutex(name).TryLockContext(ctx)
			assert.True(t, ok, "TryLockContext with the password")
			assert.NoError(t, err, "TryLockContext with the password")
		})
	}
}

// TestNonIntegerFence: a fence counter that holds text is reported as such,
// naming the key, and left as it was.
func TestNonIntegerFence(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		rdb := b.rdb(t)
		name := lockName(t)
		k := keysOf(name)
		require.NoError(t, rdb.Set(ctx, k.fence, "twelve", 0).Err())
		m := b.client(t).NewMutex(name, WithFencing())

		check := func(what string, err error) {
			t.Helper()
			var wt *WrongTypeError
			if assert.ErrorAs(t, err, &wt, what) {
				assert.Equal(t, &WrongTypeError{Key: k.fence, Type: nonInteger}, wt, what)
				op := "lock"
				if strings.HasPrefix(what, "Try") {
					op = "trylock"
				}
				want := fmt.Sprintf("remutex: %s %q: key %q holds a non-integer string, not a remutex fence counter", op, name, k.fence)
				assert.Equal(t, want, err.Error(), what)
			}
		}
		check("LockContext", m.LockContext(ctx))
		ok, err := m.TryLockContext(ctx)
		assert.False(t, ok)
		check("TryLockContext", err)
		v, _ := faultPanic(m.Lock).(error)
		check("Lock panics", v)
		assert.Equal(t, "twelve", rdb.Get(ctx, k.fence).Val(), "the fence counter")
		assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash, k.queue).Val(), "stray keys")
	})
}

// TestKeyPrefixWithBraces: a prefix with '{' or '}' panics in NewClient with
// a message naming it, before any command.
func TestKeyPrefixWithBraces(t *testing.T) {
	var counter commandLog
	rdb := rdbAt(t, miniredis.RunT(t).Addr())
	rdb.AddHook(&counter)
	for _, prefix := range []string{"a{b}:", "{}", "app{}:", "x}", "{"} {
		v := faultPanic(func() { NewClient(rdb, WithKeyPrefix(prefix)) })
		msg := fmt.Sprint(v)
		want := fmt.Sprintf("remutex: WithKeyPrefix(%q): a prefix must not contain '{' or '}'", prefix)
		assert.True(t, strings.HasPrefix(msg, want), "WithKeyPrefix(%q): got panic %q, want one that starts %q", prefix, msg, want)
	}
	dials, cmds := counter.counts()
	assert.Equal(t, 0, dials, "connections dialled")
	assert.Empty(t, cmds, "commands sent")
}

// TestZeroDistMutex: every method of a DistMutex not made by NewMutex
// panics with a message that says how to make one.
func TestZeroDistMutex(t *testing.T) {
	var m DistMutex
	ctx := context.Background()
	for name, f := range map[string]func(){
		"Lock":           m.Lock,
		"Unlock":         m.Unlock,
		"TryLock":        func() { m.TryLock() },
		"LockContext":    func() { _ = m.LockContext(ctx) },
		"TryLockContext": func() { _, _ = m.TryLockContext(ctx) },
		"UnlockContext":  func() { _ = m.UnlockContext(ctx) },
		"HoldCount":      func() { m.HoldCount() },
		"Lost":           func() { m.Lost() },
		"Fence":          func() { m.Fence() },
		"Name":           func() { m.Name() },
	} {
		msg := fmt.Sprint(faultPanic(f))
		assert.True(t, strings.HasPrefix(msg, "remutex: ") && strings.Contains(msg, "Client.NewMutex"),
			"%s on a zero DistMutex: got panic %q, want a \"remutex: \" message that says to use Client.NewMutex", name, msg)
	}
}

// TestRedisDown: with Redis refusing connections, TryLock answers at once,
// TryLockContext is governed by its context alone, LockContext gives up at
// its deadline naming the last Redis error, and Unlock and UnlockContext
// end (Unlock within its bound, UnlockContext with its context), report
// the failure and drop the hold locally.
func TestRedisDown(t *testing.T) {
	settleDialers(t)
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		p := redistest.NewProxy(t, b.addr)
		c, errs := clientWithErrors(t, newRDB(t, &redis.Options{Addr: p.Addr()}))
		m := c.NewMutex(name)
		other := c.NewMutex(name + ".other")

		// Two holds, each on a goroutine of its own, that unlock when told
		// to and say how many holds they have left.
		plain := holdOn(t, m, func(m *DistMutex) error { m.Unlock(); return nil })
		short := holdOn(t, other, func(m *DistMutex) error {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			return m.UnlockContext(ctx)
		})
		p.Close() // connections refused from now on

		// TryLock: one attempt, bounded. (The bound is a regression guard
		// against go-redis's own retries of refused connections, which
		// take over 1.5s; the attempt gets 300ms, an undo 200ms more.)
		tm := c.NewMutex(name + ".try")
		start := time.Now()
		ok := tm.TryLock()
		took := time.Since(start)
		assert.False(t, ok, "TryLock with Redis down")
		assert.Less(t, took, time.Second, "TryLock with Redis down took %v", took)
		tried := errs.all()
		if assert.NotEmpty(t, tried, "errors reported by TryLock") {
			assert.Contains(t, tried[len(tried)-1].Error(), tm.Name(), "TryLock's error names the lock")
		}

		// TryLockContext has no deadline of its own: it returns the
		// refused connection, not a timeout.
		ok, err := tm.TryLockContext(context.Background())
		assert.False(t, ok)
		var op *net.OpError
		assert.ErrorAs(t, err, &op, "TryLockContext with Redis down: got %v, want the dial error", err)
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "TryLockContext with Redis down")

		// LockContext gives up at its deadline and says why it could not
		// get the lock. (Its redis client dials once per attempt, so that
		// its first call fails before the deadline: a deadline that cuts
		// go-redis's own dial retries comes back from go-redis as the
		// deadline alone, without the refused connection.)
		quick := clientOn(t, newRDB(t, &redis.Options{Addr: p.Addr(), DialerRetries: 1}))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = quick.NewMutex(name + ".lock").LockContext(ctx)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded, "LockContext with Redis down")
		if err != nil {
			assert.Contains(t, err.Error(), "connection refused", "LockContext's error names the last Redis error")
		}

		// Unlock: bounded (hangGuard is below the 30s lease Unlock once
		// waited out), reported, and the hold is gone.
		held, err := plain.unlock(t)
		assert.Equal(t, 0, held, "holds left after Unlock with Redis down")
		assert.NoError(t, err)
		var released []error
		for _, e := range errs.all() {
			if strings.Contains(e.Error(), fmt.Sprintf("%q", name)) && !errors.Is(e, ErrLockLost) {
				released = append(released, e)
			}
		}
		assert.NotEmpty(t, released, "the failed release reported to the error handler (heard %v)", errs)

		// UnlockContext ends with its context.
		held, err = short.unlock(t)
		assert.Equal(t, 0, held, "holds left after UnlockContext with Redis down")
		assert.ErrorIs(t, err, context.DeadlineExceeded, "UnlockContext with Redis down")
	})
}

// TestTryLockUndoesCutOffGrant: when TryLock's deadline cuts off a call
// that Redis applied (its reply comes late, with the README's go-redis
// options: the call is not cut at the connection), TryLock answers false in
// time, and the grant is released by a call that follows the late one.
func TestTryLockUndoesCutOffGrant(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := testCtx(t, hangGuard)
		direct := b.rdb(t)
		p := redistest.NewProxy(t, b.addr)
		prdb := newRDB(t, &redis.Options{Addr: p.Addr(), ReadTimeout: 5 * time.Second})
		c, errs := clientWithErrors(t, prdb)
		m := c.NewMutex(name)
		for _, warm := range []*DistMutex{c.NewMutex(name + ".warm"), m} { // scripts loaded
			ok, err := warm.TryLockContext(ctx) // not TryLock, whose 300ms a busy machine can outlast
			require.True(t, ok, "TryLockContext: %v", err)
			warm.Unlock()
		}
		awaitIdle(t, c)

		p.SetLatency(time.Second) // replies come after TryLock's deadline
		start := time.Now()
		assert.False(t, m.TryLock(), "TryLock whose reply comes too late")
		assert.Less(t, time.Since(start), TryLockTimeout+deadlineSlack, "TryLock returned after its bound")
		assert.Equal(t, 0, m.HoldCount())
		assert.NotEmpty(t, errs.all(), "TryLock's error reported")
		// The acquire was applied at once (only replies are delayed); the
		// undo's release was sent after its reply.
		waitFor(t, "the cut-off grant released", func() bool {
			n, err := direct.Exists(context.Background(), k.hash).Result()
			return err == nil && n == 0
		})
		assert.Equal(t, int64(0), direct.Exists(ctx, k.queue).Val(), "queue keys left")
		p.Heal()
	})
}

// heldOn is a lock held by a goroutine of its own; see holdOn.
type heldOn struct {
	release chan struct{}
	done    chan heldResult
}

type heldResult struct {
	holds int // HoldCount after unlocking
	err   error
}

// holdOn locks m on a new goroutine, which calls unlock when told to.
func holdOn(t *testing.T, m *DistMutex, unlock func(*DistMutex) error) *heldOn {
	t.Helper()
	h := &heldOn{release: make(chan struct{}), done: make(chan heldResult, 1)}
	locked := make(chan error, 1)
	go func() {
		if err := m.LockContext(context.Background()); err != nil {
			locked <- err
			return
		}
		locked <- nil
		<-h.release
		err := unlock(m)
		h.done <- heldResult{holds: m.HoldCount(), err: err}
	}()
	require.NoError(t, await(t, locked, "the lock"))
	return h
}

// unlock has the goroutine unlock and waits for it (up to hangGuard).
func (h *heldOn) unlock(t *testing.T) (holds int, err error) {
	t.Helper()
	close(h.release)
	r := await(t, h.done, "the unlock to return")
	return r.holds, r.err
}
