package remutex

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClose(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		kx, ky := keysOf(name+".x"), keysOf(name+".y")
		ctx := context.Background()
		rdb := b.rdb(t)
		errs := newErrorLog()
		c := clientOn(t, b.rdb(t), WithErrorHandler(errs.handler))
		other := b.client(t)

		mx := c.NewMutex(name + ".x")
		my := c.NewMutex(name + ".y")
		mx.Lock()
		lostX := mx.Lost()
		yHolder := other.NewMutex(name + ".y")
		yHolder.Lock()

		waitCtx := make(chan error, 1)
		go func() { waitCtx <- my.LockContext(ctx) }()
		waitPlain := make(chan string, 1)
		go func() {
			msg, panicked := panicValue(my.Lock) // blocks for good once c is closed
			if !panicked {
				msg = "Lock returned without the lock"
			}
			waitPlain <- msg
		}()
		waitFor(t, "both waiters queued", func() bool { return rdb.LLen(ctx, ky.queue).Val() == 2 })

		require.NoError(t, c.Close())
		assert.True(t, isClosed(lostX), "Lost of a hold after Close: got open, want closed")
		assert.ErrorIs(t, await(t, waitCtx, "the waiting LockContext to return"), ErrClosed)
		assert.ErrorIs(t, c.Close(), ErrClosed, "second Close")

		// Waiters left nothing queued; the hold was not deleted (its lease
		// ends it), so nobody enters early.
		assert.Equal(t, int64(0), rdb.Exists(ctx, ky.queue).Val(), "queue keys after Close: %v", rdb.LRange(ctx, ky.queue, 0, -1).Val())
		assert.Greater(t, rdb.PTTL(ctx, kx.hash).Val(), time.Duration(0), "PTTL of the held lock after Close")
		assert.NotEmpty(t, errs.matching(ErrLockLost), "the error handler heard of the lost hold")

		assert.ErrorIs(t, my.LockContext(ctx), ErrClosed, "LockContext after Close")
		_, err := my.TryLockContext(ctx)
		assert.ErrorIs(t, err, ErrClosed, "TryLockContext after Close")
		err = mx.UnlockContext(ctx)
		assert.ErrorIs(t, err, ErrLockLost, "UnlockContext of a hold lost by Close")
		assert.ErrorIs(t, err, ErrClosed, "UnlockContext of a hold lost by Close")
		select {
		case msg := <-waitPlain:
			t.Errorf("Lock waiting at Close: %s, want it blocked for good", msg)
		default:
		}
		yHolder.Unlock()
	})
}

// TestCloseWhileWaiting is the README's pattern (defer locks.Close()) in a
// service that shuts down while its workers wait: one in Lock, one in
// LockContext, one holding. Nothing panics; LockContext returns ErrClosed;
// Lock stays blocked, as a sync.Mutex nobody unlocks would; the holder's
// Unlock reports the loss.
func TestCloseWhileWaiting(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		other := b.client(t)
		holdIn(t, other.NewMutex(name)) // so that c's goroutines wait
		// A log of its own, not the test's: the blocked Lock logs once it
		// sees the Close, which may come after the test returned.
		rec := &recordingHandler{}
		c, _ := clientWithErrors(t, b.rdb(t), WithLogger(slog.New(rec)))
		m := c.NewMutex(name)
		blocked := make(chan struct{})
		go func() {
			defer close(blocked)
			m.Lock()
			t.Errorf("Lock on a closed Client returned (without the lock)")
		}()
		ctxDone := make(chan error, 1)
		go func() { ctxDone <- m.LockContext(context.Background()) }()
		held := holdIn(t, c.NewMutex(name+"-held"))
		waitFor(t, "Lock and LockContext to wait", func() bool { return waitersOf(c, m) == 2 })

		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := await(t, ctxDone, "LockContext after Close"); !errors.Is(err, ErrClosed) {
			t.Errorf("LockContext waiting at Close: got %v, want ErrClosed", err)
		}
		held.release()
		if err := await(t, held.unlocked, "the holder's UnlockContext"); !errors.Is(err, ErrLockLost) {
			t.Errorf("UnlockContext of a hold Close ended: got %v, want ErrLockLost", err)
		}
		if err := m.LockContext(context.Background()); !errors.Is(err, ErrClosed) {
			t.Errorf("LockContext after Close: got %v, want ErrClosed", err)
		}
		if m.TryLock() {
			t.Errorf("TryLock after Close: got true, want false")
		}
		waitFor(t, "the waiting Lock to say it blocks for good", func() bool { return rec.count("Lock on a closed Client blocks for good") == 1 })
		select {
		case <-blocked:
			t.Errorf("Lock waiting at Close returned")
		default: // blocked for good (see TestMain's leak check)
		}
	})
}

