package remutex

// DistElection.Run: client-go's leaderelection shape. The callbacks' order
// (OnStoppedLeading only after the leader's function started, and after it
// returned), the hand-over when the function returns, a lost term and a new
// campaign, the function's error.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runner is a Run on a goroutine of the test, with what its callbacks saw.
type runner struct {
	res     chan error
	cancel  context.CancelFunc
	started chan int64  // f's term, each time f starts
	leaders chan Leader // OnNewLeader's
	mu      sync.Mutex
	events  []string
}

func (r *runner) record(ev string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
}

func (r *runner) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// runAsync starts e.Run(ctx, value, ...) on a goroutine of its own, ctx a
// child of parent, with callbacks that record what they see; body is f's
// work after it recorded its start (it gets f's context and how many times
// f started before). The goroutine is cancelled and joined at the end of
// the test.
func runAsync(t testing.TB, parent context.Context, e *DistElection, value string, body func(ctx context.Context, n int) error) *runner {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	r := &runner{res: make(chan error, 1), cancel: cancel, started: make(chan int64, 16), leaders: make(chan Leader, 64)}
	done := make(chan struct{})
	n := 0
	go func() {
		defer close(done)
		r.res <- e.Run(ctx, value, func(ctx context.Context) error {
			r.record(fmt.Sprint("started ", e.Term()))
			r.started <- e.Term()
			n++
			err := body(ctx, n-1)
			r.record(fmt.Sprint("returned ", e.Term()))
			return err
		}, OnNewLeader(func(l Leader) { r.leaders <- l }), OnStoppedLeading(func(term int64, err error) {
			r.record(fmt.Sprint("stopped ", term, " ", err))
		}))
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return r
}

// untilDone is a Run body that works until its context ends, and returns
// the cause.
func untilDone(ctx context.Context, _ int) error {
	<-ctx.Done()
	return context.Cause(ctx)
}

// TestElectionRunCallbacks: client-go's order: the function starts with the
// term's number, OnNewLeader names this candidate, and on cancel Run waits
// for the function to return, resigns, then calls OnStoppedLeading, and
// returns ctx's error.
func TestElectionRunCallbacks(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		e := b.client(t).NewElection(lockName(t))
		r := runAsync(t, ctx, e, "me", untilDone)
		term := await(t, r.started, "the function started")
		l := await(t, r.leaders, "OnNewLeader")
		assert.Equal(t, "me", l.Value)
		assert.Equal(t, term, l.Term)
		leaderIs(t, e, "me", term)

		r.cancel()
		err := await(t, r.res, "Run after its context ended")
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, []string{fmt.Sprint("started ", term), fmt.Sprint("returned ", term),
			fmt.Sprint("stopped ", term, " ", context.Canceled)}, r.seen())
		noLeader(t, e)
	})
}

// TestElectionRunNeverLed: kubernetes/kubernetes#127675: a Run that never
// led (its context ended while it campaigned) calls neither the function
// nor OnStoppedLeading.
func TestElectionRunNeverLed(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		leader := b.client(t).NewElection(name)
		require.NoError(t, leader.Campaign(ctx, "leader"))
		r := runAsync(t, ctx, b.client(t).NewElection(name), "never", untilDone)
		assert.Equal(t, "leader", await(t, r.leaders, "OnNewLeader of the leader").Value)
		awaitInQueue(t, b.rdb(t), electKeysOf(name).queue, 1)
		r.cancel()
		require.ErrorIs(t, await(t, r.res, "Run after its context ended"), context.Canceled)
		assert.Empty(t, r.seen(), "callbacks of a Run that never led")
		require.NoError(t, leader.Resign(ctx))
		noLeader(t, leader)
	})
}

// TestElectionRunHandsOver: a function that returns nil ends its term: the
// waiting Run leads next, with a higher term, and the first Run campaigns
// again, to lead when the second's context ends.
func TestElectionRunHandsOver(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		rdb := b.rdb(t)
		release := make(chan struct{})
		first := runAsync(t, ctx, b.client(t).NewElection(name), "first", func(ctx context.Context, n int) error {
			if n == 0 {
				<-release
				return nil
			}
			return untilDone(ctx, n)
		})
		t1 := await(t, first.started, "the first Run's term")
		second := runAsync(t, ctx, b.client(t).NewElection(name), "second", untilDone)
		awaitInQueue(t, rdb, electKeysOf(name).queue, 1)
		close(release)
		t2 := await(t, second.started, "the second Run's term")
		assert.Greater(t, t2, t1)
		awaitInQueue(t, rdb, electKeysOf(name).queue, 1) // the first campaigns again
		second.cancel()
		require.ErrorIs(t, await(t, second.res, "the second Run"), context.Canceled)
		t3 := await(t, first.started, "the first Run's next term")
		assert.Greater(t, t3, t2)
		assert.Contains(t, first.seen(), fmt.Sprint("stopped ", t1, " <nil>"))
		first.cancel()
		require.ErrorIs(t, await(t, first.res, "the first Run"), context.Canceled)
	})
}

// TestElectionRunLostTerm: a term lost while the function runs ends the
// function's context with ErrLockLost; OnStoppedLeading hears of the loss,
// and Run campaigns again, leading with a higher term.
func TestElectionRunLostTerm(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		causes := make(chan error, 4)
		r := runAsync(t, ctx, b.client(t).NewElection(name, WithLease(1500*time.Millisecond)), "v", func(ctx context.Context, n int) error {
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return context.Cause(ctx)
		})
		t1 := await(t, r.started, "the first term")
		require.NoError(t, b.rdb(t).Del(ctx, electKeysOf(name).hash).Err())
		require.ErrorIs(t, await(t, causes, "the function's context"), ErrLockLost)
		t2 := await(t, r.started, "the next term")
		assert.Greater(t, t2, t1)
		var stopped string
		for _, ev := range r.seen() {
			if len(ev) > 8 && ev[:8] == "stopped " {
				stopped = ev
			}
		}
		assert.Contains(t, stopped, fmt.Sprint("stopped ", t1, " "))
		assert.Contains(t, stopped, "lock lost")
		r.cancel()
		require.ErrorIs(t, await(t, r.res, "Run"), context.Canceled)
	})
}

// TestElectionRunError: a function that fails while its term is valid ends
// Run with its error, after resigning.
func TestElectionRunError(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		e := b.client(t).NewElection(lockName(t))
		boom := errors.New("boom")
		r := runAsync(t, ctx, e, "v", func(context.Context, int) error { return boom })
		term := await(t, r.started, "the function started")
		require.ErrorIs(t, await(t, r.res, "Run"), boom)
		assert.Equal(t, []string{fmt.Sprint("started ", term), fmt.Sprint("returned ", term),
			fmt.Sprint("stopped ", term, " boom")}, r.seen())
		noLeader(t, e)
	})
}
