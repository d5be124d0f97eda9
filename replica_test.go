package remutex

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// Tests on a real primary and replica: with WithReplicaAck a lock survives
// the replica's promotion; without it, a failover can let a second holder
// in; too few replicas make an acquisition fail and leave nothing behind,
// and make a hold lost when renewals cannot be acknowledged.
//
// Without WithReplicaAck, Lock returns as soon as the primary ran the
// acquire script; replication is asynchronous, so a primary that dies right
// then may never have sent the hold to its replica. The replica, promoted,
// then knows no holder, and a second Client takes the lock while the first
// still believes (for the rest of its lease) that it holds it.
// TestReplicaFailoverWithoutAck shows this deterministically by holding the
// replication stream in a proxy.

// promote makes srv a primary (REPLICAOF NO ONE) and returns a client for it.
func promote(t *testing.T, srv *redistest.Server) {
	t.Helper()
	rdb := rdbAt(t, srv.Addr())
	if err := rdb.ReplicaOf(testCtx(t, hangGuard), "no", "one").Err(); err != nil {
		t.Fatalf("REPLICAOF NO ONE on %s: %v", srv.Addr(), err)
	}
}

func TestReplicaAckSurvivesFailover(t *testing.T) {
	t.Parallel()
	// Long enough that the failover and the checks after it, slow on a
	// busy machine, end well inside the first hold's lease.
	const lease = 4 * time.Second
	settleDialers(t)
	ctx := testCtx(t, hangGuard)
	p := redistest.StartReplicaPair(t, false)
	name := lockName(t)
	a := clientOn(t, rdbAt(t, p.Primary.Addr()), WithReplicaAck(1, time.Second))
	ma := a.NewMutex(name, WithLease(lease), WithFencing())
	if err := ma.LockContext(ctx); err != nil {
		t.Fatalf("LockContext with WithReplicaAck(1, 1s): got %v, want nil", err)
	}
	fa, lostA := ma.Fence(), ma.Lost()

	p.Primary.Stop() // SIGKILL: whatever it did not send is gone
	promote(t, p.Replica)
	rdb := rdbAt(t, p.Replica.Addr())
	b := clientOn(t, rdb)
	mb := b.NewMutex(name, WithLease(lease), WithFencing())
	if ok, err := mb.TryLockContext(ctx); ok || err != nil {
		t.Fatalf("TryLockContext on the promoted replica while the first hold's lease runs: got (%v, %v), want (false, nil)", ok, err)
	}
	owners, err := rdb.HKeys(ctx, ma.spec.hash()).Result()
	if err != nil || len(owners) != 1 || !strings.HasPrefix(owners[0], a.id+":") {
		t.Errorf("owners of %s on the promoted replica: got %q (%v), want one of Client %s", ma.spec.hash(), owners, err, a.id)
	}
	if isClosed(lostA) {
		t.Errorf("first holder: Lost closed right after the failover, want it held until its lease runs out")
	}

	// The first Client cannot renew on the dead primary: its hold ends with
	// its lease, and then the second Client gets the lock, with a higher
	// fence (the counter was acknowledged too).
	await(t, lostA, "the first hold lost once its lease ran out")
	if err := mb.LockContext(ctx); err != nil {
		t.Fatalf("LockContext on the promoted replica after the lease: got %v, want nil", err)
	}
	if got := mb.Fence(); got <= fa {
		t.Errorf("fence after the failover: got %d, want > %d", got, fa)
	}
	if err := mb.UnlockContext(ctx); err != nil {
		t.Errorf("UnlockContext on the promoted replica: got %v, want nil", err)
	}
	if err := ma.UnlockContext(ctx); !errors.Is(err, ErrLockLost) {
		t.Errorf("first holder's UnlockContext: got %v, want ErrLockLost", err)
	}
}

// TestReplicaFailoverWithoutAck documents the risk WithReplicaAck removes.
// The replication stream is held in a proxy, as a slow or broken link
// would: without the option the acquisition returns before the replica has
// it, and after the primary dies and the replica is promoted a second Client
// takes the lock while the first still holds it. With the option, the same
// acquisition fails with ErrTooFewReplicas and leaves no hold behind.
func TestReplicaFailoverWithoutAck(t *testing.T) {
	const lease = 5 * time.Second
	settleDialers(t)
	ctx := testCtx(t, hangGuard)
	p := redistest.StartReplicaPair(t, true)
	name := lockName(t)
	prdb := rdbAt(t, p.Primary.Addr())
	p.Link.Pause()

	acked := clientOn(t, rdbAt(t, p.Primary.Addr()), WithReplicaAck(1, 100*time.Millisecond))
	mAcked := acked.NewMutex(name, WithLease(lease))
	if ok, err := mAcked.TryLockContext(ctx); ok || !errors.Is(err, ErrTooFewReplicas) {
		t.Fatalf("TryLockContext with WithReplicaAck(1, 100ms) and replication held: got (%v, %v), want (false, ErrTooFewReplicas)", ok, err)
	}
	settled(t, acked) // the grant is given back by a call that follows it
	if n := prdb.Exists(ctx, mAcked.spec.hash()).Val(); n != 0 {
		t.Fatalf("EXISTS %s on the primary after the refused acquisition: got %d, want 0", mAcked.spec.hash(), n)
	}

	a := clientOn(t, rdbAt(t, p.Primary.Addr()))
	ma := a.NewMutex(name, WithLease(lease))
	if err := ma.LockContext(ctx); err != nil {
		t.Fatalf("LockContext without WithReplicaAck: got %v, want nil", err)
	}
	rrdb := rdbAt(t, p.Replica.Addr())
	if n := rrdb.Exists(ctx, ma.spec.hash()).Val(); n != 0 {
		t.Fatalf("EXISTS %s on the replica while replication is held: got %d, want 0", ma.spec.hash(), n)
	}
	p.Primary.Stop()
	promote(t, p.Replica)
	mb := clientOn(t, rrdb).NewMutex(name, WithLease(lease))
	ok, err := mb.TryLockContext(ctx)
	if err != nil {
		t.Fatalf("TryLockContext on the promoted replica: got %v, want nil", err)
	}
	if !ok || isClosed(ma.Lost()) {
		t.Fatalf("after a failover without WithReplicaAck: got second holder %v and first hold lost %v, want a second holder while the first still holds (the documented risk)", ok, isClosed(ma.Lost()))
	}
	if err := mb.UnlockContext(ctx); err != nil {
		t.Errorf("second holder's UnlockContext: got %v, want nil", err)
	}
}

