package remutex

// DistSemaphore on the deployments of DistMutex: a Redis Cluster (every key
// of a semaphore in one slot, the hand-off on the shard channel of its
// master), a primary with a replica (WithReplicaAck); a quorum Client
// refuses semaphores.

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// TestSemaphoreCluster: on a cluster of three masters, for names with and
// without braces of their own, the four keys of a semaphore are in one slot
// on the master that serves it and on no other; a waiter of another
// ClusterClient is subscribed to its shard channel on that master and gets
// the permits when they are released; then a hammer of three Clients never
// lets more than the size in.
func TestSemaphoreCluster(t *testing.T) {
	t.Parallel()
	tc := redistest.StartCluster(t, 3, 0)
	for _, name := range []string{"a", "{user1}:cart", "a{b}c"} {
		t.Run(name, func(t *testing.T) { testClusterSemaphoreKeys(t, tc, name) })
	}
	t.Run("Hammer", func(t *testing.T) {
		prefix := topoPrefix(t)
		name := nameOn(t, tc, tc.Masters[1], prefix, "hammer")
		var sems []*DistSemaphore
		for i := 0; i < 3; i++ {
			sems = append(sems, clientOn(t, tc.Client(t), WithKeyPrefix(prefix)).NewSemaphore(name, 3, WithFencing()))
		}
		counter := prefix + "{" + name + "}.inside"
		h := &semHammer{sems: sems, rdb: tc.Client(t), counter: counter, rounds: 10}
		require.NoError(t, h.run(testCtx(t, 2*hangGuard), 2))
		t.Logf("%d acquisitions; at most %d permits inside at once", h.acquisitions.Load(), h.most.Load())
	})
}

// testClusterSemaphoreKeys is TestSemaphoreCluster's check of one name.
func testClusterSemaphoreKeys(t *testing.T, tc *redistest.Cluster, name string) {
	redistest.RequireShardedPubSub(t)
	ctx := testCtx(t, hangGuard)
	prefix := topoPrefix(t)
	ca, cb := clientOn(t, tc.Client(t), WithKeyPrefix(prefix)), clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	sa, sb := ca.NewSemaphore(name, 2, WithFencing()), cb.NewSemaphore(name, 2, WithFencing())
	home := prefix + "{" + name + "}:sem"
	slot := tc.Slot(t, home)
	owner := tc.Owner(t, tc.Masters[0], slot)

	require.NoError(t, sa.Acquire(ctx, 1))
	fa := sa.Fence()
	w := acquireAsync(t, ctx, sb, 2)
	waitFor(t, "the waiter queued on "+owner.String(), func() bool {
		return owner.RDB.Exists(ctx, home+":waiting").Val() == 1
	})
	checkLockKeys(t, tc, owner, prefix, slot, []string{home, home + ":fence", home + ":waiting", home + ":size"})
	checkShardWaiter(t, tc, owner, home+releasedInfix+cb.id)
	if got := tc.Slot(t, home+releasedInfix+cb.id); got != slot {
		t.Errorf("the waiter's channel is in slot %d, want %d", got, slot)
	}

	sa.Release(1)
	w.acquired(t, "the waiter once the permit was released")
	assert.Greater(t, sb.Fence(), fa, "the waiter's fence")
	sb.Release(2)
	checkLockKeys(t, tc, owner, prefix, slot, []string{home + ":fence", home + ":size"})
}

// TestSemaphoreReplicaAck: with WithReplicaAck(1, ...) a holding is on the
// replica when Acquire returns, and so is a hand-off to a waiter of another
// Client. Asking for two replicas of a primary that has one,
// TryAcquireContext returns ErrTooFewReplicas, TryAcquire false, and
// Acquire retries until its context ends (the error is transient); none
// leaves a holding.
func TestSemaphoreReplicaAck(t *testing.T) {
	t.Parallel()
	p := redistest.StartReplicaPair(t, false)
	name := lockName(t)
	k := semKeysOf(name)
	ctx := testCtx(t, hangGuard)
	primary, replica := rdbAt(t, p.Primary.Addr()), rdbAt(t, p.Replica.Addr())
	var sems []*DistSemaphore
	for i := 0; i < 2; i++ {
		sems = append(sems, clientOn(t, rdbAt(t, p.Primary.Addr()), WithReplicaAck(1, time.Second)).NewSemaphore(name, 2))
	}
	require.NoError(t, sems[0].Acquire(ctx, 2))
	assert.Equal(t, semState{1, 2, 0}, semStateOf(t, replica, name), "holders, permits, queued on the replica when Acquire returned")
	w := acquireAsync(t, ctx, sems[1], 1)
	semQueued(t, primary, name, 1)
	sems[0].Release(1)
	w.acquired(t, "the waiter once a permit was released")
	assert.Equal(t, semState{2, 2, 0}, semStateOf(t, replica, name), "holders, permits, queued on the replica after the hand-off")
	sems[0].Release(1)
	sems[1].Release(1)

	short := clientOn(t, rdbAt(t, p.Primary.Addr()), WithReplicaAck(2, 50*time.Millisecond)).NewSemaphore(name, 2)
	ok, err := short.TryAcquireContext(ctx, 1)
	assert.False(t, ok, "TryAcquireContext with too few replicas")
	assert.ErrorIs(t, err, ErrTooFewReplicas, "TryAcquireContext with too few replicas")
	assert.False(t, short.TryAcquire(1), "TryAcquire with too few replicas")
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, short.Acquire(actx, 1), context.DeadlineExceeded, "Acquire with too few replicas (retried until its context ends)")
	assert.Zero(t, short.Held(), "Held after the refused calls")
	waitFor(t, "no holder left by the refused calls", func() bool {
		return primary.Exists(ctx, k.holders, k.queue).Val() == 0
	})
}

// TestSemaphoreQuorumRefused: a quorum Client cannot bound a count by
// majorities, so NewSemaphore panics on one, saying why, before any
// command.
func TestSemaphoreQuorumRefused(t *testing.T) {
	log := newCommandLog()
	var rdbs []redis.UniversalClient
	for i := 0; i < 3; i++ {
		rdb := rdbAt(t, miniredis.RunT(t).Addr())
		rdb.AddHook(log)
		rdbs = append(rdbs, rdb)
	}
	q := NewQuorumClient(rdbs)
	t.Cleanup(func() { _ = q.Close() })
	msg := panicOf(t, "NewSemaphore on a quorum Client", func() { q.NewSemaphore(lockName(t), 2) })
	for _, want := range []string{"remutex: ", "quorum", "majorit"} {
		assert.Contains(t, msg, want, "the panic")
	}
	_, cmds := log.counts()
	assert.Empty(t, cmds, "commands sent")
	assert.NotPanics(t, func() { q.NewMutex(lockName(t)) }, "NewMutex on the same quorum Client")
}
