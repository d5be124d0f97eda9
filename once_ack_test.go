package remutex

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// TestOnceWaiterWaitsForReplicas: with WithReplicaAck a waiter of a run
// does not return nil before the done record is on the replicas: it does
// not take the run's release message for the outcome, but learns it by
// calls the replicas acknowledge, which the record precedes. Here the
// replication stream is held while the run releases: a waiter that returned
// nil on the message would let f run a second time after a failover to the
// replica.
func TestOnceWaiterWaitsForReplicas(t *testing.T) {
	t.Parallel()
	settleDialers(t)
	ctx := testCtx(t, hangGuard)
	p := redistest.StartReplicaPair(t, true)
	name := lockName(t)
	opt, lease := WithReplicaAck(1, 200*time.Millisecond), WithLease(time.Second)
	runnerOnce := clientOn(t, rdbAt(t, p.Primary.Addr()), opt).NewOnce(name, lease)
	waiterOnce := clientOn(t, rdbAt(t, p.Primary.Addr()), opt).NewOnce(name, lease)
	var runs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	runner := doAsync(t, ctx, runnerOnce, func(context.Context) error {
		runs.Add(1)
		close(started)
		<-release
		return nil
	})
	<-started
	// (A waiter that rightly waits for the replicas gives up after a while.)
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	waiter := doAsync(t, wctx, waiterOnce, func(context.Context) error { runs.Add(1); return nil })
	onceWaiters(t, rdbAt(t, p.Primary.Addr()), name, 1)
	p.Link.Pause() // the replica hears nothing more
	close(release)
	werr := await(t, waiter, "the waiter's Do")
	rerr := await(t, runner, "the runner's Do")
	t.Logf("runner's Do: %v; waiter's Do: %v", rerr, werr)
	if werr != nil {
		return // the waiter did not claim the once done: nothing to check
	}
	p.Primary.Stop()
	promote(t, p.Replica)
	again := clientOn(t, rdbAt(t, p.Replica.Addr())).NewOnce(name, lease)
	if err := again.Do(ctx, func(context.Context) error { runs.Add(1); return nil }); err != nil {
		t.Fatalf("Do on the promoted replica: %v", err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("f ran %d times, want 1: a waiter's Do returned nil (runner's: %v) on a done record no replica had acknowledged", n, rerr)
	}
}

// TestOnceRunnerWaitsForReplicas: with WithReplicaAck the runner's Do
// reports a done run only once the replicas acknowledged its record (the
// final release is pipelined with WAIT); with the replication stream held
// it says ErrTooFewReplicas instead of nil, and a later Do, once the
// replica hears again, finds the record.
func TestOnceRunnerWaitsForReplicas(t *testing.T) {
	t.Parallel()
	settleDialers(t)
	ctx := testCtx(t, hangGuard)
	p := redistest.StartReplicaPair(t, true)
	name := lockName(t)
	o := clientOn(t, rdbAt(t, p.Primary.Addr()), WithReplicaAck(1, 200*time.Millisecond)).NewOnce(name)
	var runs atomic.Int32
	err := o.Do(ctx, func(context.Context) error {
		runs.Add(1)
		p.Link.Pause() // the replica hears nothing of the record
		return nil
	})
	if !errors.Is(err, ErrTooFewReplicas) {
		t.Fatalf("the runner's Do with the replica cut off: got %v, want ErrTooFewReplicas", err)
	}
	p.Link.Resume()
	if err := o.Do(ctx, func(context.Context) error { runs.Add(1); return nil }); err != nil {
		t.Fatalf("Do once the replica hears again: %v", err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("f ran %d times, want 1 (the record was written on the primary)", n)
	}
}
