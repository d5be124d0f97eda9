package remutex

// Go's own src/sync/rwmutex_test.go (TestParallelReaders, TestRWMutex with
// HammerRWMutex, TestRLocker), ported onto DistRWMutex across Clients, on
// miniredis and a real redis-server, and sync's writer preference. The
// goroutines report what they saw instead of panicking, and use the Context
// forms where a broken lock would leave them blocked, so that a failure ends
// the test instead of hanging it.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rwGroup runs the goroutines of a test and collects their errors.
type rwGroup struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

// goErr runs f on a goroutine of the group.
func (g *rwGroup) goErr(f func() error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := f(); err != nil {
			g.mu.Lock()
			g.errs = append(g.errs, err)
			g.mu.Unlock()
		}
	}()
}

// wait joins the goroutines (failing the test if they take more than
// hangGuard, when their contexts end them) and reports their errors.
func (g *rwGroup) wait(t testing.TB) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		g.wg.Wait()
		close(done)
	}()
	faultAwait(t, done, 2*hangGuard, "the test's goroutines to finish")
	for _, err := range g.errs {
		t.Error(err)
	}
}

// rwClients returns n DistRWMutexes of one lock, each of a Client of its
// own.
func rwClients(t testing.TB, b *testBackend, name string, n int, opts ...MutexOption) []*DistRWMutex {
	t.Helper()
	rws := make([]*DistRWMutex, n)
	for i := range rws {
		rws[i] = b.client(t).NewRWMutex(name, opts...)
	}
	return rws
}

// TestSyncRWParallelReaders is sync's TestParallelReaders: readers in two
// Clients all hold the read lock at once (each waits, holding it, until all
// of them got it).
func TestSyncRWParallelReaders(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		for _, readers := range []int{1, 3, 4} {
			t.Run(fmt.Sprint(readers), func(t *testing.T) {
				rws := rwClients(t, b, lockName(t), 2)
				ctx := testCtx(t, hangGuard)
				locked := make(chan bool, readers)
				unlock := make(chan struct{})
				var g rwGroup
				for i := 0; i < readers; i++ {
					rw := rws[i%2]
					g.goErr(func() error {
						if err := rw.RLockContext(ctx); err != nil {
							return fmt.Errorf("reader %d: RLockContext: %w", i, err)
						}
						locked <- true
						<-unlock
						return rw.RUnlockContext(context.Background())
					})
				}
				for i := 0; i < readers; i++ {
					await(t, locked, fmt.Sprintf("reader %d of %d to hold the read lock with the others", i+1, readers))
				}
				close(unlock)
				g.wait(t)
			})
		}
	})
}

// TestSyncRWMutex is sync's TestRWMutex: TryLock and TryRLock against held
// locks (NonReentrant, so that the test goroutine is any holder, as with
// sync.RWMutex), then HammerRWMutex.
func TestSyncRWMutex(t *testing.T) {
	// Serial: a hammer, whose holds from grants must be renewed within
	// their claim window (maxQueueTTL), which the stalls of a machine busy
	// with the parallel tests could outlast.
	eachBackend(t, func(t *testing.T, b *testBackend) {
		m := b.client(t).NewRWMutex(lockName(t), NonReentrant())
		m.Lock()
		assert.False(t, m.TryLock(), "TryLock succeeded with mutex locked")
		assert.False(t, m.TryRLock(), "TryRLock succeeded with mutex locked")
		m.Unlock()
		require.True(t, m.TryLock(), "TryLock failed with mutex unlocked")
		m.Unlock()
		require.True(t, m.TryRLock(), "TryRLock failed with mutex unlocked")
		require.True(t, m.TryRLock(), "TryRLock failed with mutex rlocked")
		assert.False(t, m.TryLock(), "TryLock succeeded with mutex rlocked")
		m.RUnlock()
		m.RUnlock()

		iterations := 12
		if !b.real() {
			iterations = 4 // see TestHammer
		}
		for _, mode := range []struct {
			name string
			opts []MutexOption
		}{{"PerGoroutine", nil}, {"NonReentrant", []MutexOption{NonReentrant()}}} {
			for _, readers := range []int{1, 3, 10} {
				t.Run(fmt.Sprintf("%s/%dReaders", mode.name, readers), func(t *testing.T) {
					hammerRWMutex(t, rwClients(t, b, lockName(t), 3, mode.opts...), readers, iterations)
				})
			}
		}
	})
}

