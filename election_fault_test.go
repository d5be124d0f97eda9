package remutex

// DistElection under faults: etcd's "failover on the leader's death" with a
// leader process killed, and the lease claim: a term cut off from Redis ends
// its context before another candidate can be elected. And what a
// Campaign+Resign costs in commands and round trips.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// electRole campaigns in cfg.Name with the value cfg.ID, emits "leading
// <term>", and waits for the term to end: then it emits "lost".
func electRole(cfg childConfig) int {
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	defer rdb.Close()
	c := NewClient(rdb, WithLogger(slog.New(slog.DiscardHandler)))
	defer c.Close()
	e := c.NewElection(cfg.Name, WithLease(cfg.Lease))
	if err := e.Campaign(context.Background(), cfg.ID); err != nil {
		redistest.Emit("error", faultErrKind(err))
		return 1
	}
	redistest.Emit("leading", e.Term())
	<-e.Lost()
	redistest.Emit("lost")
	return 0
}

// TestElectionLeaderKilled: etcd's "failover on the leader's death": the
// leader's process is killed (SIGKILL); the waiting candidate leads once
// the lease ends, with a higher term, and Leader names it.
func TestElectionLeaderKilled(t *testing.T) {
	skipShort(t, "a child process and a lease")
	t.Parallel() // its own keys; it waits out a lease (see TestMain)
	// (The child's lease must outlast a loaded machine's pauses until it is
	// killed.)
	const lease = time.Second
	b := sharedBackend(t)
	ctx := testCtx(t, hangGuard)
	name := lockName(t)
	child := startChild(t, childConfig{Role: "elect", Addr: b.addr, Name: name, Lease: lease, ID: "child"})
	f := child.Expect(t, "leading", hangGuard)
	childTerm, err := strconv.ParseInt(f[0], 10, 64)
	require.NoError(t, err)
	e := b.client(t).NewElection(name)
	l := leaderIs(t, e, "child", childTerm)
	assert.Equal(t, child.Pid(), l.PID, "the leader's pid")

	w := campaignAsync(t, ctx, e, "parent")
	awaitInQueue(t, b.rdb(t), electKeysOf(name).queue, 1)
	killed := time.Now()
	child.Signal(t, syscall.SIGKILL)
	w.won(t, "the candidate after the leader was killed")
	took := time.Since(killed)
	t.Logf("the next leader elected %v after the kill: %.2f leases", took, float64(took)/float64(lease))
	assert.Greater(t, e.Term(), childTerm)
	leaderIs(t, e, "parent", e.Term())
	require.NoError(t, e.Resign(ctx))
}

// TestElectionTermEndsFirst: the lease claim of docs/guarantees.md for
// terms: a leader cut off from Redis (its connection black-holed) has its
// term's context ended, and Lost closed, before the next candidate's
// Campaign returns; the next term is higher.
func TestElectionTermEndsFirst(t *testing.T) {
	skipShort(t, "waits out a lease")
	// Serial: the cut-off term's context must end within the drift margin
	// (20ms) before its lease ends in Redis and the next candidate leads.
	const lease = 600 * time.Millisecond
	b := sharedBackend(t)
	ctx := testCtx(t, hangGuard)
	name := lockName(t)
	proxy := redistest.NewProxy(t, b.addr)
	leader := clientOn(t, rdbAt(t, proxy.Addr())).NewElection(name, WithLease(lease))
	require.NoError(t, leader.Campaign(ctx, "cut off"))
	term, tctx := leader.Term(), leader.Context()
	var mu sync.Mutex
	var ended time.Time
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		<-tctx.Done()
		mu.Lock()
		ended = time.Now()
		mu.Unlock()
	}()
	t.Cleanup(func() { <-watched })

	next := b.client(t).NewElection(name)
	w := campaignAsync(t, ctx, next, "next")
	awaitInQueue(t, b.rdb(t), electKeysOf(name).queue, 1)
	proxy.SetBlackhole(true)
	w.won(t, "the next candidate")
	won := time.Now()
	await(t, watched, "the cut-off term's context")
	mu.Lock()
	defer mu.Unlock()
	assert.True(t, ended.Before(won), "the cut-off term's context ended at %v, after the next candidate was elected at %v", ended, won)
	assert.True(t, isClosed(leader.Lost()), "Lost of the cut-off term")
	require.ErrorIs(t, context.Cause(tctx), ErrLockLost)
	assert.Greater(t, next.Term(), term)
	require.NoError(t, next.Resign(ctx))
	proxy.Heal() // (so that the cut-off Client closes at once)
}

// roundTrips counts the calls a redis client makes (a pipeline is one) and
// the commands in them.
type roundTrips struct {
	mu                sync.Mutex
	trips, cmd, elect int // elect: calls of elect.lua
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.add(cmd)
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.add(cmds...)
		return next(ctx, cmds)
	}
}

