package remutex

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// Tests of NewQuorumClient (Redlock) on three and on five independent
// redis-servers started by the tests: exclusion checked by a fenced register,
// a hold that survives the loss of a minority and is lost with the majority,
// a paused server that holds up neither acquisitions nor releases, reentrancy
// and renewal, and servers that restart empty.

// quorumSizes runs f as a subtest for a quorum of three and of five servers.
func quorumSizes(t *testing.T, f func(t *testing.T, n int)) {
	t.Helper()
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("%dServers", n), func(t *testing.T) { f(t, n) })
	}
}

func TestQuorumExclusion(t *testing.T) {
	t.Parallel()
	quorumSizes(t, func(t *testing.T, n int) {
		const clients, goroutines, rounds = 3, 2, 6
		srvs := redistest.StartServers(t, n)
		name := lockName(t)
		var mutexes []*DistMutex
		for i := 0; i < clients; i++ {
			mutexes = append(mutexes, quorumClient(t, srvs).NewMutex(name, WithFencing()))
		}
		reg := redistest.NewRegister(t)
		if err := hammer(testCtx(t, hangGuard), reg, mutexes, goroutines, rounds); err != nil {
			t.Fatal(err)
		}
		reg.CheckSections(t, clients*goroutines*rounds)
	})
}

// TestQuorumMinorityLoss kills servers while a lock is held: with a
// majority left the hold is kept past three leases and excludes others;
// once the majority is gone the hold is lost.
func TestQuorumMinorityLoss(t *testing.T) {
	t.Parallel() // servers of its own; it waits out leases (see TestMain)
	skipShort(t, "a failover (quorum servers stopped)")
	quorumSizes(t, func(t *testing.T, n int) {
		const lease = time.Second // renewed every 333ms: a busy machine's stalls stay well inside it
		settleDialers(t)
		ctx := testCtx(t, hangGuard)
		srvs := redistest.StartServers(t, n)
		name := lockName(t)
		m := quorumClient(t, srvs).NewMutex(name, WithLease(lease), WithFencing())
		other := quorumClient(t, srvs).NewMutex(name, WithLease(lease))
		if err := m.LockContext(ctx); err != nil {
			t.Fatalf("LockContext: got %v, want nil", err)
		}
		lost := m.Lost()
		minority := n - (n/2 + 1)
		for _, s := range srvs[:minority] {
			s.Stop()
		}
		time.Sleep(3*lease + lease/2) // the time that passes is the point
		if isClosed(lost) {
			t.Fatalf("Lost closed with %d of %d servers killed, want the hold kept", minority, n)
		}
		if ok, err := other.TryLockContext(ctx); ok || err != nil {
			t.Fatalf("another Client's TryLockContext with %d of %d servers killed: got (%v, %v), want (false, nil)", minority, n, ok, err)
		}
		srvs[minority].Stop()
		await(t, lost, fmt.Sprintf("the hold lost with %d of %d servers killed", minority+1, n))
		if err := m.UnlockContext(ctx); !errors.Is(err, ErrLockLost) {
			t.Errorf("UnlockContext after the loss: got %v, want ErrLockLost", err)
		}
	})
}

// pausedQuorum starts n servers and pauses (SIGSTOP) a minority of them
// until the end of the test. Clients made with its clients method have no
// read timeout: whatever waits for a paused server waits until the test
// resumes it, and fails on its hang guard first.
type pausedQuorum struct {
	srvs   []*redistest.Server
	paused []*redistest.Server
}

func startPausedQuorum(t *testing.T, n int) *pausedQuorum {
	t.Helper()
	q := &pausedQuorum{srvs: redistest.StartServers(t, n)}
	q.paused = q.srvs[:n-(n/2+1)]
	for _, s := range q.paused {
		s.Signal(t, syscall.SIGSTOP)
	}
	return q
}