// hammerRWMutex is sync's HammerRWMutex: two writers and readers goroutines
// spread over rws (the same lock in several Clients). activity counts the
// readers inside plus 10000 per writer inside: a reader must find it between
// 1 and 9999, a writer exactly 10000. Each stays inside for a moment (sync's
// empty loop; here a pause, as round trips are long) so that a hold that
// overlaps another is seen.
func hammerRWMutex(t *testing.T, rws []*DistRWMutex, readers, iterations int) {
	ctx := testCtx(t, 2*hangGuard)
	var activity atomic.Int32
	inside := func() { time.Sleep(200 * time.Microsecond) }
	var g rwGroup
	writer := func(rw *DistRWMutex) error {
		for i := 0; i < iterations; i++ {
			if err := rw.LockContext(ctx); err != nil {
				return fmt.Errorf("writer: LockContext: %w", err)
			}
			n := activity.Add(10000)
			inside()
			activity.Add(-10000)
			if err := rw.UnlockContext(context.Background()); err != nil {
				return fmt.Errorf("writer: UnlockContext: %w", err)
			}
			if n != 10000 {
				return fmt.Errorf("wlock(%d): a writer found others inside", n)
			}
		}
		return nil
	}
	reader := func(rw *DistRWMutex) error {
		for i := 0; i < iterations; i++ {
			if err := rw.RLockContext(ctx); err != nil {
				return fmt.Errorf("reader: RLockContext: %w", err)
			}
			n := activity.Add(1)
			inside()
			activity.Add(-1)
			if err := rw.RUnlockContext(context.Background()); err != nil {
				return fmt.Errorf("reader: RUnlockContext: %w", err)
			}
			if n < 1 || n >= 10000 {
				return fmt.Errorf("rlock(%d): a reader found a writer inside", n)
			}
		}
		return nil
	}
	k := 0
	next := func() *DistRWMutex { k++; return rws[k%len(rws)] }
	w1 := next()
	g.goErr(func() error { return writer(w1) })
	i := 0
	for ; i < readers/2; i++ {
		rw := next()
		g.goErr(func() error { return reader(rw) })
	}
	rw := next()
	g.goErr(func() error { return writer(rw) })
	for ; i < readers; i++ {
		rw := next()
		g.goErr(func() error { return reader(rw) })
	}
	g.wait(t)
}

// TestSyncRLocker is sync's TestRLocker: RLocker's Lock takes a read hold
// (twice: two holds), the write lock waits for both to end, and a read waits
// for the writer. The holds belong to the value (NonReentrant), as sync's
// test needs: the test goroutine releases what another took.
func TestSyncRLocker(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		wl := b.client(t).NewRWMutex(lockName(t), NonReentrant())
		rl := wl.RLocker()
		wlocked := make(chan bool, 1)
		rlocked := make(chan bool, 1)
		const n = 5
		var g rwGroup
		ctx := testCtx(t, 2*hangGuard)
		g.goErr(func() error {
			for i := 0; i < n; i++ {
				rl.Lock()
				rl.Lock()
				rlocked <- true
				if err := wl.LockContext(ctx); err != nil {
					return fmt.Errorf("round %d: LockContext: %w", i, err)
				}
				wlocked <- true
			}
			return nil
		})
		for i := 0; i < n; i++ {
			await(t, rlocked, "the two read holds")
			rl.Unlock()
			select {
			case <-wlocked:
				t.Fatal("RLocker() didn't read-lock it")
			default:
			}
			rl.Unlock()
			await(t, wlocked, "the write lock once both read holds ended")
			select {
			case <-rlocked:
				t.Fatal("RLocker() didn't respect the write lock")
			default:
			}
			wl.Unlock()
		}
		g.wait(t)
	})
}

// TestSyncRWWriterPreference is sync.RWMutex's documented rule, on one
// value shared by goroutines (NonReentrant, as a sync.RWMutex): once a
// writer waits for the readers, TryRLock says false and RLock waits until
// the writer has held the lock and released it.
func TestSyncRWWriterPreference(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		m := b.client(t).NewRWMutex(name, NonReentrant())
		r, w, late := newFaultGoroutine(t), newFaultGoroutine(t), newFaultGoroutine(t)
		r.do(t, hangGuard, "RLock", m.RLock)
		var wrote atomic.Bool
		locked := w.async(func() { m.Lock(); wrote.Store(true) })
		awaitQueued(t, rdb, k, 1)
		var ok bool
		late.do(t, hangGuard, "TryRLock", func() { ok = m.TryRLock() })
		assert.False(t, ok, "TryRLock while a writer waits: got true, want false")
		var sawWrite bool
		rlocked := late.async(func() { m.RLock(); sawWrite = wrote.Load() })
		awaitQueued(t, rdb, k, 2)
		r.do(t, hangGuard, "RUnlock", m.RUnlock)
		faultAwait(t, locked, hangGuard, "the writer once the reader left")
		notYet(t, rlocked, "the late reader while the writer holds")
		w.do(t, hangGuard, "Unlock", m.Unlock)
		faultAwait(t, rlocked, hangGuard, "the late reader once the writer left")
		assert.True(t, sawWrite, "the late reader got in before the writer")
		late.do(t, hangGuard, "RUnlock", m.RUnlock)
	})
}
