package remutex

// A DistElection through Client.Inspect and Client.ForceUnlock: the leader
// is the lock's holder, the candidates its waiters; a forced release ends
// the term and hands it to the next candidate.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestElectionInspectForceUnlock(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		admin := b.client(t)
		// (The forced-out leader hears of it at its next renewal: lease/3.)
		leader, next := b.client(t).NewElection(name, WithLease(1500*time.Millisecond)), b.client(t).NewElection(name)
		require.NoError(t, leader.Campaign(ctx, "leader"))
		w := campaignAsync(t, ctx, next, "next")
		awaitInQueue(t, b.rdb(t), electKeysOf(name).queue, 1)

		info, err := admin.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, "election", info.Kind)
		assert.Equal(t, electKeysOf(name).hash, info.Key)
		assert.Equal(t, leader.Term(), info.Fence, "the fence: the term")
		require.Len(t, info.Holders, 1, "the leader")
		l := leaderIs(t, admin.NewElection(name), "leader", leader.Term())
		assert.Equal(t, l.Owner, info.Holders[0].Owner, "the holder: the leader")
		assert.Len(t, info.Waiters, 1, "the candidate")

		released, err := admin.ForceUnlock(ctx, name)
		require.NoError(t, err)
		assert.True(t, released)
		w.won(t, "the candidate after the forced release")
		await(t, leader.Lost(), "the forced-out term lost")
		assert.Greater(t, next.Term(), l.Term)
		leaderIs(t, admin.NewElection(name), "next", next.Term())
		require.NoError(t, next.Resign(ctx))
	})
}
