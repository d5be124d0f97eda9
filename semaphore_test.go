package remutex

// golang.org/x/sync/semaphore's tests (semaphore_test.go), ported onto
// DistSemaphore under the same names, and the semantics a distributed
// semaphore adds: permits of the value, the size stored in Redis, FIFO order
// across Clients, cancelled waiters, Do, fencing and fixed leases.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------- helpers

// semsOn returns a DistSemaphore of name and size on each of n new Clients
// of b (each on a pool of its own, as separate processes would be).
func semsOn(t testing.TB, b *testBackend, name string, size int64, n int, opts ...MutexOption) []*DistSemaphore {
	t.Helper()
	out := make([]*DistSemaphore, n)
	for i := range out {
		out[i] = b.client(t).NewSemaphore(name, size, opts...)
	}
	return out
}

// semWaiter is an Acquire running on a goroutine of the test. cancel ends
// its wait; the goroutine is cancelled and joined at the end of the test.
type semWaiter struct {
	res    chan error // Acquire's result
	cancel context.CancelFunc
	done   chan struct{}
}

// acquireAsync starts s.Acquire(ctx, n) on a goroutine of its own, ctx a
// child of parent.
func acquireAsync(t testing.TB, parent context.Context, s *DistSemaphore, n int64) *semWaiter {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	w := &semWaiter{res: make(chan error, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.res <- s.Acquire(ctx, n)
	}()
	t.Cleanup(func() {
		cancel()
		<-w.done
	})
	return w
}

// pending fails the test if the waiter's Acquire returned.
func (w *semWaiter) pending(t testing.TB, what string) {
	t.Helper()
	select {
	case err := <-w.res:
		t.Fatalf("%s: Acquire returned %v, want it still waiting", what, err)
	default:
	}
}

// acquired waits for the waiter's Acquire and fails the test unless it
// returned nil.
func (w *semWaiter) acquired(t testing.TB, what string) {
	t.Helper()
	if err := await(t, w.res, what); err != nil {
		t.Fatalf("%s: Acquire: got %v, want nil", what, err)
	}
}

// semQueued waits until the semaphore's queue in Redis has n entries, and
// the Client of each listens (see awaitInQueue).
func semQueued(t testing.TB, rdb *redis.Client, name string, n int64) {
	t.Helper()
	awaitInQueue(t, rdb, semKeysOf(name).queue, n)
}

// semState is what Redis has of a semaphore: its holders, the permits they
// hold, and the queue's length.
type semState struct{ holders, permits, queued int64 }

func semStateOf(t testing.TB, rdb *redis.Client, name string) semState {
	t.Helper()
	ctx := context.Background()
	k := semKeysOf(name)
	all, err := rdb.HGetAll(ctx, k.holders).Result()
	require.NoError(t, err)
	var st semState
	for owner, v := range all {
		// '<permits>[:<deadline>][,<fence>]' (see sem.lua)
		n := strings.FieldsFunc(v, func(r rune) bool { return r == ':' || r == ',' })[0]
		p, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			t.Fatalf("holder %s of %s: value %q is no holding", owner, k.holders, v)
		}
		st.holders++
		st.permits += p
	}
	st.queued, err = rdb.LLen(ctx, k.queue).Result()
	require.NoError(t, err)
	return st
}

// semKeysLeft fails the test if the semaphore's holders or queue exist.
func semKeysLeft(t testing.TB, rdb *redis.Client, name string) {
	t.Helper()
	k := semKeysOf(name)
	if n := rdb.Exists(context.Background(), k.holders, k.queue).Val(); n != 0 {
		t.Errorf("%d of %s, %s left behind, want none", n, k.holders, k.queue)
	}
}

// panicOf runs f and returns its panic's message, failing the test if it
// did not panic.
func panicOf(t testing.TB, what string, f func()) string {
	t.Helper()
	p := faultPanic(f)
	if p == nil {
		t.Fatalf("%s: did not panic", what)
	}
	return fmt.Sprint(p)
}

// ------------------------------------------------- x/sync's tests, ported