func (r *roundTrips) add(cmds ...redis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips++
	r.cmd += len(cmds)
	for _, c := range cmds {
		if a := c.Args(); len(a) > 1 && fmt.Sprint(a[0]) == "evalsha" && fmt.Sprint(a[1]) == electScript.Hash() {
			r.elect++
		}
	}
}

func (r *roundTrips) take() (trips, cmds, elect int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	trips, cmds, elect = r.trips, r.cmd, r.elect
	r.trips, r.cmd, r.elect = 0, 0, 0
	return trips, cmds, elect
}

// TestElectionCost: an uncontended Campaign costs two round trips (the
// acquire, then the publication), its Resign one (the release); a Resign
// with a candidate waiting hands the term over in its one round trip, and
// the new leader's Campaign returns after its publication's.
func TestElectionCost(t *testing.T) {
	// (Its counts are of its own connection pools' calls.)
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		var rt roundTrips
		rdb := b.rdb(t)
		rdb.AddHook(&rt)
		e := clientOn(t, rdb).NewElection(name)
		for i := 0; i < 2; i++ { // (the first loads the scripts)
			rt.take()
			require.NoError(t, e.Campaign(ctx, "v"))
			campaign, campaignCmds, _ := rt.take()
			require.NoError(t, e.Resign(ctx))
			resign, resignCmds, _ := rt.take()
			if i == 1 {
				t.Logf("Campaign: %d round trips, %d commands; Resign: %d round trips, %d commands", campaign, campaignCmds, resign, resignCmds)
				assert.Equal(t, 2, campaign, "Campaign's round trips")
				assert.Equal(t, 2, campaignCmds, "Campaign's commands")
				assert.Equal(t, 1, resign, "Resign's round trips")
				assert.Equal(t, 1, resignCmds, "Resign's commands")
			}
		}

		var wt roundTrips
		wrdb := b.rdb(t)
		wrdb.AddHook(&wt)
		waiter := clientOn(t, wrdb).NewElection(name)
		require.NoError(t, e.Campaign(ctx, "v"))
		w := campaignAsync(t, ctx, waiter, "w")
		awaitInQueue(t, b.rdb(t), electKeysOf(name).queue, 1)
		rt.take()
		wt.take()
		resigned := time.Now()
		require.NoError(t, e.Resign(ctx))
		resign, resignCmds, _ := rt.take()
		w.won(t, "the waiting candidate")
		t.Logf("the next leader's Campaign returned %v after Resign began", time.Since(resigned))
		// (The waiter may also have refreshed its queue entry meanwhile:
		// its publication is what follows the grant.)
		after, afterCmds, published := wt.take()
		t.Logf("hand-over: Resign %d round trips (%d commands), then the message, then the new leader's publication (its calls meanwhile: %d round trips, %d commands)", resign, resignCmds, after, afterCmds)
		assert.Equal(t, 1, resign, "the handing Resign's round trips")
		assert.Equal(t, 1, published, "the new leader's publications")
		require.NoError(t, waiter.Resign(ctx))
	})
}

// TestElectionCampaignCutOffInPublication: a Campaign is granted the term,
// and its publication gets no answer before ctx ends (cancelled while the
// publication is held); nor does anything after it. Campaign returns at
// ctx's end, giving the term up in the background (the next candidate is
// not kept waiting past the lease), not once Redis answers the giving up.
func TestElectionCampaignCutOffInPublication(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		p := redistest.NewFaultProxy(t, b.addr)
		name := lockName(t)
		e := clientOn(t, newRDB(t, &redis.Options{Addr: p.Addr()})).NewElection(name)
		// Every script on the server first, so that elect.lua's call is one
		// EVALSHA, whose SHA1 the fault matches.
		check := rdbAt(t, b.addr)
		require.NoError(t, check.ScriptLoad(testCtx(t, hangGuard), electScript.Src.(string)).Err())
		const held = 3 * time.Second
		pub := p.Delay(redistest.Match{Args: []string{electScript.Hash()}, Times: 1}, held)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- e.Campaign(ctx, "cut off") }()
		faultAwait(t, pub.Matched(1), hangGuard, "the publication held")
		all := p.Delay(redistest.Match{}, held) // (everything after it too)
		cut := time.Now()
		cancel()
		var err error
		select {
		case err = <-done:
		case <-time.After(hangGuard):
			t.Fatal("Campaign did not return")
		}
		took := time.Since(cut)
		all.Stop()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Campaign cut off in its publication: got %v, want context.Canceled", err)
		}
		if took > deadlineSlack {
			t.Errorf("Campaign returned %v after its context ended, want within %v", took.Round(time.Millisecond), deadlineSlack)
		}
		// The term given up reaches Redis once it answers again.
		waitFor(t, "the term given up", func() bool {
			return check.Exists(context.Background(), electKeysOf(name).hash).Val() == 0
		})
	})
}
