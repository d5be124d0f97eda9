package remutex

// The behaviours of etcd's election tests (client/v3/concurrency and
// tests/integration: campaign waits for the earlier leader, re-campaign
// proclaims, Leader with no leader, Proclaim by a non-leader, Resign hands
// over, a lost term and a new campaign), ported onto DistElection, on both
// backends.

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/wire"
)

// ---------------------------------------------------------------- helpers

// electKeys are an election's keys under the default prefix.
type electKeys struct{ hash, fence, queue, record, log string }

func electKeysOf(name string) electKeys {
	k := wire.ElectKeys(DefaultKeyPrefix, name)
	return electKeys{k[0], k[1], k[2], k[3], k[4]}
}

// candidate is a Campaign running on a goroutine of the test. cancel ends
// its wait; the goroutine is cancelled and joined at the end of the test.
type candidate struct {
	res    chan error
	cancel context.CancelFunc
	done   chan struct{}
}

// campaignAsync starts e.Campaign(ctx, value) on a goroutine of its own,
// ctx a child of parent.
func campaignAsync(t testing.TB, parent context.Context, e *DistElection, value string) *candidate {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	w := &candidate{res: make(chan error, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.res <- e.Campaign(ctx, value)
	}()
	t.Cleanup(func() {
		cancel()
		<-w.done
	})
	return w
}

// pending fails the test if the candidate's Campaign returned.
func (w *candidate) pending(t testing.TB, what string) {
	t.Helper()
	select {
	case err := <-w.res:
		t.Fatalf("%s: Campaign returned %v, want it still waiting", what, err)
	default:
	}
}

// won waits for the candidate's Campaign and fails the test unless it
// returned nil.
func (w *candidate) won(t testing.TB, what string) {
	t.Helper()
	if err := await(t, w.res, what); err != nil {
		t.Fatalf("%s: Campaign: got %v, want nil", what, err)
	}
}

// leaderIs fails the test unless e's Leader is value, of term.
func leaderIs(t testing.TB, e *DistElection, value string, term int64) Leader {
	t.Helper()
	l, err := e.Leader(context.Background())
	require.NoError(t, err, "Leader")
	assert.Equal(t, value, l.Value, "Leader's value")
	assert.Equal(t, term, l.Term, "Leader's term")
	return l
}

// noLeader fails the test unless e's Leader is ErrNoLeader.
func noLeader(t testing.TB, e *DistElection) {
	t.Helper()
	_, err := e.Leader(context.Background())
	require.ErrorIs(t, err, ErrNoLeader)
	var le *LockError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "leader", le.Op)
}

// ---------------------------------------------------------------- tests

// TestElectionCampaignWaits: etcd's "campaign waits for the earlier
// leader": a second candidate waits while the first leads, Leader names the
// first (its value, term, host and process), and the first's Resign hands
// the term over at once, with a higher term.
func TestElectionCampaignWaits(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		rdb := b.rdb(t)
		first, second := b.client(t).NewElection(name), b.client(t).NewElection(name)
		require.NoError(t, first.Campaign(ctx, "first"))
		term := first.Term()
		require.Positive(t, term, "the first term")
		assert.Equal(t, term, first.Fence(), "Fence is Term")

		w := campaignAsync(t, ctx, second, "second")
		awaitInQueue(t, rdb, electKeysOf(name).queue, 1)
		w.pending(t, "the second candidate while the first leads")
		assert.Zero(t, second.Term(), "the waiting candidate's term")
		l := leaderIs(t, second, "first", term)
		assert.Equal(t, os.Getpid(), l.PID, "the leader's pid")
		assert.NotEmpty(t, l.Host, "the leader's host")
		assert.False(t, l.Since.IsZero(), "the leader's Since")

		require.NoError(t, first.Resign(ctx))
		assert.Zero(t, first.Term(), "the term after Resign")
		require.ErrorIs(t, context.Cause(first.Context()), ErrReleased, "the resigned term's context")
		w.won(t, "the second candidate after the first resigned")
		assert.Greater(t, second.Term(), term, "the second term")
		leaderIs(t, first, "second", second.Term())
		require.NoError(t, second.Resign(ctx))
		noLeader(t, first)
	})
}