// client returns a quorum Client on fresh connections to every server.
// Servers are resumed before the Client closes, since Close waits for the
// calls still running.
func (q *pausedQuorum) client(t *testing.T, opts ...Option) *Client {
	t.Helper()
	rdbs := make([]redis.UniversalClient, len(q.srvs))
	for i, s := range q.srvs {
		rdbs[i] = newRDB(t, &redis.Options{Addr: s.Addr(), ReadTimeout: -1})
	}
	c := NewQuorumClient(rdbs, append([]Option{WithLogger(testLogger(t))}, opts...)...)
	t.Cleanup(func() { _ = c.Close() })
	t.Cleanup(func() { q.resume(t) })
	return c
}

func (q *pausedQuorum) resume(t *testing.T) {
	t.Helper()
	for _, s := range q.paused {
		s.Signal(t, syscall.SIGCONT)
	}
}

// TestQuorumPausedServer pauses a minority of the servers before any Client
// connects: a Client still gets a free lock, another waits for it and gets
// it when the first unlocks, with a higher fence. None of it may wait for a
// paused server.
func TestQuorumPausedServer(t *testing.T) {
	t.Parallel()
	quorumSizes(t, func(t *testing.T, n int) {
		q := startPausedQuorum(t, n)
		name := lockName(t)
		reg := redistest.NewRegister(t)
		a := lockAsync(t, q.client(t).NewMutex(name, WithFencing()), reg, "first")
		ra := await(t, a.locked, "the first Client's LockContext with a minority paused")
		if ra.err != nil {
			t.Fatalf("first Client: LockContext: got %v, want nil", ra.err)
		}
		cb := q.client(t)
		mb := cb.NewMutex(name, WithFencing())
		b := lockAsync(t, mb, reg, "second")
		t.Cleanup(func() { q.resume(t) }) // before the goroutines are joined
		waitFor(t, "the second Client waiting", func() bool {
			cb.mu.Lock()
			defer cb.mu.Unlock()
			st := cb.locks[mb.spec.hash()]
			return st != nil && len(st.waiters) == 1
		})
		select {
		case r := <-b.locked:
			t.Fatalf("second Client: got LockContext result %+v while the lock is held, want it waiting", r)
		default:
		}
		a.unlock()
		rb := await(t, b.locked, "the second Client's LockContext after the first unlocked")
		if rb.err != nil {
			t.Fatalf("second Client: LockContext: got %v, want nil", rb.err)
		}
		if rb.fence <= ra.fence {
			t.Errorf("second Client's fence: got %d, want > %d", rb.fence, ra.fence)
		}
		b.unlock()
		q.resume(t)
		for _, l := range []*asyncLock{a, b} {
			if err := await(t, l.unlocked, "UnlockContext"); err != nil {
				t.Errorf("UnlockContext: got %v, want nil", err)
			}
		}
		reg.CheckSections(t, 2)
	})
}

// TestQuorumUnlockWithPausedServer unlocks while a minority of the servers
// is paused: UnlockContext returns once the others released, without
// waiting for the paused servers (their calls finish in the background).
func TestQuorumUnlockWithPausedServer(t *testing.T) {
	t.Parallel()
	quorumSizes(t, func(t *testing.T, n int) {
		q := &pausedQuorum{srvs: redistest.StartServers(t, n)}
		l := lockAsync(t, q.client(t).NewMutex(lockName(t)), nil, "")
		if r := await(t, l.locked, "LockContext"); r.err != nil {
			t.Fatalf("LockContext: got %v, want nil", r.err)
		}
		q.paused = q.srvs[:n-(n/2+1)]
		for _, s := range q.paused {
			s.Signal(t, syscall.SIGSTOP)
		}
		t.Cleanup(func() { q.resume(t) }) // before the goroutine is joined
		l.unlock()
		if err := await(t, l.unlocked, "UnlockContext to return with a minority paused"); err != nil {
			t.Errorf("UnlockContext: got %v, want nil", err)
		}
	})
}

