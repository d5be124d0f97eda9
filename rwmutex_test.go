package remutex

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRWMutexReadersShareWritersExclude: readers of two Clients hold at
// once; a writer waits for both, and new readers wait behind it.
func TestRWMutexReadersShareWritersExclude(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		a, c := b.client(t).NewRWMutex(name), b.client(t).NewRWMutex(name)
		r1, r2, w, late := newFaultGoroutine(t), newFaultGoroutine(t), newFaultGoroutine(t), newFaultGoroutine(t)
		r1.do(t, hangGuard, "RLock", a.RLock)
		var ok bool
		r2.do(t, hangGuard, "TryRLock", func() { ok = c.TryRLock() })
		require.True(t, ok, "a second reader, in another Client")
		w.do(t, hangGuard, "TryLock", func() { ok = c.TryLock() })
		require.False(t, ok, "a writer while readers hold")
		locked := w.async(c.Lock)
		rdb, k := b.rdb(t), rwKeysOf(name)
		awaitQueued(t, rdb, k, 1) // and listening, to keep its turn
		late.do(t, hangGuard, "TryRLock", func() { ok = a.TryRLock() })
		require.False(t, ok, "a new reader while a writer waits")
		rlocked := late.async(a.RLock)
		awaitQueued(t, rdb, k, 2)
		r1.do(t, hangGuard, "RUnlock", a.RUnlock)
		r2.do(t, hangGuard, "RUnlock", c.RUnlock)
		faultAwait(t, locked, hangGuard, "the writer once the readers left")
		select {
		case <-rlocked:
			t.Fatal("a reader got in while the writer held")
		default:
		}
		w.do(t, hangGuard, "Unlock", c.Unlock)
		faultAwait(t, rlocked, hangGuard, "the reader once the writer left")
		late.do(t, hangGuard, "RUnlock", a.RUnlock)
	})
}

// TestRWMutexDowngradeAndUpgrade: a writer that reads keeps its read hold
// when it unlocks the write; a reader asking for the write lock is told.
func TestRWMutexDowngradeAndUpgrade(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		rw, other := b.client(t).NewRWMutex(name, WithFencing()), b.client(t).NewRWMutex(name)
		g, o := newFaultGoroutine(t), newFaultGoroutine(t)
		var fence, rfence int64
		g.do(t, hangGuard, "Lock, RLock, Unlock", func() {
			rw.Lock()
			fence = rw.Fence()
			rw.RLock()
			rw.Unlock()
			rfence = rw.Fence()
		})
		assert.NotZero(t, fence)
		assert.Equal(t, fence, rfence, "a read hold gets the latest write's token")
		var ok bool
		o.do(t, hangGuard, "TryRLock", func() { ok = other.TryRLock() })
		assert.True(t, ok, "readers enter after the downgrade")
		o.do(t, hangGuard, "RUnlock", other.RUnlock)
		var err error
		var p interface{}
		g.do(t, hangGuard, "upgrade", func() {
			err = rw.LockContext(context.Background())
			ok = rw.TryLock()
			p = faultPanic(rw.Lock)
		})
		assert.ErrorIs(t, err, ErrUpgrade)
		assert.False(t, ok)
		require.NotNil(t, p)
		assert.ErrorIs(t, p.(error), ErrUpgrade)
		g.do(t, hangGuard, "RUnlock", rw.RUnlock)
		assert.True(t, strings.HasPrefix(fmt.Sprint(faultPanic(rw.RUnlock)), "remutex: RUnlock of unlocked DistRWMutex"))
		assert.True(t, strings.HasPrefix(fmt.Sprint(faultPanic(rw.Unlock)), "remutex: Unlock of unlocked DistRWMutex"))
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		g.do(t, hangGuard, "Lock", func() { err = rw.LockContext(ctx) })
		require.NoError(t, err)
		assert.Greater(t, rw.lockFence(g, t), fence)
		g.do(t, hangGuard, "Unlock", rw.Unlock)
		_ = errors.Is
		_ = time.Now
	})
}

func (rw *DistRWMutex) lockFence(g *faultGoroutine, t *testing.T) (f int64) {
	g.do(t, hangGuard, "Fence", func() { f = rw.Fence() })
	return f
}
