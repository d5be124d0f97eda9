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

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
	"github.com/remutex/remutex/internal/wire"
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
		for _, p := range runTerms(t, b, name, terms, values) {
			want = append(want, p.term)
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

// runTerms runs terms terms of the election name one after another, each
// a candidate of a Client of its own that campaigns with the value "<i>.0",
// proclaims "<i>.1" to "<i>.<values-1>" and resigns; it returns each term
// with its last value.
func runTerms(t *testing.T, b *testBackend, name string, terms, values int) []pub {
	t.Helper()
	ctx := testCtx(t, hangGuard)
	var out []pub
	for i := 0; i < terms; i++ {
		e := b.client(t).NewElection(name)
		require.NoError(t, e.Campaign(ctx, fmt.Sprint(i, ".0")))
		for v := 1; v < values; v++ {
			require.NoError(t, e.Proclaim(ctx, fmt.Sprint(i, ".", v)))
		}
		out = append(out, pub{e.Term(), fmt.Sprint(i, ".", values-1)})
		require.NoError(t, e.Resign(ctx))
	}
	return out
}

// TestElectionObserveMissed: an observer whose connection lost the
// messages of several changes (its bytes dropped, then the connection cut)
// reads them from the log when it reconnects: every term, in order.
func TestElectionObserveMissed(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		ch, proxy, _ := cutObserver(t, b, name)
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

// cutObserver starts an observer of the election name on a Client whose
// connection goes through a proxy (its errors in errs), waits until it saw a
// first term, and black-holes the proxy: until proxy.Heal, the observer
// hears nothing.
func cutObserver(t *testing.T, b *testBackend, name string) (ch <-chan Leader, proxy *redistest.Proxy, errs *errorLog) {
	t.Helper()
	ctx := testCtx(t, hangGuard)
	proxy = redistest.NewProxy(t, b.addr)
	oc, errs := clientWithErrors(t, rdbAt(t, proxy.Addr()))
	ch, _ = observeAsync(t, oc.NewElection(name))
	e := b.client(t).NewElection(name)
	require.NoError(t, e.Campaign(ctx, "before"))
	assert.Equal(t, "before", next(t, ch, "the first leader").Value)
	require.NoError(t, e.Resign(ctx))
	proxy.SetBlackhole(true)
	return ch, proxy, errs
}

// TestElectionObserveCost: an observer that misses nothing sends no
// command per change: each change reaches it in the message that carries
// it. (Counted on the observer's own connection pool.)
func TestElectionObserveCost(t *testing.T) {
	// (Its count is of the observer's own connection pool's calls.)
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
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
// though the log it read before is gone; it says that terms between may
// have been missed.
func TestElectionObserveRestart(t *testing.T) {
	t.Parallel() // servers of its own, which it restarts (see TestMain)
	eachFreshBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		oc, errs := clientWithErrors(t, b.rdb(t))
		ch, _ := observeAsync(t, oc.NewElection(name))
		// (A lease that a loaded machine's pauses cannot end before the
		// restart, short enough for the loss to be found soon after it.)
		first := b.client(t).NewElection(name, WithLease(time.Second))
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
		// (It read the log, the message of the next leader naming no
		// previous record, before it sent that leader.)
		assert.Equal(t, 1, errs.count(errTermsDropped), "terms reported missed: %v", errs)
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

// electLogTerms is how many terms the log keeps at least (elect.lua's
// MAXLEN ~).
const electLogTerms = 1000

// TestElectionObserveCutOff: issue #36's "a slow reader may miss
// intermediate values but never a term", across a cut: an observer whose
// connection loses every message while several terms pass, each with many
// values (more publications than the log could hold when its cap counted
// publications), reads them from the log when it reconnects: every term,
// in order, with its last value, and nothing reported missed.
func TestElectionObserveCutOff(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		ch, proxy, errs := cutObserver(t, b, name)
		const terms, values = 4, 60
		want := runTerms(t, b, name, terms, values)
		assert.Equal(t, int64(terms+1), b.rdb(t).XLen(ctx, electKeysOf(name).log).Val(), "the log's entries: one per term")
		proxy.Heal()

		// (Should its connection have been renewed during the cut, it may
		// have seen earlier values of a term too: the last one counts.)
		var got []pub
		for len(got) < terms || got[len(got)-1] != want[terms-1] {
			l := next(t, ch, "a missed term")
			switch n := len(got); {
			case n > 0 && got[n-1].term == l.Term:
				got[n-1].value = l.Value
			case n > 0 && l.Term < got[n-1].term:
				t.Fatalf("term %d observed after term %d", l.Term, got[n-1].term)
			default:
				got = append(got, pub{l.Term, l.Value})
			}
		}
		assert.Equal(t, want, got, "the terms observed, each with its last value")
		assert.Zero(t, errs.count(errTermsDropped), "terms reported missed: %v", errs)
	})
}

// sharedBackend is the shared redis-server as a testBackend, for a test
// that runs on it alone.
func sharedBackend(t *testing.T) *testBackend {
	srv := redistest.Shared(t)
	return &testBackend{name: "redis-server", addr: srv.Addr(), srv: srv}
}

// pub is a publication: a term and its value.
type pub struct {
	term  int64
	value string
}

// publishDirect makes owner the holder of the election name (its field in
// the hash, written by the test) and publishes pubs in order through
// elect.lua itself, in pipelines: terms and values as the test chooses them,
// many at a time. It fails the test unless each answers its record's ID.
func publishDirect(t testing.TB, rdb *redis.Client, name, owner string, pubs []pub) {
	t.Helper()
	ctx := testCtx(t, hangGuard)
	k := electKeysOf(name)
	keys := []string{k.hash, k.fence, k.queue, k.record, k.log}
	channel := wire.ElectChannel(k.hash)
	require.NoError(t, rdb.HSet(ctx, k.hash, owner, 1).Err())
	sha, err := rdb.ScriptLoad(ctx, electScript.Src.(string)).Result()
	require.NoError(t, err)
	n := map[int64]int{}
	for len(pubs) > 0 {
		batch := pubs[:min(len(pubs), 500)]
		pubs = pubs[len(batch):]
		p := rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(batch))
		want := make([]string, len(batch))
		for i, x := range batch {
			cmds[i] = p.EvalSha(ctx, sha, keys, "p", owner, x.term, x.value, channel, "publish")
			n[x.term]++
			want[i] = fmt.Sprint(x.term, "-", n[x.term])
		}
		_, err := p.Exec(ctx)
		require.NoError(t, err)
		for i, c := range cmds {
			require.Equal(t, want[i], c.Val(), "publication %d of the batch", i)
		}
	}
}

// TestElectionLogTrim: the log holds one entry per term, and drops the
// oldest terms beyond its cap, however many values each term had: it keeps
// at least the latest electLogTerms terms (fewer than a stream node more:
// MAXLEN ~ trims whole nodes), an earlier term's entry its last value, the
// current term's its first (the record holds its latest).
func TestElectionLogTrim(t *testing.T) {
	// On the real server alone, in parallel: it checks how Redis trims a
	// stream, and its thousand script calls would keep miniredis's Lua
	// interpreter busy for seconds.
	t.Parallel()
	b := sharedBackend(t)
	ctx := testCtx(t, hangGuard)
	name := lockName(t)
	rdb := b.rdb(t)
	const terms = electLogTerms + 200 // (more than a node beyond the cap)
	// (Several values for some terms, one for the others.)
	values := func(term int64) int {
		if term%100 < 10 {
			return 3
		}
		return 1
	}
	var pubs []pub
	for term := int64(1); term <= terms; term++ {
		for v := 0; v < values(term); v++ {
			pubs = append(pubs, pub{term, fmt.Sprint(term, ".", v)})
		}
	}
	publishDirect(t, rdb, name, "trim.host.1:n1", pubs)

	k := electKeysOf(name)
	entries, err := rdb.XRange(ctx, k.log, "-", "+").Result()
	require.NoError(t, err)
	kept := int64(len(entries))
	assert.GreaterOrEqual(t, kept, int64(electLogTerms), "the terms kept")
	assert.Less(t, kept, int64(electLogTerms+100), "the terms kept")
	var got, want []string
	for _, en := range entries {
		rec := fmt.Sprint(en.Values["r"])
		got = append(got, en.ID+" "+rec[strings.LastIndexByte(rec, ' ')+1:])
	}
	for term := terms - kept + 1; term <= terms; term++ {
		n := values(term)
		if term == terms {
			n = 1 // (the current term's first: the record has its latest)
		}
		want = append(want, fmt.Sprint(term, "-", n, " ", term, ".", n-1))
	}
	sameEntries(t, want, got, "the log: one entry per term, the latest terms")
	rec, err := rdb.Get(ctx, k.record).Result()
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(rec, fmt.Sprint(terms, "-", values(terms), " ")), "the record %q: the latest", rec)
}