// hammerWeighted is x/sync's HammerWeighted: loops acquisitions of n
// permits, each held for up to a millisecond. inside counts the permits
// held by all the goroutines; above size is an error.
func hammerWeighted(ctx context.Context, sem *DistSemaphore, n int64, loops int, inside *atomic.Int64) error {
	for i := 0; i < loops; i++ {
		if err := sem.Acquire(ctx, n); err != nil {
			return err
		}
		if in := inside.Add(n); in > sem.Size() {
			return fmt.Errorf("%d permits held at once, size %d", in, sem.Size())
		}
		time.Sleep(rand.N(time.Millisecond))
		inside.Add(-n)
		sem.Release(n)
	}
	return nil
}

// TestWeighted: goroutine i of n acquires i permits of a semaphore of size
// n, over and over; never more than n are held at once.
func TestWeighted(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		const n, loops = 4, 15
		name := lockName(t)
		sem := b.client(t).NewSemaphore(name, n)
		ctx := testCtx(t, hangGuard)
		var inside atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- hammerWeighted(ctx, sem, int64(i), loops, &inside)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			assert.NoError(t, err)
		}
		assert.Zero(t, sem.Held(), "permits held after the hammer")
		semKeysLeft(t, b.rdb(t), name)
	})
}

// TestWeightedPanic: Release of a semaphore that holds nothing panics, and
// says so.
func TestWeightedPanic(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		w := b.client(t).NewSemaphore(lockName(t), 1)
		msg := panicOf(t, "Release(1) of nothing held", func() { w.Release(1) })
		assert.Contains(t, msg, "remutex: Release of more permits than held by DistSemaphore")
	})
}

// TestWeightedNegativeSizePanic: NewSemaphore of a negative size panics.
func TestWeightedNegativeSizePanic(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		c := b.client(t)
		msg := panicOf(t, "NewSemaphore(-1)", func() { c.NewSemaphore(lockName(t), -1) })
		assert.True(t, strings.HasPrefix(msg, "remutex: "), "the panic: got %q, want it to begin with remutex:", msg)
	})
}

// TestWeightedZeroSize: x/sync allows a semaphore of size 0; a distributed
// one of size 0 could never be held, so NewSemaphore panics. TryAcquire(0)
// is true all the same.
func TestWeightedZeroSize(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		c := b.client(t)
		panicOf(t, "NewSemaphore(0)", func() { c.NewSemaphore(lockName(t), 0) })
		w := c.NewSemaphore(lockName(t), 1)
		assert.True(t, w.TryAcquire(0), "TryAcquire(0)")
	})
}

// TestWeightedNegativeWeightPanic: Acquire, TryAcquire and Release of a
// negative number of permits panic.
func TestWeightedNegativeWeightPanic(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		w := b.client(t).NewSemaphore(lockName(t), 1)
		ctx := context.Background()
		panicOf(t, "Acquire(-1)", func() { _ = w.Acquire(ctx, -1) })
		panicOf(t, "TryAcquire(-1)", func() { w.TryAcquire(-1) })
		panicOf(t, "Release(-1)", func() { w.Release(-1) })
	})
}

// TestWeightedTryAcquire is x/sync's sequence of TryAcquire on a semaphore
// of size 2.
func TestWeightedTryAcquire(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		sem := b.client(t).NewSemaphore(name, 2)
		var tries []bool
		require.NoError(t, sem.Acquire(ctx, 1))
		tries = append(tries, sem.TryAcquire(1))
		tries = append(tries, sem.TryAcquire(1))

		sem.Release(2)

		tries = append(tries, sem.TryAcquire(1))
		require.NoError(t, sem.Acquire(ctx, 1))
		tries = append(tries, sem.TryAcquire(1))

		assert.Equal(t, []bool{true, false, true, false}, tries, "tries")
		sem.Release(2)
		semKeysLeft(t, b.rdb(t), name)
	})
}

// TestWeightedAcquire is x/sync's sequence of Acquire with a deadline on a
// semaphore of size 2. An Acquire that must succeed gets hangGuard; one
// that must not, a short deadline.
func TestWeightedAcquire(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		sem := b.client(t).NewSemaphore(lockName(t), 2)
		tryAcquire := func(n int64, expect bool) bool {
			d := 100 * time.Millisecond
			if expect {
				d = hangGuard
			}
			ctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			err := sem.Acquire(ctx, n)
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Acquire(%d): got %v, want nil or context.DeadlineExceeded", n, err)
			}
			return err == nil
		}

		var tries []bool
		require.NoError(t, sem.Acquire(ctx, 1))
		tries = append(tries, tryAcquire(1, true))
		tries = append(tries, tryAcquire(1, false))

		sem.Release(2)

		tries = append(tries, tryAcquire(1, true))
		require.NoError(t, sem.Acquire(ctx, 1))
		tries = append(tries, tryAcquire(1, false))

		assert.Equal(t, []bool{true, false, true, false}, tries, "tries")
		sem.Release(2)
	})
}