// TestElectionCandidatesInOrder: candidates lead in the order they
// campaigned, each Resign handing the term to the next, terms rising.
func TestElectionCandidatesInOrder(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		rdb := b.rdb(t)
		leader := b.client(t).NewElection(name)
		require.NoError(t, leader.Campaign(ctx, "0"))
		const n = 3
		es := make([]*DistElection, n)
		ws := make([]*candidate, n)
		for i := range es {
			es[i] = b.client(t).NewElection(name)
			ws[i] = campaignAsync(t, ctx, es[i], string(rune('a'+i)))
			awaitInQueue(t, rdb, electKeysOf(name).queue, int64(i+1))
		}
		prev, last := leader.Term(), leader
		for i := range es {
			require.NoError(t, last.Resign(ctx))
			ws[i].won(t, "candidate "+string(rune('a'+i)))
			for _, w := range ws[i+1:] {
				w.pending(t, "a later candidate")
			}
			assert.Greater(t, es[i].Term(), prev, "term %d", i)
			leaderIs(t, es[i], string(rune('a'+i)), es[i].Term())
			prev, last = es[i].Term(), es[i]
		}
		require.NoError(t, last.Resign(ctx))
	})
}

// TestElectionNoLeader: etcd's "Leader with no leader": ErrNoLeader before
// any campaign and after the leader resigned; Resign of a value that does
// not lead is nil, as etcd's is.
func TestElectionNoLeader(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		e := b.client(t).NewElection(lockName(t))
		noLeader(t, e)
		require.NoError(t, e.Resign(ctx), "Resign before any campaign")
		require.NoError(t, e.Campaign(ctx, "v"))
		require.NoError(t, e.Resign(ctx))
		noLeader(t, e)
		require.NoError(t, e.Resign(ctx), "Resign again")
		require.ErrorIs(t, context.Cause(e.Context()), ErrReleased)
	})
}

// TestElectionProclaim: etcd's "Proclaim by a non-leader fails": a
// candidate that does not lead gets ErrNotLeader; the leader's Proclaim
// changes the value and keeps the term and its start; a resigned leader's
// Proclaim fails.
func TestElectionProclaim(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		leader, other := b.client(t).NewElection(name), b.client(t).NewElection(name)
		err := other.Proclaim(ctx, "x")
		require.ErrorIs(t, err, ErrNotLeader, "Proclaim before any campaign")
		var le *LockError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, "proclaim", le.Op)

		require.NoError(t, leader.Campaign(ctx, "v1"))
		require.ErrorIs(t, other.Proclaim(ctx, "x"), ErrNotLeader, "Proclaim by a non-leader")
		first := leaderIs(t, other, "v1", leader.Term())
		require.NoError(t, leader.Proclaim(ctx, "v2"))
		require.NoError(t, leader.Proclaim(ctx, "v2"), "the same value again")
		second := leaderIs(t, other, "v2", leader.Term())
		assert.True(t, first.Since.Equal(second.Since), "Since after Proclaim: got %v, want %v", second.Since, first.Since)
		require.NoError(t, leader.Resign(ctx))
		require.ErrorIs(t, leader.Proclaim(ctx, "v3"), ErrNotLeader, "Proclaim after Resign")
		noLeader(t, other)
	})
}

// TestElectionRecampaign: etcd's TestElectionSessionRecampaign: campaigning
// again on a value that leads proclaims the new value instead of waiting
// for itself.
func TestElectionRecampaign(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		e := b.client(t).NewElection(lockName(t))
		require.NoError(t, e.Campaign(ctx, "a"))
		term := e.Term()
		require.NoError(t, e.Campaign(ctx, "b"))
		assert.Equal(t, term, e.Term(), "the term after the second Campaign")
		leaderIs(t, e, "b", term)
		require.NoError(t, e.Resign(ctx))
	})
}