// TestReplicaAckShortfall asks for two replicas of a primary that has one:
// every acquisition is refused with ErrTooFewReplicas and rolled back, so no
// key of the lock is left on either server; Lock keeps retrying (reporting
// each shortfall) until its context ends.
func TestReplicaAckShortfall(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, hangGuard)
	p := redistest.StartReplicaPair(t, false)
	name := lockName(t)
	sink := newErrorLog()
	c := clientOn(t, rdbAt(t, p.Primary.Addr()), WithReplicaAck(2, 50*time.Millisecond), WithErrorHandler(sink.handler))
	m := c.NewMutex(name, WithFencing())

	if ok, err := m.TryLockContext(ctx); ok || !errors.Is(err, ErrTooFewReplicas) {
		t.Fatalf("TryLockContext with WithReplicaAck(2, ...) and one replica: got (%v, %v), want (false, ErrTooFewReplicas)", ok, err)
	}
	if m.TryLock() {
		t.Fatalf("TryLock with too few replicas: got true, want false")
	}
	if got := sink.count(ErrTooFewReplicas); got != 1 {
		t.Errorf("errors reported for TryLock: got %d ErrTooFewReplicas, want 1", got)
	}
	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := m.LockContext(lctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("LockContext with too few replicas: got %v, want context.DeadlineExceeded", err)
	}
	if got := sink.count(ErrTooFewReplicas); got < 2 {
		t.Errorf("errors reported after LockContext: got %d ErrTooFewReplicas, want at least 2 (retried)", got)
	}
	if got := m.HoldCount(); got != 0 {
		t.Errorf("HoldCount: got %d, want 0", got)
	}
	// The last try's job (acquire and WAIT) may still be out when
	// LockContext returns: it rolls its grant back itself.
	settled(t, c)
	prefix := DefaultKeyPrefix + "{" + name + "}"
	for _, srv := range []*redistest.Server{p.Primary, p.Replica} {
		rdb := rdbAt(t, srv.Addr())
		// The fence counter is kept by design (tokens never go back); no
		// other key may remain (on the replica, once the rollback has
		// replicated).
		var left []string
		waitFor(t, "no key but the fence counter on "+srv.Addr(), func() bool {
			left = left[:0]
			for _, k := range redistest.KeysWithPrefix(t, rdb, prefix) {
				if k != prefix+":fence" {
					left = append(left, k)
				}
			}
			return len(left) == 0
		})
	}
}

// TestReplicaAckRenewalShortfall holds a lock with WithReplicaAck and then
// holds the replication stream: renewals are applied on the primary but not
// acknowledged, so they count as failed and the hold is lost when its
// validity ends.
func TestReplicaAckRenewalShortfall(t *testing.T) {
	const lease = 300 * time.Millisecond
	ctx := testCtx(t, hangGuard)
	p := redistest.StartReplicaPair(t, true)
	sink := newErrorLog()
	c := clientOn(t, rdbAt(t, p.Primary.Addr()), WithReplicaAck(1, 50*time.Millisecond), WithErrorHandler(sink.handler))
	m := c.NewMutex(lockName(t), WithLease(lease))
	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: got %v, want nil", err)
	}
	time.Sleep(lease) // acknowledged renewals keep it
	if isClosed(m.Lost()) {
		t.Fatalf("Lost closed while the replica acknowledges, want it held")
	}
	p.Link.Pause()
	await(t, m.Lost(), "the hold lost once renewals went unacknowledged")
	// The error handler hears of it just after Lost closes.
	waitFor(t, "ErrLockLost reported to the error handler", func() bool { return sink.count(ErrLockLost) == 1 })
	if err := m.UnlockContext(ctx); !errors.Is(err, ErrLockLost) {
		t.Errorf("UnlockContext: got %v, want ErrLockLost", err)
	}
}