// TestWeightedDoesntBlockIfTooBig: x/sync lets Acquire of more than the
// size wait for its context, and checks that it blocks nobody. Here it
// fails at once with ErrTooManyPermits, even without a deadline, and
// leaves nothing queued; smaller requests go on. TryAcquire of too many
// panics (a misuse), TryAcquireContext returns the error.
func TestWeightedDoesntBlockIfTooBig(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		const n = 2
		name := lockName(t)
		sem := b.client(t).NewSemaphore(name, n)
		rdb := b.rdb(t)
		big := acquireAsync(t, context.Background(), sem, n+1)
		err := await(t, big.res, "Acquire(n+1) without a deadline")
		assert.ErrorIs(t, err, ErrTooManyPermits, "Acquire(n+1)")
		ok, err := sem.TryAcquireContext(context.Background(), n+1)
		assert.False(t, ok, "TryAcquireContext(n+1)")
		assert.ErrorIs(t, err, ErrTooManyPermits, "TryAcquireContext(n+1)")
		panicOf(t, "TryAcquire(n+1)", func() { sem.TryAcquire(n + 1) })
		assert.Zero(t, rdb.Exists(context.Background(), semKeysOf(name).queue).Val(), "queue after Acquire(n+1)")

		ctx := testCtx(t, hangGuard)
		var wg sync.WaitGroup
		errs := make(chan error, n*3)
		for i := n * 3; i > 0; i-- {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := sem.Acquire(ctx, 1)
				if err == nil {
					time.Sleep(time.Millisecond)
					sem.Release(1)
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			assert.NoError(t, err, "Acquire(1) after Acquire(%d) was refused", n+1)
		}
	})
}

// TestLargeAcquireDoesntStarve: n goroutines hold a permit each and keep
// giving it back and taking it again; an Acquire of all n gets in (the
// queue is FIFO: their Acquires wait behind it), rather than starving.
func TestLargeAcquireDoesntStarve(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		const n = 4
		sem := b.client(t).NewSemaphore(lockName(t), n)
		var running atomic.Bool
		running.Store(true)
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := n; i > 0; i-- {
			require.NoError(t, sem.Acquire(ctx, 1))
			wg.Add(1)
			go func() {
				defer wg.Done()
				held := true
				defer func() {
					if held {
						sem.Release(1)
					}
				}()
				for running.Load() {
					time.Sleep(time.Millisecond)
					sem.Release(1)
					if held = sem.Acquire(ctx, 1) == nil; !held {
						errs <- errors.New("Acquire(1) failed")
						return
					}
				}
			}()
		}
		err := sem.Acquire(ctx, n)
		running.Store(false)
		if err == nil {
			sem.Release(n)
		}
		wg.Wait()
		close(errs)
		require.NoError(t, err, "Acquire(n) while n goroutines keep taking 1")
		for err := range errs {
			t.Error(err)
		}
	})
}

// TestAllocCancelDoesntStarve: with 1 of 10 permits held, Acquire(10)
// waits (and blocks Acquire(1) behind it); cancelling it lets Acquire(1)
// in, and leaves no entry in the queue.
func TestAllocCancelDoesntStarve(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		sem := b.client(t).NewSemaphore(name, 10)
		require.NoError(t, sem.Acquire(testCtx(t, hangGuard), 1))

		big := acquireAsync(t, context.Background(), sem, 10)
		// Wait until the Acquire(_, 10) call blocks.
		waitFor(t, "Acquire(10) to wait", func() bool {
			if sem.TryAcquire(1) {
				sem.Release(1)
				return false
			}
			return true
		})

		// Acquire(1) while Acquire(10) is cancelled: both return.
		cancelled := make(chan struct{})
		go func() {
			defer close(cancelled)
			big.cancel()
		}()
		require.NoError(t, sem.Acquire(testCtx(t, hangGuard), 1), "Acquire(1)")
		await(t, cancelled, "the cancel")
		assert.ErrorIs(t, await(t, big.res, "the cancelled Acquire(10)"), context.Canceled)
		sem.Release(2)
		semKeysLeft(t, b.rdb(t), name)
	})
}

