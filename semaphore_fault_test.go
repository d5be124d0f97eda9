package remutex

// DistSemaphore across Clients and processes (a hammer with a counter in
// Redis, a holder process SIGKILLed), and its faults: Redis restarted,
// paused, the semaphore's key deleted.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// The environment of a semaphore child, besides childConfig's.
const (
	childSizeEnv    = "REMUTEX_CHILD_SIZE"
	childCounterEnv = "REMUTEX_CHILD_COUNTER"
)

// semRole is a child that works a DistSemaphore of cfg.Name (its size in
// REMUTEX_CHILD_SIZE) under the parent's commands, one per stdin line:
//
//	acquire <n>   Acquire; emits "acquired <Held>" or "error <kind>"
//	release <n>   ReleaseContext; emits "released <error kind>"
//	hammer <r>    runs semHammer with cfg.Goroutines goroutines of r rounds
//	              on the counter in REMUTEX_CHILD_COUNTER; emits "hammered
//	              <acquisitions> <most inside>" or "bad <what>"
//	exit          closes the Client and exits
func semRole(cfg childConfig) int {
	size, _ := strconv.ParseInt(os.Getenv(childSizeEnv), 10, 64)
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	c := NewClient(rdb, WithLogger(slog.New(slog.DiscardHandler)))
	s := c.NewSemaphore(cfg.Name, size, WithLease(cfg.Lease))
	ctx := context.Background()
	redistest.Emit("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		n, _ := strconv.ParseInt(arg, 10, 64)
		switch cmd {
		case "acquire":
			if err := s.Acquire(ctx, n); err != nil {
				redistest.Emit("error", faultErrKind(err))
			} else {
				redistest.Emit("acquired", s.Held())
			}
		case "release":
			redistest.Emit("released", faultErrKind(s.ReleaseContext(ctx, n)))
		case "hammer":
			h := &semHammer{sems: []*DistSemaphore{s}, rdb: rdb, counter: os.Getenv(childCounterEnv), rounds: int(n)}
			if err := h.run(ctx, cfg.Goroutines); err != nil {
				redistest.Emit("bad", strings.ReplaceAll(err.Error(), " ", "_"))
			} else {
				redistest.Emit("hammered", h.acquisitions.Load(), h.most.Load())
			}
		case "exit":
			_ = c.Close()
			_ = rdb.Close()
			return 0
		}
	}
	return 0
}

// startSemChild starts a child in the role "sem" on the semaphore name of
// size at addr; it is killed and reaped at the end of the test.
func startSemChild(t testing.TB, addr, name string, size int64, lease time.Duration, goroutines int, counter string) *redistest.Child {
	t.Helper()
	cfg := childConfig{Role: "sem", Addr: addr, Name: name, Lease: lease, ID: "sem", Goroutines: goroutines}
	ch := redistest.StartChild(t, cfg.Role, cfg.ID, append(cfg.Env(),
		childSizeEnv+"="+strconv.FormatInt(size, 10), childCounterEnv+"="+counter)...)
	ch.Expect(t, "ready", hangGuard)
	return ch
}

// semHammer has goroutines on each of sems acquire 1 or 2 permits rounds
// times, and count the permits inside in a Redis counter (INCRBY after
// Acquire, DECRBY before Release), shared by every process: a count above
// the size is an error.
type semHammer struct {
	sems         []*DistSemaphore
	rdb          redis.Cmdable
	counter      string
	rounds       int
	acquisitions atomic.Int64
	most         atomic.Int64 // the most permits seen inside at once
}