// TestElectionCampaignCancelled: a Campaign whose context ends returns its
// error and leaves nothing behind: no queue entry, no term; the leader's
// Resign then leaves the election without a leader. A Campaign with a
// context done already sends nothing.
func TestElectionCampaignCancelled(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		rdb := b.rdb(t)
		k := electKeysOf(name)

		done, cancel := context.WithCancel(ctx)
		cancel()
		e := b.client(t).NewElection(name)
		require.ErrorIs(t, e.Campaign(done, "never"), context.Canceled)
		assert.Zero(t, rdb.Exists(ctx, k.hash, k.fence, k.queue, k.record, k.log).Val(), "keys after a Campaign of a done context")

		leader := b.client(t).NewElection(name)
		require.NoError(t, leader.Campaign(ctx, "leader"))
		w := campaignAsync(t, ctx, e, "given up")
		awaitInQueue(t, rdb, k.queue, 1)
		w.cancel()
		err := await(t, w.res, "the cancelled Campaign")
		require.ErrorIs(t, err, context.Canceled)
		var le *LockError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, "campaign", le.Op)
		waitFor(t, "the queue entry gone", func() bool { return rdb.Exists(ctx, k.queue).Val() == 0 })
		assert.Zero(t, e.Term(), "the cancelled candidate's term")

		require.NoError(t, leader.Resign(ctx))
		noLeader(t, leader)
		assert.Zero(t, rdb.Exists(ctx, k.hash, k.queue).Val(), "hold or queue after the Resign")
	})
}

// TestElectionLostTerm: etcd's "re-campaign after a lost session": a term
// whose hold is gone from Redis is lost (Lost closes, its context ends with
// ErrLockLost, Proclaim fails, nobody leads), its Resign reports the loss,
// and the next Campaign leads with a higher term.
func TestElectionLostTerm(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		rdb := b.rdb(t)
		// (A lease short enough for the loss to be found at once, long
		// enough to outlast a loaded machine's pauses.)
		e := b.client(t).NewElection(name, WithLease(1500*time.Millisecond))
		require.NoError(t, e.Campaign(ctx, "a"))
		term, tctx := e.Term(), e.Context()
		require.NoError(t, rdb.Del(ctx, electKeysOf(name).hash).Err())
		await(t, e.Lost(), "the term lost")
		await(t, tctx.Done(), "the term's context")
		require.ErrorIs(t, context.Cause(tctx), ErrLockLost)
		assert.Equal(t, term, e.Term(), "a lost term's number, until Resign")
		require.ErrorIs(t, e.Proclaim(ctx, "b"), ErrNotLeader)
		noLeader(t, e)
		require.ErrorIs(t, e.Resign(ctx), ErrLockLost)

		require.NoError(t, e.Campaign(ctx, "c"))
		assert.Greater(t, e.Term(), term, "the new term")
		leaderIs(t, e, "c", e.Term())
		require.NoError(t, e.Resign(ctx))
	})
}

// TestElectionClosedLeader: etcd's "failover on the leader's death", by a
// closed Client: its term is lost at once, and the waiting candidate leads
// when the lease ends, with a higher term.
func TestElectionClosedLeader(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		const lease = 600 * time.Millisecond
		lc := b.client(t)
		// (Only the leader's lease is short: the next candidate's must
		// not run out under a loaded machine's pauses.)
		leader, next := lc.NewElection(name, WithLease(lease)), b.client(t).NewElection(name)
		require.NoError(t, leader.Campaign(ctx, "dies"))
		term := leader.Term()
		w := campaignAsync(t, ctx, next, "next")
		awaitInQueue(t, b.rdb(t), electKeysOf(name).queue, 1)
		require.NoError(t, lc.Close())
		await(t, leader.Lost(), "the closed Client's term lost")
		b.fastForward(lease)
		w.won(t, "the next candidate after the lease")
		assert.Greater(t, next.Term(), term)
		leaderIs(t, next, "next", next.Term())
		require.NoError(t, next.Resign(ctx))
	})
}