// TestWeightedAcquireCanceled (go.dev/issue/63615): an Acquire whose context
// is cancelled before the permits it waits for are released fails with the
// context's error and takes nothing; an Acquire with a done context fails
// even when it would not have to wait.
func TestWeightedAcquireCanceled(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		sem := b.client(t).NewSemaphore(lockName(t), 2)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		require.NoError(t, sem.Acquire(testCtx(t, hangGuard), 1))
		ch := make(chan struct{})
		go func() {
			defer close(ch)
			// Synchronize with the Acquire(2) below.
			for sem.TryAcquire(1) {
				sem.Release(1)
			}
			// Now cancel ctx, and then release the permit.
			cancel()
			sem.Release(1)
		}()
		// The context ends before the permits are free: this Acquire fails.
		err := sem.Acquire(ctx, 2)
		assert.ErrorIs(t, err, context.Canceled, "Acquire(2) with its context cancelled")
		// Both permits are free once the other goroutine released.
		await(t, ch, "the other goroutine")
		assert.Zero(t, sem.Held(), "permits held after the cancelled Acquire")
		waitFor(t, "TryAcquire(2) after the cancelled Acquire", func() bool { return sem.TryAcquire(2) })
		sem.Release(2)
		assert.ErrorIs(t, sem.Acquire(ctx, 1), context.Canceled, "Acquire(1) with a done context")
		assert.Zero(t, sem.Held(), "permits held after Acquire with a done context")
	})
}

// ------------------------------------------------------------ semantics

// TestSemaphoreReleaseByAnotherGoroutine: permits belong to the value, not
// to the goroutine that acquired them; permits of one value are fungible.
func TestSemaphoreReleaseByAnotherGoroutine(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		sems := semsOn(t, b, name, 3, 2)
		rdb := b.rdb(t)
		a := acquireAsync(t, context.Background(), sems[0], 2)
		a.acquired(t, "Acquire(2) on a goroutine")
		require.NoError(t, sems[0].Acquire(testCtx(t, hangGuard), 1))
		assert.Equal(t, int64(3), sems[0].Held(), "Held")
		assert.Equal(t, semState{2, 3, 0}, semStateOf(t, rdb, name), "holders, permits, queued")
		released := make(chan struct{})
		go func() {
			defer close(released)
			sems[0].Release(2) // a goroutine that acquired none of them
		}()
		await(t, released, "Release(2) on another goroutine")
		assert.Equal(t, int64(1), sems[0].Held(), "Held after Release(2)")
		assert.Equal(t, int64(1), semStateOf(t, rdb, name).permits, "permits held in Redis after Release(2)")
		assert.True(t, sems[1].TryAcquire(2), "another Client's TryAcquire(2)")
		sems[0].Release(1)
		sems[1].Release(2)
		semKeysLeft(t, rdb, name)
	})
}

// TestSemaphoreValuesShareSize: two values of one name in one Client are
// two holders of the same size; each releases only what it holds.
func TestSemaphoreValuesShareSize(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		c := b.client(t)
		s1, s2 := c.NewSemaphore(name, 3), c.NewSemaphore(name, 3)
		ctx := testCtx(t, hangGuard)
		require.NoError(t, s1.Acquire(ctx, 2))
		assert.False(t, s2.TryAcquire(2), "the second value's TryAcquire(2) with 2 of 3 held by the first")
		assert.True(t, s2.TryAcquire(1), "the second value's TryAcquire(1)")
		assert.False(t, s1.TryAcquire(1), "the first value's TryAcquire(1) with all 3 held")
		assert.Equal(t, []int64{2, 1}, []int64{s1.Held(), s2.Held()}, "Held of each value")
		panicOf(t, "the second value's Release(2) holding 1", func() { s2.Release(2) })
		assert.Equal(t, int64(1), s2.Held(), "the second value's Held after the refused Release")
		s1.Release(2)
		s2.Release(1)
		semKeysLeft(t, b.rdb(t), name)
	})
}