// sameEntries fails the test unless got is want, naming the first entry
// that differs (a log's thousand entries would not fit a message).
func sameEntries(t testing.TB, want, got []string, what string) {
	t.Helper()
	for i := 0; i < min(len(want), len(got)); i++ {
		if want[i] != got[i] {
			t.Errorf("%s: entry %d is %q, want %q (%d entries, want %d)", what, i, got[i], want[i], len(got), len(want))
			return
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d entries, want %d", what, len(got), len(want))
	}
}

// TestElectionObserveTermsDropped: an observer cut off while more terms
// began than the log keeps cannot see the oldest of them; it says so (an
// error to the error handler), then goes on from the oldest term the log
// holds, in order, never going back.
func TestElectionObserveTermsDropped(t *testing.T) {
	// On the real server alone, in parallel: it checks how Redis trims a
	// stream, and its thousand script calls would keep miniredis's Lua
	// interpreter busy for seconds.
	t.Parallel()
	b := sharedBackend(t)
	name := lockName(t)
	rdb := b.rdb(t)
	proxy := redistest.NewProxy(t, b.addr)
	oc, errs := clientWithErrors(t, rdbAt(t, proxy.Addr()))
	ch, _ := observeAsync(t, oc.NewElection(name))
	const owner = "dropped.host.1:n1"
	publishDirect(t, rdb, name, owner, []pub{{1, "seen"}})
	assert.Equal(t, "seen", next(t, ch, "the first term").Value)

	proxy.SetBlackhole(true)
	const terms = electLogTerms + 200 // (more than a node beyond the cap)
	var pubs []pub
	for term := int64(2); term <= terms; term++ {
		pubs = append(pubs, pub{term, fmt.Sprint(term)})
	}
	publishDirect(t, rdb, name, owner, pubs)
	oldest, err := rdb.XRange(testCtx(t, hangGuard), electKeysOf(name).log, "-", "+").Result()
	require.NoError(t, err)
	first, ok := wire.ParseLeaderID(oldest[0].ID)
	require.True(t, ok, oldest[0].ID)
	require.Greater(t, first.Term, int64(2), "the log's oldest term")
	proxy.Heal()

	errs.await(t, errTermsDropped, hangGuard, "the missed terms reported")
	for term := first.Term; term <= terms; term++ {
		l := next(t, ch, "a term after the cut")
		require.Equal(t, term, l.Term, "the term observed")
		require.Equal(t, fmt.Sprint(term), l.Value)
	}
}