// run runs goroutines goroutines on each semaphore and returns their errors.
func (h *semHammer) run(ctx context.Context, goroutines int) error {
	var wg sync.WaitGroup
	errc := make(chan error, len(h.sems)*goroutines)
	for i, s := range h.sems {
		for j := 0; j < goroutines; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := h.loop(ctx, s); err != nil {
					errc <- fmt.Errorf("semaphore %d goroutine %d: %w", i, j, err)
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

func (h *semHammer) loop(ctx context.Context, s *DistSemaphore) error {
	for r := 0; r < h.rounds; r++ {
		n := 1 + rand.Int64N(min(2, s.Size()))
		if err := s.Acquire(ctx, n); err != nil {
			return fmt.Errorf("Acquire(%d): %w", n, err)
		}
		h.acquisitions.Add(1)
		in, err := h.rdb.IncrBy(ctx, h.counter, n).Result()
		if err == nil {
			for m := h.most.Load(); in > m && !h.most.CompareAndSwap(m, in); m = h.most.Load() {
			}
			time.Sleep(rand.N(2 * time.Millisecond))
			err = h.rdb.DecrBy(ctx, h.counter, n).Err()
		}
		if rerr := s.ReleaseContext(context.WithoutCancel(ctx), n); err != nil || rerr != nil {
			return fmt.Errorf("counter %v, ReleaseContext(%d): %v", err, n, rerr)
		}
		if in > s.Size() {
			return fmt.Errorf("%d permits inside at once, size %d", in, s.Size())
		}
	}
	return nil
}

// TestSemaphoreHammerAcrossProcesses: goroutines of three Clients and of a
// child process take 1 or 2 of 3 permits, over and over; a counter in Redis
// that each increments inside never exceeds 3.
func TestSemaphoreHammerAcrossProcesses(t *testing.T) {
	// Serial: a hammer beside a process of its own keeps a core busy, and
	// each hand-off's 750ms claim must be met.
	eachBackend(t, func(t *testing.T, b *testBackend) {
		const size, goroutines, rounds = 3, 2, 12
		name := lockName(t)
		counter := name + ".inside"
		rdb := b.rdb(t)
		child := startSemChild(t, b.addr, name, size, 2*time.Second, 3, counter)
		h := &semHammer{sems: semsOn(t, b, name, size, 3, WithLease(2*time.Second)), rdb: rdb, counter: counter, rounds: rounds}
		child.Send(t, "hammer "+strconv.Itoa(rounds))
		require.NoError(t, h.run(testCtx(t, 2*hangGuard), goroutines))
		waitFor(t, "the child's hammer to end", func() bool { return child.Has("hammered") || child.Has("bad") })
		if bad, ok := child.Take("bad"); ok {
			t.Fatalf("the child process: %v", bad)
		}
		ev := child.Expect(t, "hammered", 0)
		childMost, _ := strconv.ParseInt(ev[1], 10, 64)
		most := max(h.most.Load(), childMost)
		t.Logf("%d acquisitions in this process, %s in the child; at most %d permits inside at once", h.acquisitions.Load(), ev[0], most)
		assert.LessOrEqual(t, most, int64(size), "permits inside at once")
		assert.Equal(t, "0", rdb.Get(context.Background(), counter).Val(), "the counter at the end")
		semKeysLeft(t, rdb, name)
	})
}

// TestSemaphoreKilledHolder: a holder process of 1 of 2 permits, whose
// holding sits beside the key of a holder with a long lease (so the key
// outlives it), renews while it lives: a waiter for both permits waits past
// several of its leases. Once the process is SIGKILLed, its holding ends
// with its lease, long before the key would, and the waiter gets in.
func TestSemaphoreKilledHolder(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		// The holder process's renewals keep its hold on a busy machine.
		const lease, long = 1500 * time.Millisecond, time.Minute
		name := lockName(t)
		rdb := b.rdb(t)
		ctx := testCtx(t, 2*hangGuard)
		other := b.client(t).NewSemaphore(name, 2, WithLease(long))
		require.NoError(t, other.Acquire(ctx, 1))
		child := startSemChild(t, b.addr, name, 2, lease, 0, "")
		child.Send(t, "acquire 1")
		child.Expect(t, "acquired", hangGuard)
		other.Release(1)
		w := acquireAsync(t, ctx, b.client(t).NewSemaphore(name, 2), 2)
		semQueued(t, rdb, name, 1)
		keyTTL := rdb.PTTL(ctx, semKeysOf(name).holders).Val()

		time.Sleep(2*lease + lease/2) // the time that passes is the point
		w.pending(t, "the waiter while the holder process lives")
		assert.Equal(t, semState{1, 1, 1}, semStateOf(t, rdb, name), "holders, permits, queued while the holder process lives")
		child.Kill()
		killed := time.Now()
		w.acquired(t, "the waiter once the holder process died")
		took := time.Since(killed)
		t.Logf("the waiter got in %v after the kill (lease %v); the key would have lived %v", took, lease, keyTTL)
		assert.Less(t, took, keyTTL, "the waiter's wait after the kill: want the holder's lease, not the key's")
	})
}

// TestSemaphoreServerRestarted: a restart without persistence loses every
// holding: each acquisition's Lost closes, the error handler hears of it,
// Release of the lost permits does not panic and ReleaseContext reports
// ErrLockLost; new acquisitions work, with fences above the old ones.
func TestSemaphoreServerRestarted(t *testing.T) {
	t.Parallel()
	eachFreshBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		c, errs := clientWithErrors(t, b.rdb(t))
		s := c.NewSemaphore(name, 3, WithLease(500*time.Millisecond), WithFencing())
		ctx := testCtx(t, hangGuard)
		require.NoError(t, s.Acquire(ctx, 1))
		lost1, f1 := s.Lost(), s.Fence()
		require.NoError(t, s.Acquire(ctx, 2))
		lost2 := s.Lost()

		b.restart(t)
		await(t, lost1, "Lost of the first acquisition after the restart")
		await(t, lost2, "Lost of the second acquisition after the restart")
		waitFor(t, "the error handler to hear of two losses", func() bool { return errs.count(ErrLockLost) >= 2 })
		assert.Zero(t, s.Held(), "Held after the restart")
		assert.NotPanics(t, func() { s.Release(1) }, "Release(1) of lost permits")
		assert.ErrorIs(t, s.ReleaseContext(ctx, 2), ErrLockLost, "ReleaseContext(2) after the restart")
		assert.ErrorIs(t, s.ReleaseContext(ctx, 1), ErrNotHeld, "ReleaseContext(1) once the lost permits were released")

		o := b.client(t).NewSemaphore(name, 3, WithFencing())
		require.NoError(t, o.Acquire(ctx, 3), "Acquire(3) after the restart")
		assert.Greater(t, o.Fence(), f1, "the fence after the restart")
		o.Release(3)
		require.NoError(t, s.Acquire(ctx, 1), "Acquire(1) of the value that lost its permits")
		s.Release(1)
	})
}