// TestSemaphoreReleaseMoreThanHeld: Release of more than the value holds
// panics and ReleaseContext returns ErrNotHeld; neither releases anything.
func TestSemaphoreReleaseMoreThanHeld(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		sem := b.client(t).NewSemaphore(name, 3)
		rdb := b.rdb(t)
		ctx := testCtx(t, hangGuard)
		require.NoError(t, sem.Acquire(ctx, 1))
		require.NoError(t, sem.Acquire(ctx, 1))
		msg := panicOf(t, "Release(3) holding 2", func() { sem.Release(3) })
		assert.Contains(t, msg, "3 released, 2 held")
		err := sem.ReleaseContext(ctx, 3)
		assert.ErrorIs(t, err, ErrNotHeld, "ReleaseContext(3) holding 2")
		assert.Equal(t, int64(2), sem.Held(), "Held after the refused releases")
		assert.Equal(t, semState{2, 2, 0}, semStateOf(t, rdb, name), "holders, permits, queued after the refused releases")
		require.NoError(t, sem.ReleaseContext(ctx, 2))
		assert.ErrorIs(t, sem.ReleaseContext(ctx, 1), ErrNotHeld, "ReleaseContext(1) holding nothing")
		semKeysLeft(t, rdb, name)
	})
}

// TestSemaphoreSizeMismatch: a semaphore of another size under a name in
// use, or whose size Redis keeps from earlier use, gets *SizeError naming
// the key and both sizes; deleting the key lets it be resized.
func TestSemaphoreSizeMismatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := semKeysOf(name)
		rdb := b.rdb(t)
		ctx := testCtx(t, hangGuard)
		s3, s5 := b.client(t).NewSemaphore(name, 3), b.client(t).NewSemaphore(name, 5)
		checkSizeError := func(what string, err error) {
			t.Helper()
			var se *SizeError
			if !errors.As(err, &se) {
				t.Fatalf("%s: got %v, want a *SizeError", what, err)
			}
			assert.Equal(t, SizeError{Key: k.size, Size: 5, Stored: 3}, *se, what)
		}
		require.NoError(t, s3.Acquire(ctx, 1))
		assert.Equal(t, "3", rdb.Get(ctx, k.size).Val(), "the size in Redis")
		checkSizeError("Acquire of size 5 while size 3 is held", s5.Acquire(ctx, 1))
		_, err := s5.TryAcquireContext(ctx, 1)
		checkSizeError("TryAcquireContext of size 5", err)
		panicOf(t, "TryAcquire of size 5", func() { s5.TryAcquire(1) })
		s3.Release(1)
		checkSizeError("Acquire of size 5 with nothing held", s5.Acquire(ctx, 1))
		assert.Equal(t, semState{}, semStateOf(t, rdb, name), "what the refused calls left")

		require.NoError(t, rdb.Del(ctx, k.size).Err())
		require.NoError(t, s5.Acquire(ctx, 5), "Acquire(5) after the size key was deleted")
		assert.Equal(t, "5", rdb.Get(ctx, k.size).Val(), "the size in Redis after the resize")
		s5.Release(5)
	})
}

// TestNewSemaphorePanics: a size out of range or a bad name panics in
// NewSemaphore with remutex's prefix, before any command.
func TestNewSemaphorePanics(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		log := newCommandLog()
		rdb := b.rdb(t)
		rdb.AddHook(log)
		c := clientOn(t, rdb)
		for _, tc := range []struct {
			what string
			name string
			size int64
		}{
			{"size 0", "ok", 0},
			{"size -1", "ok", -1},
			{"size above MaxInt32", "ok", math.MaxInt32 + 1},
			{"empty name", "", 1},
			{"name over 1 KiB", strings.Repeat("n", 1025), 1},
		} {
			msg := panicOf(t, tc.what, func() { c.NewSemaphore(tc.name, tc.size) })
			assert.True(t, strings.HasPrefix(msg, "remutex: "), "%s: the panic %q, want it to begin with remutex:", tc.what, msg)
		}
		assert.Equal(t, int64(math.MaxInt32), c.NewSemaphore("max", math.MaxInt32).Size(), "Size of the largest semaphore")
		_, cmds := log.counts()
		assert.Empty(t, cmds, "commands sent by NewSemaphore")
	})
}

