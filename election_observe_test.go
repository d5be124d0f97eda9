package remutex

// DistElection.Observe: etcd's "Observe sees every leader", in order; a
// slow reader sees every term; an observer that missed messages (its
// connection cut) catches up from the log; observing costs no command per
// change.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// observeAsync starts e.Observe on a context that ends with the test, whose
// channel the test must read until closed: cancel ends it, and the cleanup
// waits for it to close.
func observeAsync(t testing.TB, e *DistElection) (ch <-chan Leader, cancel context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch = e.Observe(ctx)
	t.Cleanup(func() {
		cancel()
		for range ch {
		}
	})
	return ch, cancel
}

// next receives the next leader, failing the test if none comes within
// hangGuard or the channel closed.
func next(t testing.TB, ch <-chan Leader, what string) Leader {
	t.Helper()
	timer := time.NewTimer(hangGuard)
	defer timer.Stop()
	select {
	case l, ok := <-ch:
		if !ok {
			t.Fatalf("%s: the channel closed", what)
		}
		return l
	case <-timer.C:
		t.Fatalf("%s: nothing after %v", what, hangGuard)
	}
	panic("unreachable")
}

// TestElectionObserve: an observer sees each leader and each value in
// order, with the terms rising; one started later sees the current leader
// first; the channel closes when its context ends.
func TestElectionObserve(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		first, second := b.client(t).NewElection(name), b.client(t).NewElection(name)
		ch, cancel := observeAsync(t, b.client(t).NewElection(name))

		require.NoError(t, first.Campaign(ctx, "a1"))
		l := next(t, ch, "the first leader")
		assert.Equal(t, "a1", l.Value)
		assert.Equal(t, first.Term(), l.Term)
		require.NoError(t, first.Proclaim(ctx, "a2"))
		l = next(t, ch, "the first leader's new value")
		assert.Equal(t, Leader{Value: "a2", Term: first.Term(), Since: l.Since, Host: l.Host, PID: l.PID, Owner: l.Owner}, l)

		w := campaignAsync(t, ctx, second, "b1")
		awaitInQueue(t, b.rdb(t), electKeysOf(name).queue, 1)
		require.NoError(t, first.Resign(ctx))
		w.won(t, "the second candidate")
		l = next(t, ch, "the second leader")
		assert.Equal(t, "b1", l.Value)
		assert.Equal(t, second.Term(), l.Term)
		assert.Greater(t, l.Term, first.Term(), "the second term")

		late, lateCancel := observeAsync(t, b.client(t).NewElection(name))
		l = next(t, late, "the current leader, to a late observer")
		assert.Equal(t, "b1", l.Value)
		lateCancel()
		for range late {
			t.Error("a leader after the late observer's context ended")
		}

		require.NoError(t, second.Resign(ctx))
		cancel()
		for l := range ch {
			t.Errorf("got %+v after the last change, want the channel closed", l)
		}
	})
}

// TestElectionObserveSlowReader: an observer whose reader does not read
// while many values and terms are published sees every term, in order,
// each with its last value at the end, and no term twice apart.
func TestElectionObserveSlowReader(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		ch, _ := observeAsync(t, b.client(t).NewElection(name))
		// (Once the observer saw a change, it hears every later one.)
		start := b.client(t).NewElection(name)
		require.NoError(t, start.Campaign(ctx, "start"))
		assert.Equal(t, "start", next(t, ch, "the first leader").Value)
		require.NoError(t, start.Resign(ctx))
		const terms, values = 4, 5
		var want []int64
		for i := 0; i < terms; i++ {
			e := b.client(t).NewElection(name)
			require.NoError(t, e.Campaign(ctx, fmt.Sprint(i, ".0")))
			for v := 1; v < values; v++ {
				require.NoError(t, e.Proclaim(ctx, fmt.Sprint(i, ".", v)))
			}
			want = append(want, e.Term())
			require.NoError(t, e.Resign(ctx))
		}
		var got []int64
		lastValue := ""
		for lastValue != fmt.Sprint(terms-1, ".", values-1) {
			l := next(t, ch, "the next change")
			if n := len(got); n == 0 || got[n-1] != l.Term {
				got = append(got, l.Term)
			}
			lastValue = l.Value
		}
		assert.Equal(t, want, got, "the terms seen")
	})
}