// TestQuorumWaiterDoesNotPoll holds a lock for a while a quorum Client
// waits for it: the waiter is woken by the release message (or the
// holder's lease), so it runs the acquire script a handful of times, not
// once per round trip for as long as it waits.
func TestQuorumWaiterDoesNotPoll(t *testing.T) {
	t.Parallel()
	const hold = 300 * time.Millisecond
	srvs := redistest.StartServers(t, 3)
	name := lockName(t)
	holder := quorumClient(t, srvs).NewMutex(name)
	var calls atomic.Int64
	rdbs := make([]redis.UniversalClient, len(srvs))
	for i, s := range srvs {
		rdb := rdbAt(t, s.Addr())
		rdb.AddHook(hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if name, _ := scriptCall(cmd); name == "acquire" {
				calls.Add(1)
			}
			return next(ctx, cmd)
		}})
		rdbs[i] = rdb
	}
	waiter := NewQuorumClient(rdbs, WithLogger(testLogger(t)))
	t.Cleanup(func() { _ = waiter.Close() })

	ctx := testCtx(t, hangGuard)
	if err := holder.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: got %v, want nil", err)
	}
	w := lockAsync(t, waiter.NewMutex(name), nil, "")
	time.Sleep(hold) // the time that passes is the point
	if err := holder.UnlockContext(ctx); err != nil {
		t.Fatalf("UnlockContext: got %v, want nil", err)
	}
	if r := await(t, w.locked, "the waiter's LockContext"); r.err != nil {
		t.Fatalf("waiter's LockContext: got %v, want nil", r.err)
	}
	const most = 10 * 3 // ten fan-outs
	if got := calls.Load(); got > most {
		t.Errorf("acquire script calls of a waiter during a %v hold: got %d, want at most %d", hold, got, most)
	}
	w.unlock()
	if err := await(t, w.unlocked, "the waiter's UnlockContext"); err != nil {
		t.Errorf("waiter's UnlockContext: got %v, want nil", err)
	}
}

// TestQuorumReentrancyAndWatchdog locks three times on one goroutine, holds
// past three leases, and unlocks three times: the hold count follows, the
// watchdog keeps the hold on every server, and others get the lock only
// after the last Unlock.
func TestQuorumReentrancyAndWatchdog(t *testing.T) {
	t.Parallel() // servers of its own; it waits out leases (see TestMain)
	quorumSizes(t, func(t *testing.T, n int) {
		const lease = time.Second // renewed every 333ms: a busy machine's stalls stay well inside it
		ctx := testCtx(t, hangGuard)
		srvs := redistest.StartServers(t, n)
		name := lockName(t)
		c := quorumClient(t, srvs)
		m := c.NewMutex(name, WithLease(lease), WithFencing())
		other := quorumClient(t, srvs).NewMutex(name, WithLease(lease))
		var fence int64
		for i := 1; i <= 3; i++ {
			if err := m.LockContext(ctx); err != nil {
				t.Fatalf("LockContext %d: got %v, want nil", i, err)
			}
			if got := m.HoldCount(); got != i {
				t.Fatalf("HoldCount after %d locks: got %d, want %d", i, got, i)
			}
			if i == 1 {
				fence = m.Fence()
			} else if got := m.Fence(); got != fence {
				t.Errorf("Fence of nested lock %d: got %d, want the hold's %d", i, got, fence)
			}
		}
		time.Sleep(3*lease + lease/2) // the time that passes is the point
		if isClosed(m.Lost()) {
			t.Fatalf("Lost closed after %v, want the hold renewed", 3*lease+lease/2)
		}
		// Every server holds the lock and is renewed, not only the fastest
		// majority. Nested counts reach a majority at once and the others
		// in the background, possibly out of order (they are advisory: the
		// final release deletes the field whatever its count).
		atThree := 0
		for i, s := range srvs {
			rdb := rdbAt(t, s.Addr())
			counts, err := rdb.HVals(ctx, m.spec.hash()).Result()
			if err != nil || len(counts) != 1 {
				t.Errorf("server %d: hold counts of %s: got %q (%v), want one", i, m.spec.hash(), counts, err)
			} else if counts[0] == "3" {
				atThree++
			}
			if ttl := rdb.PTTL(ctx, m.spec.hash()).Val(); ttl <= 0 {
				t.Errorf("server %d: PTTL %s: got %v, want > 0 (renewed)", i, m.spec.hash(), ttl)
			}
		}
		if atThree < n/2+1 {
			t.Errorf("servers with hold count 3: got %d, want at least %d", atThree, n/2+1)
		}
		for i := 3; i >= 1; i-- {
			if ok, err := other.TryLockContext(ctx); ok || err != nil {
				t.Fatalf("another Client's TryLockContext at hold count %d: got (%v, %v), want (false, nil)", i, ok, err)
			}
			if err := m.UnlockContext(ctx); err != nil {
				t.Fatalf("UnlockContext at hold count %d: got %v, want nil", i, err)
			}
			if got := m.HoldCount(); got != i-1 {
				t.Fatalf("HoldCount after unlocking at %d: got %d, want %d", i, got, i-1)
			}
		}
		if ok, err := other.TryLockContext(ctx); !ok || err != nil {
			t.Fatalf("another Client's TryLockContext after the last Unlock: got (%v, %v), want (true, nil)", ok, err)
		}
		if err := other.UnlockContext(ctx); err != nil {
			t.Errorf("other's UnlockContext: got %v, want nil", err)
		}
	})
}