// TestSemaphoreZeroPermits: Acquire and TryAcquire of 0 permits succeed
// without a call (Acquire with a done context returns its error), Release
// of 0 does nothing, and Do of 0 runs f with the caller's context.
func TestSemaphoreZeroPermits(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		rdb := b.rdb(t)
		sem := b.client(t).NewSemaphore(name, 1)
		assert.True(t, sem.TryAcquire(0), "TryAcquire(0)")
		assert.NoError(t, sem.Acquire(context.Background(), 0), "Acquire(ctx, 0)")
		done, cancel := context.WithCancel(context.Background())
		cancel()
		assert.ErrorIs(t, sem.Acquire(done, 0), context.Canceled, "Acquire(0) with a done context")
		sem.Release(0)
		assert.NoError(t, sem.ReleaseContext(context.Background(), 0), "ReleaseContext(0)")
		var fence int64 = -1
		err := sem.Do(context.Background(), 0, func(ctx context.Context, f int64) error { fence = f; return nil })
		assert.NoError(t, err, "Do(0)")
		assert.Zero(t, fence, "Do(0)'s fence")
		assert.Zero(t, sem.Held(), "Held")
		k := semKeysOf(name)
		assert.Zero(t, rdb.Exists(context.Background(), k.holders, k.queue, k.size, k.fence).Val(), "keys written for 0 permits")
	})
}

// TestSemaphoreFIFOAcrossClients: waiters of three Clients are served in
// the order they came, a request that does not fit blocking the smaller
// ones behind it (no barging, TryAcquire included); one release serves every
// head that fits.
func TestSemaphoreFIFOAcrossClients(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		rdb := b.rdb(t)
		sems := semsOn(t, b, name, 2, 4)
		ctx := testCtx(t, hangGuard)
		require.NoError(t, sems[0].Acquire(ctx, 2))
		big := acquireAsync(t, ctx, sems[1], 2)
		semQueued(t, rdb, name, 1)
		small := acquireAsync(t, ctx, sems[2], 1)
		semQueued(t, rdb, name, 2)
		late := acquireAsync(t, ctx, sems[3], 1)
		semQueued(t, rdb, name, 3)

		sems[0].Release(1)
		assert.Equal(t, semState{1, 1, 3}, semStateOf(t, rdb, name), "holders, permits, queued with 1 permit free and Acquire(2) at the head")
		assert.False(t, sems[3].TryAcquire(1), "TryAcquire(1) of the free permit while others queue")
		small.pending(t, "Acquire(1) behind Acquire(2) with 1 permit free")

		sems[0].Release(1)
		big.acquired(t, "Acquire(2) at the head, both permits free")
		assert.Equal(t, semState{1, 2, 2}, semStateOf(t, rdb, name), "holders, permits, queued once the head got in")
		small.pending(t, "Acquire(1) while the head holds both")
		late.pending(t, "the last Acquire(1) while the head holds both")

		sems[1].Release(2)
		small.acquired(t, "the second waiter")
		late.acquired(t, "the third waiter")
		assert.Equal(t, semState{2, 2, 0}, semStateOf(t, rdb, name), "holders, permits, queued once one release served both")
		sems[2].Release(1)
		sems[3].Release(1)
		semKeysLeft(t, rdb, name)
	})
}

// TestSemaphoreCancelledWaiterLeavesNoTrace: a waiter at the head of the
// queue that gives up leaves no entry, holds nothing, and lets the smaller
// request it blocked take the free permit at once.
func TestSemaphoreCancelledWaiterLeavesNoTrace(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		rdb := b.rdb(t)
		sems := semsOn(t, b, name, 2, 3)
		ctx := testCtx(t, hangGuard)
		require.NoError(t, sems[0].Acquire(ctx, 2))
		big := acquireAsync(t, ctx, sems[1], 2)
		semQueued(t, rdb, name, 1)
		small := acquireAsync(t, ctx, sems[2], 1)
		semQueued(t, rdb, name, 2)
		sems[0].Release(1)
		small.pending(t, "Acquire(1) behind Acquire(2)")

		big.cancel()
		assert.ErrorIs(t, await(t, big.res, "the cancelled Acquire(2)"), context.Canceled)
		small.acquired(t, "Acquire(1) once the head gave up")
		assert.Equal(t, semState{2, 2, 0}, semStateOf(t, rdb, name), "holders, permits, queued")
		assert.Zero(t, rdb.Exists(ctx, semKeysOf(name).queue).Val(), "the queue after the waiters left it")
		assert.Zero(t, sems[1].Held(), "Held of the cancelled waiter")
		sems[0].Release(1)
		sems[2].Release(1)
		semKeysLeft(t, rdb, name)
	})
}