// TestElectionObserveMissed: an observer whose connection lost the
// messages of several changes (its bytes dropped, then the connection cut)
// reads them from the log when it reconnects: every term, in order.
func TestElectionObserveMissed(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		proxy := redistest.NewProxy(t, b.addr)
		oc := clientOn(t, rdbAt(t, proxy.Addr()))
		ch, _ := observeAsync(t, oc.NewElection(name))
		e := b.client(t).NewElection(name)
		require.NoError(t, e.Campaign(ctx, "before"))
		assert.Equal(t, "before", next(t, ch, "the first leader").Value)
		require.NoError(t, e.Resign(ctx))

		proxy.SetBlackhole(true)
		var want []string
		for i := 0; i < 3; i++ {
			e := b.client(t).NewElection(name)
			require.NoError(t, e.Campaign(ctx, fmt.Sprint("missed", i)))
			want = append(want, fmt.Sprint("missed", i))
			require.NoError(t, e.Resign(ctx))
		}
		proxy.Heal()
		var got []string
		for len(got) < len(want) {
			got = append(got, next(t, ch, "a missed leader").Value)
		}
		assert.Equal(t, want, got)
	})
}

// TestElectionObserveCost: an observer that misses nothing sends no
// command per change: each change reaches it in the message that carries
// it. (Counted on the observer's own connection pool.)
func TestElectionObserveCost(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		log := newCommandLog()
		ordb := b.rdb(t)
		ordb.AddHook(log)
		ch, _ := observeAsync(t, clientOn(t, ordb).NewElection(name))
		e := b.client(t).NewElection(name)
		require.NoError(t, e.Campaign(ctx, "v0"))
		assert.Equal(t, "v0", next(t, ch, "the leader").Value)
		_, before := log.counts()
		const changes = 10
		for i := 1; i <= changes; i++ {
			require.NoError(t, e.Proclaim(ctx, fmt.Sprint("v", i)))
			assert.Equal(t, fmt.Sprint("v", i), next(t, ch, "a change").Value)
		}
		_, after := log.counts()
		assert.Equal(t, before, after, "the observer's commands during %d changes", changes)
		require.NoError(t, e.Resign(ctx))
	})
}

// TestElectionObserveRestart: Redis restarts empty (no persistence): the
// leader's term is lost, and an observer that saw it sees the next leader,
// whose term is higher (the counter re-seeded from the server's clock),
// though the log it read before is gone.
func TestElectionObserveRestart(t *testing.T) {
	eachFreshBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		ch, _ := observeAsync(t, b.client(t).NewElection(name))
		first := b.client(t).NewElection(name, WithLease(600*time.Millisecond))
		require.NoError(t, first.Campaign(ctx, "before"))
		before := next(t, ch, "the leader before the restart")
		assert.Equal(t, "before", before.Value)

		b.restart(t)
		await(t, first.Lost(), "the term lost with the restart")
		second := b.client(t).NewElection(name)
		require.NoError(t, second.Campaign(ctx, "after"))
		after := next(t, ch, "the leader after the restart")
		assert.Equal(t, "after", after.Value)
		assert.Greater(t, after.Term, before.Term, "the term after the restart")
		require.NoError(t, second.Resign(ctx))
	})
}

// TestElectionValues: a value may hold anything (spaces, newlines, any
// bytes, nothing); Leader and Observe return it as published.
func TestElectionValues(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		ch, _ := observeAsync(t, b.client(t).NewElection(name))
		e := b.client(t).NewElection(name)
		values := []string{"", "a b", "line\nline", "ü \x00 \xff", " ", "1-1 2 o v", strings.Repeat("x", 64<<10)}
		require.NoError(t, e.Campaign(ctx, values[0]))
		for i, v := range values {
			if i > 0 {
				require.NoError(t, e.Proclaim(ctx, v))
			}
			assert.Equal(t, v, next(t, ch, "a value").Value, "value %d", i)
			leaderIs(t, e, v, e.Term())
		}
		require.NoError(t, e.Resign(ctx))
	})
}
