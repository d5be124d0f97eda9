package remutex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// Helpers of the multi-node tests and benchmarks that need the package: the
// deployments themselves (a Redis Cluster, a primary with a replica,
// independent servers for a quorum) and the fenced register are started by
// internal/redistest.

// topoPrefix returns a key prefix unique to the test, so that a test can list
// every key it made on a server other tests share.
func topoPrefix(t testing.TB) string {
	t.Helper()
	return "t" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
}

// nameOn returns a lock name, beginning with base, whose keys under prefix
// live on master.
func nameOn(t testing.TB, tc *redistest.Cluster, master *redistest.Node, prefix, base string) string {
	t.Helper()
	for i := 0; i < 1000; i++ {
		name := base + strconv.Itoa(i)
		if tc.Owner(t, tc.Masters[0], keySlot(prefix+"{"+name+"}")) == master {
			return name
		}
	}
	t.Fatalf("no name %s<n> lands on %v", base, master)
	return ""
}

// ------------------------------------------------------------ quorum

// quorumClient returns a Client on a quorum of srvs, each through a new
// go-redis client (pools of its own, standing for a separate process).
func quorumClient(t testing.TB, srvs []*redistest.Server, opts ...Option) *Client {
	t.Helper()
	rdbs := make([]redis.UniversalClient, len(srvs))
	for i, s := range srvs {
		rdbs[i] = rdbAt(t, s.Addr())
	}
	c := NewQuorumClient(rdbs, opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// hammer runs goroutines goroutines on each of the mutexes, each locking
// rounds times and entering reg while it holds the lock. Errors from
// LockContext and UnlockContext are returned, not fatal: the goroutines
// belong to the test.
func hammer(ctx context.Context, reg *redistest.Register, mutexes []*DistMutex, goroutines, rounds int) error {
	var wg sync.WaitGroup
	errc := make(chan error, len(mutexes)*goroutines)
	for i, m := range mutexes {
		for j := 0; j < goroutines; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				who := fmt.Sprintf("client %d goroutine %d", i, j)
				for r := 0; r < rounds; r++ {
					if err := m.LockContext(ctx); err != nil {
						errc <- fmt.Errorf("%s: LockContext: %w", who, err)
						return
					}
					reg.Enter(who, m.Fence())()
					if err := m.UnlockContext(context.Background()); err != nil {
						errc <- fmt.Errorf("%s: UnlockContext: %w", who, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// asyncLock is a LockContext running in a goroutine of the test: it
// reports the result, then holds the lock (a critical section of reg, if not
// nil) until unlock is called, and reports UnlockContext's error. The goroutine is cancelled and joined at the
// end of the test.
type asyncLock struct {
	locked   chan asyncResult
	release  chan struct{}
	once     sync.Once
	unlocked chan error
	exited   chan struct{}
}

type asyncResult struct {
	err   error
	fence int64
	at    time.Time // when LockContext returned
}

func lockAsync(t testing.TB, m *DistMutex, reg *redistest.Register, who string) *asyncLock {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := &asyncLock{
		locked:   make(chan asyncResult, 1),
		release:  make(chan struct{}),
		unlocked: make(chan error, 1),
		exited:   make(chan struct{}),
	}
	go func() {
		defer close(a.exited)
		err := m.LockContext(ctx)
		at := time.Now()
		if err != nil {
			a.locked <- asyncResult{err: err, at: at}
			return
		}
		end := func() {}
		if reg != nil {
			end = reg.Enter(who, m.Fence())
		}
		a.locked <- asyncResult{fence: m.Fence(), at: at}
		select {
		case <-a.release:
		case <-ctx.Done():
		}
		end()
		a.unlocked <- m.UnlockContext(context.Background())
	}()
	t.Cleanup(func() {
		cancel()
		<-a.exited
	})
	return a
}

// unlock lets the goroutine unlock.
func (a *asyncLock) unlock() { a.once.Do(func() { close(a.release) }) }

// settleDialers makes the end of the test wait (up to 3s) until go-redis
// has no dial-retry goroutine left. After a server is killed for good, a
// connection pool keeps one that sleeps a second between dials and notices
// only then that its pool was closed; the suite's goroutine-leak check
// must not find it. Call it first, so that it runs after every other
// cleanup.
func settleDialers(t testing.TB) {
	t.Helper()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		buf := make([]byte, 1<<20)
		for time.Now().Before(deadline) {
			n := runtime.Stack(buf, true)
			if !bytes.Contains(buf[:n], []byte("pool.(*ConnPool).tryDial")) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