// TestElectionForeignData: a key of another type, or a record remutex did
// not write, under the election's name is a *WrongTypeError naming it; the
// data is left as it was, and a Campaign that could not publish leaves no
// term behind.
func TestElectionForeignData(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		rdb := b.rdb(t)
		k := electKeysOf(name)
		e := b.client(t).NewElection(name)

		require.NoError(t, rdb.Set(ctx, k.record, "not a record", 0).Err())
		_, err := e.Leader(ctx)
		var wt *WrongTypeError
		require.ErrorAs(t, err, &wt)
		assert.Equal(t, k.record, wt.Key)
		assert.Equal(t, foreignRecord, wt.Type)
		err = e.Campaign(ctx, "v")
		require.ErrorAs(t, err, &wt, "Campaign over a foreign record")
		assert.Equal(t, k.record, wt.Key)
		assert.Equal(t, "not a record", rdb.Get(ctx, k.record).Val(), "the foreign record")
		require.NoError(t, rdb.Del(ctx, k.record).Err())

		require.NoError(t, rdb.RPush(ctx, k.log, "x").Err())
		err = e.Campaign(ctx, "v")
		require.ErrorAs(t, err, &wt)
		assert.Equal(t, k.log, wt.Key)
		assert.Equal(t, []string{"x"}, rdb.LRange(ctx, k.log, 0, -1).Val(), "the foreign list")
		assert.Zero(t, e.Term(), "a term after the failed Campaign")
		waitFor(t, "the unpublished hold released", func() bool { return rdb.Exists(ctx, k.hash).Val() == 0 })
		assert.ErrorIs(t, rdb.Get(ctx, k.record).Err(), redis.Nil, "a record written")
	})
}

// TestElectionBadInput: what NewElection and Run refuse panics with a
// message that says why, before any command (the Client's server does not
// exist); a quorum Client is refused.
func TestElectionBadInput(t *testing.T) {
	t.Parallel() // no server of its own but miniredis's; nothing to wait for
	c := clientOn(t, rdbAt(t, "127.0.0.1:1"))
	f := func(context.Context) error { return nil }
	for _, tc := range []struct {
		what, want string
		f          func()
	}{
		{"empty name", "remutex: NewElection: empty lock name", func() { c.NewElection("") }},
		{"WithoutRenewal", "remutex: NewElection: WithoutRenewal", func() { c.NewElection("x", WithoutRenewal()) }},
		{"WithMinHold", "remutex: NewElection: WithMinHold is an option of a DistMutex", func() { c.NewElection("x", WithMinHold(time.Second)) }},
		{"lease", "remutex: WithLease(1ms)", func() { c.NewElection("x", WithLease(time.Millisecond)) }},
		{"nil option", "remutex: NewElection: nil option", func() { c.NewElection("x", nil) }},
		{"nil Client", "remutex: NewElection on a nil Client", func() { (*Client)(nil).NewElection("x") }},
		{"nil f", "remutex: DistElection.Run: nil function", func() { _ = c.NewElection("x").Run(context.Background(), "v", nil) }},
		{"nil run option", "remutex: DistElection.Run: nil option", func() { _ = c.NewElection("x").Run(context.Background(), "v", f, nil) }},
		{"zero DistElection", "remutex: DistElection not created by Client.NewElection", func() { _ = new(DistElection).Campaign(context.Background(), "v") }},
		{"zero DistElection's Observe", "remutex: DistElection not created by Client.NewElection", func() { new(DistElection).Observe(context.Background()) }},
	} {
		assert.Contains(t, panicOf(t, tc.what, tc.f), tc.want, tc.what)
	}

	rdbs := make([]redis.UniversalClient, 3)
	for i := range rdbs {
		rdbs[i] = rdbAt(t, miniredis.RunT(t).Addr())
	}
	q := NewQuorumClient(rdbs, WithLogger(testLogger(t)))
	t.Cleanup(func() { _ = q.Close() })
	assert.Contains(t, panicOf(t, "a quorum Client", func() { q.NewElection("x") }),
		"remutex: NewElection: a quorum Client cannot keep a leader's published value in order")
}
