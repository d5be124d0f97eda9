package remutex

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSemaphoreResendAnswersOwnFence: an acquisition sent again after
// another holder took a token (go-redis resends a call whose reply was
// lost; a queued waiter's call finds itself granted) is answered with its
// own holding's token, not the counter's latest: two acquisitions never
// share a token.
func TestSemaphoreResendAnswersOwnFence(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		ctx := testCtx(t, hangGuard)
		c := b.client(t)
		sems := semsOn(t, b, name, 3, 2, WithFencing())
		require.NoError(t, sems[0].Acquire(ctx, 1)) // the next calls take the slow path
		s := c.NewSemaphore(name, 3, WithFencing())
		n := c.be
		owner := interface{}(c.id + ":n999")
		call := func() int64 {
			t.Helper()
			r, err := n.Acquire(ctx, &s.m.spec.Spec, acquireReq{Owner: owner, Want: 1, Lease: s.m.spec.leaseArg, Fence: s.m.spec.fence})
			require.NoError(t, err)
			require.Equal(t, int64(replyGranted), r.Code, "the acquisition's reply")
			return r.Val
		}
		first := call()
		require.NoError(t, sems[1].Acquire(ctx, 1))
		other := sems[1].Fence()
		require.Greater(t, other, first, "the later acquisition's token")
		assert.Equal(t, first, call(), "the token of the acquisition sent again")
		_, err := c.ForceUnlock(ctx, name, owner.(string))
		require.NoError(t, err)
		sems[0].Release(1)
		sems[1].Release(1)
		semKeysLeft(t, b.rdb(t), name)
	})
}

// TestSemaphorePartialReleaseRenews: a release that lowers a holding sets
// its deadline on the server anew, as the holder's own clock counts it
// (from the release on): the holding never counts as valid locally after
// Redis has dropped it and handed its permits on.
func TestSemaphorePartialReleaseRenews(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		const lease = 3 * time.Second
		name := lockName(t)
		ctx := testCtx(t, hangGuard)
		rdb := b.rdb(t)
		sems := semsOn(t, b, name, 3, 2, WithLease(lease))
		s := sems[0]
		require.NoError(t, s.Acquire(ctx, 2))
		require.NoError(t, sems[1].Acquire(ctx, 1)) // s's holding gets a deadline of its own
		// Time passes since the acquisition (and before the first renewal,
		// at lease/3): a deadline left where it was falls short.
		time.Sleep(lease / 6)
		require.NoError(t, s.ReleaseContext(ctx, 1))

		c := s.m.c
		c.mu.Lock()
		h := s.latestLocked()
		require.NotNil(t, h)
		valid, owner := h.valid, h.owner.(string)
		c.mu.Unlock()
		v := rdb.HGet(ctx, semKeysOf(name).holders, owner).Val()
		_, d, ok := strings.Cut(v, ":")
		require.True(t, ok, "holding %q has a deadline", v)
		deadline, err := strconv.ParseInt(d, 10, 64)
		require.NoError(t, err, "holding %q", v)
		assert.GreaterOrEqual(t, deadline, valid.UnixMilli(),
			"the holding's deadline on the server (%q), against its validity on the holder's clock", v)
		assert.Equal(t, "1", v[:1], "permits kept")
		s.Release(1)
		sems[1].Release(1)
		semKeysLeft(t, rdb, name)
	})
}