// TestSemaphoreServerPaused: redis-server is SIGSTOPped. While it is
// stopped, an Acquire with a deadline returns its context's error and
// TryAcquire false, and the holder declares its holding lost; once it
// resumes, a waiter of another Client gets the permit.
func TestSemaphoreServerPaused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	b := &testBackend{name: "redis-server", addr: srv.Addr(), srv: srv}
	name := lockName(t)
	rdb := b.rdb(t)
	ctx := testCtx(t, 2*hangGuard)
	s := b.client(t).NewSemaphore(name, 1, WithLease(faultLease))
	require.NoError(t, s.Acquire(ctx, 1))
	lost := s.Lost()
	w := acquireAsync(t, ctx, b.client(t).NewSemaphore(name, 1), 1)
	semQueued(t, rdb, name, 1)
	o := b.client(t).NewSemaphore(name, 1)

	srv.Signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { srv.Signal(t, syscall.SIGCONT) }) // harmless when running
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	d := acquireAsync(t, short, o, 1)
	assert.ErrorIs(t, await(t, d.res, "Acquire with a deadline while the server is stopped"), context.DeadlineExceeded)
	tried := make(chan bool, 1)
	go func() { tried <- o.TryAcquire(1) }()
	assert.False(t, await(t, tried, "TryAcquire while the server is stopped"), "TryAcquire while the server is stopped")
	await(t, lost, "the holder's Lost while the server is stopped")
	w.pending(t, "the waiter while the server is stopped")
	srv.Signal(t, syscall.SIGCONT)

	w.acquired(t, "the waiter once the server resumed")
	assert.ErrorIs(t, s.ReleaseContext(ctx, 1), ErrLockLost, "the holder's ReleaseContext after its loss")
	assert.Zero(t, o.Held(), "Held of the calls made while the server was stopped")
	// The calls of o that the stopped server had not answered may run once
	// it resumes; what they got is given back by calls posted behind them.
	waitFor(t, "the waiter alone in Redis", func() bool { return semStateOf(t, rdb, name) == semState{1, 1, 0} })
}

// TestSemaphoreKeyDeleted: the semaphore's key deleted under its holders:
// the watchdog finds them gone; Do's context ends with ErrLockLost as its
// cause and Do reports it; another acquisition's Lost closes and its
// release reports ErrLockLost; the error handler hears of both; the
// semaphore works again afterwards.
func TestSemaphoreKeyDeleted(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		rdb := b.rdb(t)
		ctx := testCtx(t, hangGuard)
		c, errs := clientWithErrors(t, b.rdb(t))
		s := c.NewSemaphore(name, 3, WithLease(300*time.Millisecond))
		o := c.NewSemaphore(name, 3, WithLease(300*time.Millisecond))
		require.NoError(t, o.Acquire(ctx, 1))
		lost := o.Lost()
		entered, done, exited := make(chan struct{}), make(chan error, 1), make(chan struct{})
		var cause error
		dctx, cancel := context.WithCancel(ctx)
		go func() {
			defer close(exited)
			done <- s.Do(dctx, 2, func(ctx context.Context, _ int64) error {
				close(entered)
				<-ctx.Done() // (cancelled at the end of the test at the latest)
				cause = context.Cause(ctx)
				return cause
			})
		}()
		t.Cleanup(func() {
			cancel()
			<-exited
		})
		await(t, entered, "f of Do(2)")
		require.NoError(t, rdb.Del(ctx, semKeysOf(name).holders).Err())

		err := await(t, done, "Do once its key was deleted")
		assert.ErrorIs(t, cause, ErrLockLost, "the cause of Do's context")
		assert.ErrorIs(t, err, ErrLockLost, "Do's error")
		await(t, lost, "Lost of the other acquisition")
		assert.ErrorIs(t, o.ReleaseContext(ctx, 1), ErrLockLost, "ReleaseContext of the other acquisition")
		waitFor(t, "the error handler to hear of two losses", func() bool { return errs.count(ErrLockLost) >= 2 })
		require.NoError(t, s.Acquire(ctx, 3), "Acquire(3) afterwards")
		s.Release(3)
		semKeysLeft(t, rdb, name)
	})
}