// TestQuorumRestartedServers kills a minority of the servers and later
// restarts them empty (no persistence): locks keep working while they are
// down and after they are back, the restarted servers take part again (their
// fence counters are reseeded from their clocks), and fences keep increasing
// across it all.
func TestQuorumRestartedServers(t *testing.T) {
	t.Parallel()
	quorumSizes(t, func(t *testing.T, n int) {
		settleDialers(t)
		ctx := testCtx(t, hangGuard)
		srvs := redistest.StartServers(t, n)
		name := lockName(t)
		reg := redistest.NewRegister(t)
		mutexes := []*DistMutex{
			quorumClient(t, srvs).NewMutex(name, WithFencing()),
			quorumClient(t, srvs).NewMutex(name, WithFencing()),
		}
		const goroutines, rounds = 2, 3
		phase := func(what string) {
			t.Helper()
			if err := hammer(ctx, reg, mutexes, goroutines, rounds); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		phase("all servers up")
		minority := srvs[:n-(n/2+1)]
		for _, s := range minority {
			s.Stop()
		}
		phase("a minority killed")
		for _, s := range minority {
			s.Restart(t)
		}
		phase("the minority restarted empty")
		// go-redis may refuse to dial a server for a second after it was
		// down: lock until every restarted server took part again (its
		// fence counter is back).
		for _, s := range minority {
			rdb := rdbAt(t, s.Addr())
			waitFor(t, "the fence counter back on restarted server "+s.Addr(), func() bool {
				m := mutexes[0]
				if err := m.LockContext(ctx); err != nil {
					t.Fatalf("LockContext after the restart: got %v, want nil", err)
				}
				reg.Enter("after the restart", m.Fence())()
				if err := m.UnlockContext(ctx); err != nil {
					t.Fatalf("UnlockContext after the restart: got %v, want nil", err)
				}
				return rdb.Exists(ctx, m.spec.Keys[1]).Val() == 1
			})
		}
		reg.CheckSections(t, 3*2*goroutines*rounds)
	})
}

// TestQuorumRestartCaveat documents what Redlock needs from restarts: a
// server that restarts without its data must stay out for a lease (or
// persist every write). Otherwise a hold granted by a bare majority can be
// left on a minority, and another Client let in. Here a crashed holder's
// field still blocks the third server when the first Client locks, so two
// servers grant it; that field then expires and one of the two restarts
// empty: a second Client gets the lock while the first still holds it (until
// the first's next renewal finds it gone, a third of a lease later).
func TestQuorumRestartCaveat(t *testing.T) {
	t.Parallel()
	settleDialers(t)
	ctx := testCtx(t, hangGuard)
	srvs := redistest.StartServers(t, 3)
	name := lockName(t)
	// The first Client's call to the third server may still be on its way
	// when LockContext returns: answered tells when it came back.
	answered := make(chan struct{}, 1)
	rdbs := make([]redis.UniversalClient, len(srvs))
	for i, s := range srvs {
		rdb := rdbAt(t, s.Addr())
		if i == 2 {
			rdb.AddHook(hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
				err := next(ctx, cmd)
				if name, _ := scriptCall(cmd); name == "acquire" && !quickCall(cmd) && !redis.HasErrorPrefix(err, "NOSCRIPT") {
					// Not the EVALSHA that EVAL then follows, nor
					// quick_lock.lua, which acquire.lua follows here.
					answered <- struct{}{}
				}
				return err
			}})
		}
		rdbs[i] = rdb
	}
	ca := NewQuorumClient(rdbs, WithLogger(testLogger(t)))
	t.Cleanup(func() { _ = ca.Close() })
	ma := ca.NewMutex(name)
	mb := quorumClient(t, srvs).NewMutex(name)
	third := rdbAt(t, srvs[2].Addr())
	if err := third.HSet(ctx, ma.spec.hash(), "crashed:1", 1).Err(); err != nil {
		t.Fatal(err)
	}
	if err := ma.LockContext(ctx); err != nil {
		t.Fatalf("LockContext with one server blocked: got %v, want nil", err)
	}
	await(t, answered, "the third server's answer to the first Client")
	if err := third.Del(ctx, ma.spec.hash()).Err(); err != nil { // its lease ran out
		t.Fatal(err)
	}
	srvs[0].Restart(t)
	ok, err := mb.TryLockContext(ctx)
	if err != nil {
		t.Fatalf("second Client's TryLockContext: got %v, want nil", err)
	}
	if !ok || isClosed(ma.Lost()) {
		t.Fatalf("after a restart without delay: got second holder %v and first hold lost %v, want a second holder while the first still holds (the documented risk)", ok, isClosed(ma.Lost()))
	}
	if err := mb.UnlockContext(ctx); err != nil {
		t.Errorf("second holder's UnlockContext: got %v, want nil", err)
	}
}