// TestCloseWhileQueueing closes the Client while a LockContext's first
// call, which queues it, is on its way: the caller returns ErrClosed before
// the reply, and Redis queues it all the same. What leaves the queue is
// posted behind that call, so nothing is left queued.
func TestCloseWhileQueueing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		holdIn(t, b.client(t).NewMutex(name))
		rdb := b.rdb(t)
		var c *Client
		sent := make(chan struct{})
		var once sync.Once
		rdb.AddHook(hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if s, _ := scriptCall(cmd); s == "acquire" {
				once.Do(func() { close(sent) })
				<-c.closing // the reply comes after Close began
			}
			return next(ctx, cmd)
		}})
		c = clientOn(t, rdb)
		m := c.NewMutex(name)
		m.spec.Quick.Until.Store(math.MaxInt64) // acquire.lua, which queues, at once
		lctx, cancel := context.WithCancel(ctx) // a context that can end: the call goes through the drainer
		defer cancel()
		res := make(chan error, 1)
		go func() { res <- m.LockContext(lctx) }()
		<-sent
		require.NoError(t, c.Close())
		assert.ErrorIs(t, await(t, res, "LockContext"), ErrClosed)
		assert.Zero(t, rdb.Exists(ctx, k.queue).Val(), "queue left after Close: %v", rdb.LRange(ctx, k.queue, 0, -1).Val())
	})
}

// TestShutdownLetsHoldsFinish: Shutdown stops acquisitions at once (a
// waiter gets ErrClosed), lets the holder nest and release as usual, and
// returns once no hold is left; a hold that outlives Shutdown's context is
// lost.
func TestShutdownLetsHoldsFinish(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		holdIn(t, b.client(t).NewMutex(name+"-busy"))
		c, errs := clientWithErrors(t, b.rdb(t))
		m := c.NewMutex(name)
		h := holdIn(t, m)
		waiting := make(chan error, 1)
		busy := c.NewMutex(name + "-busy")
		go func() { waiting <- busy.LockContext(context.Background()) }()
		waitFor(t, "a waiter", func() bool { return waitersOf(c, busy) == 1 })

		shut := make(chan error, 1)
		go func() { shut <- c.Shutdown(testCtx(t, hangGuard)) }()
		if err := await(t, waiting, "the waiter at Shutdown"); !errors.Is(err, ErrClosed) {
			t.Errorf("LockContext waiting at Shutdown: got %v, want ErrClosed", err)
		}
		if err := c.NewMutex(name + "-new").LockContext(context.Background()); !errors.Is(err, ErrClosed) {
			t.Errorf("LockContext during Shutdown: got %v, want ErrClosed", err)
		}
		h.run(t, func() {
			if err := m.LockContext(context.Background()); err != nil {
				t.Errorf("nested LockContext of a holder during Shutdown: got %v, want nil", err)
			}
			if err := m.UnlockContext(context.Background()); err != nil {
				t.Errorf("nested UnlockContext during Shutdown: got %v, want nil", err)
			}
		})
		select {
		case err := <-shut:
			t.Fatalf("Shutdown returned %v while a hold was held", err)
		default:
		}
		h.release()
		if err := await(t, h.unlocked, "the holder's UnlockContext"); err != nil {
			t.Errorf("UnlockContext during Shutdown: got %v, want nil", err)
		}
		if err := await(t, shut, "Shutdown"); err != nil {
			t.Errorf("Shutdown: got %v, want nil", err)
		}
		if n := errs.count(ErrLockLost); n != 0 {
			t.Errorf("holds lost by a Shutdown that let them end: %d (%v)", n, errs)
		}
		if n := b.rdb(t).Exists(context.Background(), m.spec.hash()).Val(); n != 0 {
			t.Errorf("the released lock's key: EXISTS got %d, want 0", n)
		}

		// A hold that outlives Shutdown's context is lost.
		c2 := b.client(t)
		m2 := c2.NewMutex(name + "-2")
		lost := make(chan (<-chan struct{}), 1)
		h2 := holdIn(t, m2)
		h2.run(t, func() { lost <- m2.Lost() })
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := c2.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Shutdown with a hold left at its deadline: got %v, want context.DeadlineExceeded", err)
		}
		await(t, <-lost, "the hold left at Shutdown's deadline to be lost")
	})
}

// TestCloseBounded: Close returns within CloseTimeout while a Lock and a
// LockContext wait on an address that refuses connections (each call then
// spends go-redis's dial retries), whatever the go-redis options.
func TestCloseBounded(t *testing.T) {
	t.Parallel()
	eachRefusing(t, func(t *testing.T, rdb *redis.Client) {
		// The Lock's goroutine is parked for good once the Client is closed
		// (blockClosed), after a warning: the test awaits the warning, so
		// that nothing of it touches t after the test.
		parked := make(chan struct{})
		var once sync.Once
		logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			if bytes.Contains(p, []byte("blocks for good")) {
				once.Do(func() { close(parked) })
			}
			return len(p), nil
		}), nil))
		c := clientOn(t, rdb, WithLogger(logger))
		name := lockName(t)
		go func() {
			c.NewMutex(name).Lock()
			panic("Lock on a closed Client returned")
		}()
		ctxDone := make(chan error, 1)
		go func() { ctxDone <- c.NewMutex(name + "-ctx").LockContext(context.Background()) }()
		waitFor(t, "Lock and LockContext under way", func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.attempts == 2
		})
		within(t, "Close", CloseTimeout, c.Close)
		if err := await(t, ctxDone, "LockContext after Close"); !errors.Is(err, ErrClosed) {
			t.Errorf("LockContext at Close: got %v, want ErrClosed", err)
		}
		await(t, parked, "the Lock on the closed Client to park")
	})
}