// TestSemaphoreDo: Do runs f with the acquisition's fence and a context
// that ends (ErrReleased) once the permits are given back; it returns f's
// error; f may release some of its permits itself; a panic in f goes on
// after the permits were given back.
func TestSemaphoreDo(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		rdb := b.rdb(t)
		sems := semsOn(t, b, name, 3, 2, WithFencing())
		s := sems[0]
		ctx := testCtx(t, hangGuard)
		fErr := errors.New("f's error")
		var fence, held int64
		var st semState
		var fctx context.Context
		err := s.Do(ctx, 2, func(ctx context.Context, f int64) error {
			fctx, fence, held, st = ctx, f, s.Held(), semStateOf(t, rdb, name)
			s.Release(1)
			return fErr
		})
		assert.ErrorIs(t, err, fErr, "Do's error")
		assert.Positive(t, fence, "Do's fence")
		assert.Equal(t, int64(2), held, "Held inside Do(2)")
		assert.Equal(t, semState{1, 2, 0}, st, "holders, permits, queued inside Do(2)")
		assert.ErrorIs(t, context.Cause(fctx), ErrReleased, "the cause of Do's context once it returned")
		assert.Zero(t, s.Held(), "Held after Do")
		semKeysLeft(t, rdb, name)

		p := faultPanic(func() {
			_ = s.Do(ctx, 3, func(context.Context, int64) error { panic("in f") })
		})
		assert.Equal(t, "in f", p, "the panic out of Do")
		assert.Zero(t, s.Held(), "Held after f panicked")
		assert.True(t, sems[1].TryAcquire(3), "another Client's TryAcquire(3) after f panicked")
		sems[1].Release(3)

		ended, cancel := context.WithCancel(ctx)
		cancel()
		called := false
		err = s.Do(ended, 1, func(context.Context, int64) error { called = true; return nil })
		assert.ErrorIs(t, err, context.Canceled, "Do with a done context")
		assert.False(t, called, "Do with a done context called f")
	})
}

// TestSemaphoreFencing: WithFencing gives every acquisition a token above
// all earlier ones, across Clients and through a hand-off; Fence is the
// latest held acquisition's, Lost its channel (closed when nothing is
// held). Without the option Fence is 0.
func TestSemaphoreFencing(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		rdb := b.rdb(t)
		sems := semsOn(t, b, name, 2, 2, WithFencing())
		s, o := sems[0], sems[1]
		ctx := testCtx(t, hangGuard)
		assert.True(t, isClosed(s.Lost()), "Lost of a value that holds nothing: want closed")
		assert.Zero(t, s.Fence(), "Fence of a value that holds nothing")

		require.NoError(t, s.Acquire(ctx, 1))
		f1, lost1 := s.Fence(), s.Lost()
		require.NoError(t, o.Acquire(ctx, 1))
		f2 := o.Fence()
		w := acquireAsync(t, ctx, s, 1)
		semQueued(t, rdb, name, 1)
		o.Release(1)
		w.acquired(t, "Acquire(1) handed the released permit")
		f3, lost3 := s.Fence(), s.Lost()
		assert.Positive(t, f1, "the first fence")
		assert.Less(t, f1, f2, "fences of the first two acquisitions")
		assert.Less(t, f2, f3, "the fence of the hand-off after the second")
		assert.NotEqual(t, lost1, lost3, "Lost of two acquisitions: want a channel each")
		assert.False(t, isClosed(lost1) || isClosed(lost3), "Lost of held acquisitions: want open")

		s.Release(1) // the latest acquisition first
		assert.Equal(t, f1, s.Fence(), "Fence after the latest acquisition was released")
		s.Release(1)
		assert.Zero(t, s.Fence(), "Fence after everything was released")
		require.NoError(t, o.Acquire(ctx, 2))
		assert.Less(t, f3, o.Fence(), "the fence of a later uncontended acquisition")
		o.Release(2)

		plain := b.client(t).NewSemaphore(name, 2)
		require.NoError(t, plain.Acquire(ctx, 1))
		assert.Zero(t, plain.Fence(), "Fence without WithFencing")
		plain.Release(1)
	})
}