// TestQuorumCloseWhileWaiting closes a quorum Client while one of its
// goroutines waits: the waiter, woken by Close, gives up and leaves the
// queues with a fan-out that must not start while Close waits for the
// fan-outs still running (a WaitGroup misuse -race reports).
func TestQuorumCloseWhileWaiting(t *testing.T) {
	var rdbs []redis.UniversalClient
	for range 3 {
		rdbs = append(rdbs, rdbAt(t, miniredis.RunT(t).Addr()))
	}
	holder := NewQuorumClient(rdbs, WithLogger(testLogger(t)))
	t.Cleanup(func() { _ = holder.Close() })
	for i := range 20 {
		name := lockName(t) + strconv.Itoa(i)
		hm := holder.NewMutex(name)
		require.NoError(t, hm.LockContext(context.Background()))
		waiter := NewQuorumClient(rdbs, WithLogger(testLogger(t)))
		done := make(chan error, 1)
		go func() { done <- waiter.NewMutex(name).LockContext(context.Background()) }()
		waitFor(t, "the waiter in the queues", func() bool {
			// (On any server: one the holder did not reach grants the
			// waiter instead, and gets that given back.)
			queued := 0
			for _, rdb := range rdbs {
				queued += int(rdb.Exists(context.Background(), keysOf(name).queue).Val())
			}
			return len(done) > 0 || queued > 0
		})
		if len(done) > 0 {
			t.Fatalf("the waiter's LockContext returned before Close: %v", <-done)
		}
		require.NoError(t, waiter.Close())
		assert.ErrorIs(t, await(t, done, "the waiter's LockContext"), ErrClosed)
		require.NoError(t, hm.UnlockContext(context.Background()))
	}
}
