package remutex

// DistOnce on the deployments of DistMutex: a Redis Cluster (every key of a
// once in one slot, the hand-off on the shard channel of its master) and a
// primary with a replica (WithReplicaAck).

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// TestOnceCluster: on a cluster of three masters, for names with and
// without braces of their own, a waiter of another ClusterClient is woken
// by the run's end on the shard channel of the master that serves the
// once, returns nil without running f, and the once's keys are all in one
// slot on that master: the done record and the fence counter, nothing else.
func TestOnceCluster(t *testing.T) {
	redistest.RequireShardedPubSub(t)
	t.Parallel()
	tc := redistest.StartCluster(t, 3, 0)
	for _, name := range []string{"a", "{user1}:migrate", "a{b}c"} {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t, hangGuard)
			prefix := topoPrefix(t)
			ca, cb := clientOn(t, tc.Client(t), WithKeyPrefix(prefix)), clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
			oa, ob := ca.NewOnce(name, WithFencing()), cb.NewOnce(name, WithFencing())
			home := onceKeys(prefix, name)[0]
			slot := tc.Slot(t, home)
			owner := tc.Owner(t, tc.Masters[0], slot)

			started, release := make(chan struct{}), make(chan struct{})
			runner := doAsync(t, ctx, oa, func(context.Context) error { close(started); <-release; return nil })
			<-started
			ran := false
			waiter := doAsync(t, ctx, ob, func(context.Context) error { ran = true; return nil })
			waitFor(t, "the waiter queued on "+owner.String(), func() bool {
				return owner.RDB.Exists(ctx, home+":waiting").Val() == 1
			})
			checkShardWaiter(t, tc, owner, home+releasedInfix+cb.id)
			close(release)
			require.NoError(t, await(t, runner, "the runner"))
			require.NoError(t, await(t, waiter, "the waiter"))
			assert.False(t, ran, "the waiter ran f")
			checkLockKeys(t, tc, owner, prefix, slot, []string{home + ":fence", home + ":done"})
			done, err := clientOn(t, tc.Client(t), WithKeyPrefix(prefix)).NewOnce(name).Done(ctx)
			require.NoError(t, err)
			assert.True(t, done, "Done from a third Client")
		})
	}
}

// TestOnceReplicaAck: with WithReplicaAck(1, ...) a run and its waiter work
// as on a single server, and the done record reaches the replica.
func TestOnceReplicaAck(t *testing.T) {
	t.Parallel()
	p := redistest.StartReplicaPair(t, false)
	name := lockName(t)
	ctx := testCtx(t, hangGuard)
	replica := rdbAt(t, p.Replica.Addr())
	var onces []*DistOnce
	for i := 0; i < 2; i++ {
		onces = append(onces, clientOn(t, rdbAt(t, p.Primary.Addr()), WithReplicaAck(1, time.Second)).NewOnce(name))
	}
	started, release := make(chan struct{}), make(chan struct{})
	runner := doAsync(t, ctx, onces[0], func(context.Context) error { close(started); <-release; return nil })
	<-started
	ran := false
	waiter := doAsync(t, ctx, onces[1], func(context.Context) error { ran = true; return nil })
	onceWaiters(t, rdbAt(t, p.Primary.Addr()), name, 1)
	close(release)
	require.NoError(t, await(t, runner, "the runner"))
	require.NoError(t, await(t, waiter, "the waiter"))
	assert.False(t, ran, "the waiter ran f")
	waitFor(t, "the done record on the replica", func() bool {
		return replica.Exists(ctx, onceKeysOf(name).done).Val() == 1
	})
}