// TestSemaphoreWithoutRenewal: a fixed lease is not renewed: the permits
// come back when it ends, to a waiter of another Client; the holding's Lost
// closes and its release reports ErrLockLost.
func TestSemaphoreWithoutRenewal(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		const lease = 300 * time.Millisecond
		name := lockName(t)
		rdb := b.rdb(t)
		ctx := testCtx(t, hangGuard)
		s := b.client(t).NewSemaphore(name, 2, WithLease(lease), WithoutRenewal())
		o := b.client(t).NewSemaphore(name, 2)
		require.NoError(t, s.Acquire(ctx, 2))
		lost := s.Lost()
		w := acquireAsync(t, ctx, o, 1)
		semQueued(t, rdb, name, 1)
		var err error
		waitFor(t, "the waiter to get a permit once the fixed lease ended", func() bool {
			b.fastForward(20 * time.Millisecond) // miniredis: the lone holder's lease is its key's TTL
			select {
			case err = <-w.res:
				return true
			default:
				return false
			}
		})
		require.NoError(t, err, "the waiter's Acquire")
		await(t, lost, "Lost of the fixed lease")
		assert.Zero(t, s.Held(), "Held after the fixed lease ended")
		assert.ErrorIs(t, s.ReleaseContext(ctx, 2), ErrLockLost, "ReleaseContext(2) after the fixed lease ended")
		assert.Equal(t, semState{1, 1, 0}, semStateOf(t, rdb, name), "holders, permits, queued")
		o.Release(1)
	})
}

// TestSemaphoreForeignData: a key of the semaphore that holds data of
// another kind makes Acquire and TryAcquireContext return a *WrongTypeError
// naming it (TryAcquire panics with it), leaves the data untouched and
// writes no other key.
func TestSemaphoreForeignData(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		c := b.client(t)
		rdb := b.rdb(t)
		set := func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }
		for _, tc := range []struct {
			what  string
			key   func(semKeyNames) string
			plant func(key string) error
			typ   string
		}{
			{"string at the holders key", func(k semKeyNames) string { return k.holders }, set, "string"},
			{"field that is no holding", func(k semKeyNames) string { return k.holders }, func(key string) error { return rdb.HSet(ctx, key, "someone:1", "precious").Err() }, foreignField},
			{"hash at the size key", func(k semKeyNames) string { return k.size }, func(key string) error { return rdb.HSet(ctx, key, "f", "precious").Err() }, "hash"},
			{"text at the size key", func(k semKeyNames) string { return k.size }, set, nonInteger},
			{"text at the fence key", func(k semKeyNames) string { return k.fence }, set, nonInteger},
			{"string at the queue key", func(k semKeyNames) string { return k.queue }, set, "string"},
		} {
			name := lockName(t) + "." + tc.what
			k := semKeysOf(name)
			key := tc.key(k)
			require.NoError(t, tc.plant(key))
			dump := rdb.Dump(ctx, key).Val()
			s := c.NewSemaphore(name, 2, WithFencing())
			check := func(op string, err error) {
				t.Helper()
				var wt *WrongTypeError
				if assert.ErrorAs(t, err, &wt, "%s, %s", op, tc.what) {
					assert.Equal(t, WrongTypeError{Key: key, Type: tc.typ}, *wt, "%s, %s", op, tc.what)
				}
			}
			check("Acquire", s.Acquire(ctx, 1))
			_, err := s.TryAcquireContext(ctx, 1)
			check("TryAcquireContext", err)
			v, isErr := faultPanic(func() { s.TryAcquire(1) }).(error)
			if !isErr {
				t.Errorf("TryAcquire's panic, %s: got %T, want an error", tc.what, v)
			} else {
				check("TryAcquire's panic", v)
			}
			assert.Zero(t, s.Held(), "Held, %s", tc.what)
			assert.Equal(t, dump, rdb.Dump(ctx, key).Val(), "%s: the data at %s", tc.what, key)
			for _, other := range []string{k.holders, k.fence, k.queue, k.size} {
				if other != key && rdb.Exists(ctx, other).Val() != 0 {
					t.Errorf("%s: %s written beside the foreign data", tc.what, other)
				}
			}
		}
	})
}
