package remutex

// DistElection on the topologies: a Redis 7 cluster (its keys in one slot,
// its changes on a shard channel of the slot's master), and a Sentinel
// failover, which an observer survives.

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
	"github.com/remutex/remutex/internal/wire"
)

// TestElectionCluster: on a cluster, a second candidate leads after the
// first resigns, an observer on a third Client sees both, the election's
// keys all live on the master of their slot, and the observer listens on
// the shard channel of that master alone.
func TestElectionCluster(t *testing.T) {
	skipShort(t, "starts a cluster")
	t.Parallel() // a cluster of its own; it waits on it (see TestMain)
	redistest.RequireShardedPubSub(t)
	tc := redistest.StartCluster(t, 3, 0)
	ctx := testCtx(t, hangGuard)
	prefix := topoPrefix(t)
	name := "leader{x}y"
	client := func() *Client { return clientOn(t, tc.Client(t), WithKeyPrefix(prefix)) }
	keys := wire.ElectKeys(prefix, name)
	slot := tc.Slot(t, keys[0])
	owner := tc.Owner(t, tc.Masters[0], slot)

	ch, _ := observeAsync(t, client().NewElection(name))
	checkShardWaiter(t, tc, owner, wire.ElectChannel(keys[0]))
	first, second := client().NewElection(name), client().NewElection(name)
	require.NoError(t, first.Campaign(ctx, "first"))
	assert.Equal(t, "first", next(t, ch, "the first leader").Value)
	w := campaignAsync(t, ctx, second, "second")
	waitFor(t, "the candidate queued on "+owner.String(), func() bool { return owner.RDB.Exists(ctx, keys[2]).Val() == 1 })
	require.NoError(t, first.Resign(ctx))
	w.won(t, "the second candidate")
	l := next(t, ch, "the second leader")
	assert.Equal(t, "second", l.Value)
	assert.Greater(t, l.Term, first.Term())
	require.NoError(t, second.Resign(ctx))
	checkLockKeys(t, tc, owner, prefix, slot, []string{keys[1], keys[3], keys[4]})
}

// TestElectionSentinelFailover: an observer through a failover client
// survives the primary's death and promotion: it sees the leader that
// campaigns after the failover, with a term above the one before.
func TestElectionSentinelFailover(t *testing.T) {
	skipShort(t, "starts a Sentinel deployment and fails it over")
	t.Parallel() // a deployment of its own; it waits on its failover (see TestMain)
	s := redistest.StartSentinel(t)
	ctx := testCtx(t, 2*hangGuard)
	name := lockName(t)
	client := func() *Client {
		return clientOn(t, s.Client(t, redis.FailoverOptions{ReadTimeout: time.Second, WriteTimeout: time.Second}))
	}
	ch, _ := observeAsync(t, client().NewElection(name))
	first := client().NewElection(name, WithLease(time.Second))
	require.NoError(t, first.Campaign(ctx, "before"))
	before := next(t, ch, "the leader before the failover")
	assert.Equal(t, "before", before.Value)

	old := s.Primary(t)
	old.Stop()
	s.AwaitSwitch(t, old)
	_ = first.Resign(ctx) // (its term may have been lost meanwhile)
	second := client().NewElection(name)
	require.NoError(t, second.Campaign(ctx, "after"))
	for {
		l := next(t, ch, "the leader after the failover")
		require.GreaterOrEqual(t, l.Term, before.Term, "a term observed after the failover")
		if l.Value == "after" {
			assert.Greater(t, l.Term, before.Term)
			break
		}
	}
	require.NoError(t, second.Resign(ctx))
}

// TestElectionReplicaAck: with WithReplicaAck(1, ...) a Campaign returns
// only once the replica has the term and the published record, and a
// Resign hands the term to a waiting candidate as on a single server; a
// Proclaim that the replica cannot acknowledge (its replication held)
// retries until its context ends, with ErrTooFewReplicas as its last
// error, and succeeds once the replica is back.
func TestElectionReplicaAck(t *testing.T) {
	t.Parallel() // servers of its own; it waits on them (see TestMain)
	p := redistest.StartReplicaPair(t, true)
	ctx := testCtx(t, hangGuard)
	name := lockName(t)
	k := electKeysOf(name)
	replica := rdbAt(t, p.Replica.Addr())
	client := func() *Client { return clientOn(t, rdbAt(t, p.Primary.Addr()), WithReplicaAck(1, time.Second)) }
	first, second := client().NewElection(name), client().NewElection(name)
	require.NoError(t, first.Campaign(ctx, "first"))
	rec, err := replica.Get(ctx, k.record).Result()
	require.NoError(t, err, "the record on the replica when Campaign returned")
	assert.Contains(t, rec, " first")
	assert.Equal(t, int64(1), replica.Exists(ctx, k.hash).Val(), "the term on the replica")

	w := campaignAsync(t, ctx, second, "second")
	awaitInQueue(t, rdbAt(t, p.Primary.Addr()), k.queue, 1)
	require.NoError(t, first.Resign(ctx))
	w.won(t, "the second candidate")
	rec, err = replica.Get(ctx, k.record).Result()
	require.NoError(t, err)
	assert.Contains(t, rec, " second", "the record on the replica when the second Campaign returned")
	p.Link.Pause()
	short, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	err = second.Proclaim(short, "third")
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "Proclaim while the replica is held")
	require.ErrorIs(t, err, ErrTooFewReplicas, "Proclaim while the replica is held")
	p.Link.Resume()
	require.NoError(t, second.Proclaim(ctx, "third"))
	rec, err = replica.Get(ctx, k.record).Result()
	require.NoError(t, err)
	assert.Contains(t, rec, " third", "the record on the replica when Proclaim returned")
	require.NoError(t, second.Resign(ctx))
}
