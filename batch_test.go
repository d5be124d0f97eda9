package remutex

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
	"github.com/remutex/remutex/internal/transport"
)

// Tests of the coalescing of concurrent script calls (batch.go). A callGate
// holds chosen calls back inside go-redis, so that the calls made meanwhile
// queue, and every step is awaited: which calls share a pipeline is then
// known, not hoped for.

// callGate is a go-redis hook. It holds back, once each, the single script
// calls on the keys in hold and, while holdPipes is set, every pipeline of
// script calls, until
// open (pipeOpen) is closed; and it records every script call sent as
// "script:first key", per pipeline too.
type callGate struct {
	hold      map[string]bool // first keys of single calls to hold once
	holdPipes atomic.Bool
	held      chan string   // the first key of each call held, "pipeline" for a pipeline
	open      chan struct{} // closed: let the single calls held through
	pipeOpen  chan struct{} // closed: let the pipeline held through

	mu    sync.Mutex
	pipes [][]string // per pipeline sent, its script calls
	seen  []string   // every script call sent, single or pipelined
}

func newCallGate(hold ...string) *callGate {
	g := &callGate{hold: map[string]bool{}, held: make(chan string, 16),
		open: make(chan struct{}), pipeOpen: make(chan struct{})}
	for _, k := range hold {
		g.hold[k] = true
	}
	return g
}

// callName is how a gate records a script call: "script:first key".
func callName(cmd redis.Cmder) string {
	name, keys := scriptCall(cmd)
	if len(keys) == 0 {
		return ""
	}
	return name + ":" + keys[0]
}

// queuedName is callName for a call not sent yet.
func queuedName(cl transport.QueuedCall) string {
	if cl.Script == nil {
		name, keys := plainRelease(cl.Args)
		return name + ":" + keys[0]
	}
	return scriptNames[cl.Script.Hash()] + ":" + fmt.Sprint(cl.Keys[0])
}

func (g *callGate) hook() redis.Hook {
	return hookFuncs{
		process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if _, keys := scriptCall(cmd); len(keys) > 0 {
				g.mu.Lock()
				g.seen = append(g.seen, callName(cmd))
				hold := g.hold[keys[0]]
				delete(g.hold, keys[0])
				g.mu.Unlock()
				if hold {
					g.held <- keys[0]
					<-g.open
				}
			}
			return next(ctx, cmd)
		},
		pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			var calls []string
			for _, cmd := range cmds {
				if c := callName(cmd); c != "" {
					calls = append(calls, c)
				}
			}
			g.mu.Lock()
			g.pipes = append(g.pipes, calls)
			g.seen = append(g.seen, calls...)
			g.mu.Unlock()
			if len(calls) > 0 && g.holdPipes.Load() {
				g.held <- "pipeline"
				<-g.pipeOpen
			}
			return next(ctx, cmds)
		},
	}
}

// sent reports whether a script call ("script:key") was sent.
func (g *callGate) sent(call string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Contains(g.seen, call)
}

// pipeWith returns the calls of the first pipeline that carried call, sorted.
func (g *callGate) pipeWith(call string) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range g.pipes {
		if slices.Contains(p, call) {
			p = slices.Clone(p)
			slices.Sort(p)
			return p
		}
	}
	return nil
}

// queuedCalls returns the calls waiting in c's queue whose callers still
// wait, as "script:first key", sorted.
func queuedCalls(c *Client) []string {
	var out []string
	for _, cl := range transport.Queued(c.be, false) {
		out = append(out, queuedName(cl))
	}
	slices.Sort(out)
	return out
}

// calls returns "script:hash key" of each of ms, sorted.
func calls(script string, ms ...*DistMutex) []string {
	var out []string
	for _, m := range ms {
		out = append(out, script+":"+m.spec.hash())
	}
	slices.Sort(out)
	return out
}

// queued is the number of calls waiting in the Client's queue (some may be
// given up and no longer waited for).
func queued(c *Client) int {
	return len(transport.Queued(c.be, true))
}

// awaitIdle waits until c's node has no call in flight or queued (posted
// calls included).
func awaitIdle(t testing.TB, c *Client) {
	t.Helper()
	waitFor(t, "the node idle (no call queued or in flight)", func() bool { return transport.Idle(c.be) })
}

// settled waits until the calls that the waits of c given up posted to
// leave the queue (see postCtx) have been sent: until then the queue may
// still show their entries.
func settled(t testing.TB, c *Client) { t.Helper(); awaitIdle(t, c) }

// stall makes c's node busy: the call on a (a Lock, without context: sent
// alone, at once, on its goroutine) and the call on b (a LockContext: the
// drainer's, sent alone too) are held by g, so that the calls made after
// them queue. It returns the two lock calls' results.
func stall(t *testing.T, c *Client, g *callGate, a, b *DistMutex) (ra, rb <-chan error) {
	t.Helper()
	ctx := testCtx(t, hangGuard)
	awaitIdle(t, c)
	ca, cb := make(chan error, 1), make(chan error, 1)
	go func() { a.Lock(); ca <- nil }() // no context: sent alone, on its goroutine
	if got := await(t, g.held, "the first call to be held"); got != a.spec.hash() {
		t.Fatalf("held a call on %s, want %s", got, a.spec.hash())
	}
	go func() { cb <- b.LockContext(ctx) }()
	if got := await(t, g.held, "the drainer's call to be held"); got != b.spec.hash() {
		t.Fatalf("held a call on %s, want %s", got, b.spec.hash())
	}
	return ca, cb
}

// lockAll starts LockContext on each of ms, each with a context of its own,
// and waits until all of them are queued in c behind a stall.
func lockAll(t *testing.T, c *Client, ms []*DistMutex) (cancels []context.CancelFunc, res []chan error) {
	t.Helper()
	for _, m := range ms {
		ctx, cancel := context.WithCancel(testCtx(t, hangGuard))
		t.Cleanup(cancel)
		ch := make(chan error, 1)
		go func() { ch <- m.LockContext(ctx) }()
		cancels, res = append(cancels, cancel), append(res, ch)
	}
	waitFor(t, fmt.Sprintf("%d calls queued", len(ms)), func() bool { return queued(c) == len(ms) })
	return cancels, res
}

func mutexes(c *Client, base string, n int) []*DistMutex {
	ms := make([]*DistMutex, n)
	for i := range ms {
		ms[i] = c.NewMutex(fmt.Sprintf("%s-%d", base, i))
	}
	return ms
}

// TestBatchCancel cancels batched callers: two while their calls are queued
// (the calls are never sent) and one while its call is in a pipeline on its
// way (the pipeline goes on for the others, and what the call acquired is
// given back). Each call returns at once: its LockContext goes on to leave
// the queue (as for any call cut off by its context), which the test sees
// queued while the pipeline is still held.
func TestBatchCancel(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		rdb := b.rdb(t)
		c := clientOn(t, rdb)
		a, bm := c.NewMutex(name+"-a"), c.NewMutex(name+"-b")
		g := newCallGate(a.spec.hash(), bm.spec.hash())
		rdb.AddHook(g.hook())
		ra, rb := stall(t, c, g, a, bm)
		ms := mutexes(c, name+"-q", 6)
		cancels, res := lockAll(t, c, ms)

		cancels[0]() // queued: never sent
		cancels[1]()
		want := append(calls("acquire", ms[2:]...), calls("leave", ms[:2]...)...)
		slices.Sort(want)
		waitFor(t, "the cancelled callers to return from their calls and queue leave", func() bool {
			return slices.Equal(queuedCalls(c), want)
		})
		g.holdPipes.Store(true)
		close(g.open)
		for _, r := range []<-chan error{ra, rb} {
			if err := await(t, r, "the held calls' LockContext"); err != nil {
				t.Fatalf("LockContext of a held call: got %v, want nil", err)
			}
		}
		await(t, g.held, "the pipeline of the queued calls to be held")
		cancels[2]() // its call is in the pipeline: it may be applied
		waitFor(t, "the caller cancelled in flight to return from its call and queue leave", func() bool {
			return slices.Equal(queuedCalls(c), calls("leave", ms[2]))
		})
		g.holdPipes.Store(false)
		close(g.pipeOpen)
		for i, r := range res {
			err := await(t, r, "every batched LockContext")
			if i < 3 && !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled LockContext %d: got %v, want context.Canceled", i, err)
			}
			if i >= 3 && err != nil {
				t.Errorf("LockContext %d, batched with cancelled ones: got %v, want nil", i, err)
			}
		}

		if got := g.pipeWith("acquire:" + ms[3].spec.hash()); !slices.Equal(got, want) {
			t.Errorf("pipeline: got %q, want %q", got, want)
		}
		for _, call := range calls("acquire", ms[:2]...) {
			if g.sent(call) {
				t.Errorf("%s was sent after its caller gave up while it was queued", call)
			}
		}
		settled(t, c) // the leave of the caller cancelled in flight is posted: sent after the others
		check := b.rdb(t)
		if n := check.Exists(context.Background(), ms[2].spec.hash()).Val(); n != 0 {
			t.Errorf("the cancelled caller's grant: EXISTS %s got %d, want 0", ms[2].spec.hash(), n)
		}
		if ok, err := b.client(t).NewMutex(ms[2].spec.name).TryLockContext(testCtx(t, hangGuard)); !ok || err != nil {
			t.Errorf("TryLockContext of the cancelled caller's lock from another Client: got (%v, %v), want (true, nil)", ok, err)
		}
	})
}

// TestBatchReleasesLookTogether: the uncontended releases of several
// goroutines sent in one round ask whether anybody waits with one EXISTS of
// all their queues; one of the locks has a waiter, so the releases ask
// again one by one, and that waiter is handed the lock.
func TestBatchReleasesLookTogether(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		const n = 4
		name := lockName(t)
		rdb := b.rdb(t)
		var mu sync.Mutex
		var looks []int // the keys of each EXISTS sent
		rdb.AddHook(hookFuncs{pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			for _, cmd := range cmds {
				if args := cmd.Args(); strings.EqualFold(fmt.Sprint(args[0]), "exists") {
					mu.Lock()
					looks = append(looks, len(args)-1)
					mu.Unlock()
				}
			}
			return next(ctx, cmds)
		}})
		c := clientOn(t, rdb)
		a, bm := c.NewMutex(name+"-a"), c.NewMutex(name+"-b")
		g := newCallGate(a.spec.hash(), bm.spec.hash())
		rdb.AddHook(g.hook())
		ms := make([]*DistMutex, n)
		for i := range ms {
			ms[i] = c.NewMutex(fmt.Sprintf("%s-%d", name, i), NonReentrant()) // unlocked by other goroutines
			ms[i].Lock()
		}
		k := keysOf(ms[0].spec.name)
		w := goLock(t, b.client(t).NewMutex(ms[0].spec.name))
		awaitInQueue(t, rdb, k.queue, 1)

		ra, rb := stall(t, c, g, a, bm)
		res := make(chan error, n)
		for _, m := range ms {
			go func() { res <- m.UnlockContext(testCtx(t, hangGuard)) }()
		}
		waitFor(t, "the releases queued", func() bool { return queued(c) == n })
		mu.Lock()
		looks = nil
		mu.Unlock()
		close(g.open)
		for _, r := range []<-chan error{ra, rb} {
			require.NoError(t, await(t, r, "the held calls' Lock"))
		}
		for range ms {
			assert.NoError(t, await(t, res, "UnlockContext"))
		}
		require.NoError(t, await(t, w.locked, "the waiter to be handed the lock"))
		mu.Lock()
		got := slices.Clone(looks)
		mu.Unlock()
		assert.Equal(t, []int{n, 1, 1, 1, 1}, got, "keys of the EXISTS sent: one for all, then one each (a lock has a waiter)")
		w.release()
		require.NoError(t, await(t, w.unlocked, "the waiter's UnlockContext"))
	})
}

// tryAll starts TryLockContext on each of ms and returns the results.
func tryAll(t *testing.T, ms []*DistMutex) []chan tryResult {
	t.Helper()
	ctx := testCtx(t, hangGuard)
	res := make([]chan tryResult, len(ms))
	for i, m := range ms {
		res[i] = make(chan tryResult, 1)
		go func() {
			ok, err := m.TryLockContext(ctx)
			res[i] <- tryResult{ok, err}
		}()
	}
	return res
}

type tryResult struct {
	ok  bool
	err error
}

// TestBatchErrorsPerCall sends, in one pipeline, a TryLock whose script the
// server no longer has (SCRIPT FLUSH, then only quick_lock.lua loaded
// again), of a lock another Client holds, followed by TryLocks of a free
// lock and a key of another type and an uncontended release: each caller
// gets its own outcome; the first call is resent with EVAL, and the calls
// after it again (with EVALSHA), so that they take effect in the order
// they were made.
func TestBatchErrorsPerCall(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		rdb := b.rdb(t)
		c := clientOn(t, rdb)
		a, bm := c.NewMutex(name+"-a"), c.NewMutex(name+"-b")
		free, busy, bad := c.NewMutex(name+"-free"), c.NewMutex(name+"-busy"), c.NewMutex(name+"-bad")
		heldM := c.NewMutex(name + "-held")
		// (Locks that share a slot of the Client's contention marks would be
		// sent the full scripts with busy, or with bad, which its TryLock
		// marks contended: the held lock's release would then hand off, HDEL
		// and wake.lua, not HDEL and EXISTS.)
		shares := func(m *DistMutex, others ...*DistMutex) bool {
			return slices.ContainsFunc(others, func(o *DistMutex) bool { return m.spec.Quick.Until == o.spec.Quick.Until })
		}
		for i := 0; shares(busy, free, bad); i++ {
			busy = c.NewMutex(fmt.Sprintf("%s-busy%d", name, i))
		}
		for i := 0; shares(heldM, busy, bad); i++ {
			heldM = c.NewMutex(fmt.Sprintf("%s-held%d", name, i))
		}
		check := b.rdb(t)
		if err := check.Set(ctx, bad.spec.hash(), "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := b.client(t).NewMutex(busy.spec.name).LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		held := lockAsync(t, heldM, nil, "")
		if r := await(t, held.locked, "LockContext of the lock to release"); r.err != nil {
			t.Fatal(r.err)
		}
		g := newCallGate(a.spec.hash(), bm.spec.hash())
		rdb.AddHook(g.hook())
		ra, rb := stall(t, c, g, a, bm)
		for _, cmd := range [][]interface{}{{"script", "flush"}, {"script", "load", quickLock.Src}} {
			if err := check.Do(ctx, cmd...).Err(); err != nil {
				t.Fatalf("%v: %v", cmd[:2], err)
			}
		}
		// First in the queue, a call whose script the server lost
		// (acquire.lua: the lock was seen contended); its NOSCRIPT resends
		// the rest.
		busy.spec.Quick.Contended()
		res := tryAll(t, []*DistMutex{busy})
		waitFor(t, "the first call queued", func() bool { return slices.Equal(queuedCalls(c), calls("acquire", busy)) })
		res = append(res, tryAll(t, []*DistMutex{free, bad})...)
		release := "release:" + heldM.spec.hash()
		held.unlock()
		want := append(calls("acquire", free, busy, bad), release)
		slices.Sort(want)
		waitFor(t, "the calls queued", func() bool { return slices.Equal(queuedCalls(c), want) })
		close(g.open)

		for _, r := range []<-chan error{ra, rb} {
			if err := await(t, r, "the held calls' LockContext"); err != nil {
				t.Fatalf("LockContext of a held call: got %v, want nil", err)
			}
		}
		if r := await(t, res[1], "TryLockContext of a free lock"); !r.ok || r.err != nil {
			t.Errorf("TryLockContext of a free lock: got (%v, %v), want (true, nil)", r.ok, r.err)
		}
		if r := await(t, res[0], "TryLockContext of a held lock"); r.ok || r.err != nil {
			t.Errorf("TryLockContext of a lock held by another Client: got (%v, %v), want (false, nil)", r.ok, r.err)
		}
		var wt *WrongTypeError
		if r := await(t, res[2], "TryLockContext of a key of another type"); r.ok || !errors.As(r.err, &wt) {
			t.Errorf("TryLockContext of a key of another type: got (%v, %v), want (false, *WrongTypeError)", r.ok, r.err)
		}
		if err := await(t, held.unlocked, "UnlockContext"); err != nil {
			t.Errorf("UnlockContext, its script flushed: got %v, want nil", err)
		}
		if got := g.pipeWith(want[0]); !slices.Equal(got, want) {
			t.Errorf("pipeline: got %q, want %q", got, want)
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, call := range want {
			// The others: quick_lock.lua, sent again after the first call,
			// then acquire.lua (the free lock's own field makes
			// quick_lock.lua answer "not free" the second time, and a
			// caller gets the reply of the last application); the
			// release's HDEL twice (its caller gets the first reply: the
			// second finds nothing).
			n := 3
			switch call {
			case "acquire:" + busy.spec.hash():
				n = 2 // EVALSHA, NOSCRIPT, EVAL
			case release:
				n = 2
			}
			if got := countOf(g.seen, call); got != n {
				t.Errorf("%s sent %d times, want %d (seen %q)", call, got, n, g.seen)
			}
		}
	})
}

func countOf(s []string, v string) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

// TestBatchManyGoroutines runs 64 goroutines of two Clients on 8 locks, 8
// goroutines to a lock, each locking again and again: critical sections
// never overlap and fences only rise, with calls coalesced all the while.
// On miniredis, whose scripts run slowly under the race detector, half as
// many: there a loaded machine can delay a queue grant's renewal past its
// claim lease, and a lost hold ends a goroutine's rounds early.
func TestBatchManyGoroutines(t *testing.T) {
	// Serial: 64 goroutines hammering keep a core busy, and each hand-off's
	// 750ms claim must be met.
	const locks, rounds = 8, 8
	eachBackend(t, func(t *testing.T, b *testBackend) {
		goroutines := 4
		if !b.real() {
			goroutines = 2
		}
		ctx := testCtx(t, hangGuard)
		var piped atomic.Int64
		count := hookFuncs{pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			if n := len(cmds); n > 1 {
				if name, _ := scriptCall(cmds[0]); name != "" {
					piped.Add(1)
				}
			}
			return next(ctx, cmds)
		}}
		var clients [2]*Client
		for i := range clients {
			rdb := b.rdb(t)
			rdb.AddHook(count)
			clients[i] = clientOn(t, rdb)
		}
		name := lockName(t)
		errc := make(chan error, locks)
		regs := make([]*redistest.Register, locks)
		for l := range locks {
			regs[l] = redistest.NewRegister(t)
			ms := []*DistMutex{clients[0].NewMutex(fmt.Sprint(name, l), WithFencing()),
				clients[1].NewMutex(fmt.Sprint(name, l), WithFencing())}
			go func() { errc <- hammer(ctx, regs[l], ms, goroutines, rounds) }()
		}
		for range locks {
			if err := await(t, errc, "the goroutines of a lock"); err != nil {
				t.Error(err)
			}
		}
		for _, reg := range regs {
			reg.CheckSections(t, 2*goroutines*rounds)
		}
		if piped.Load() == 0 {
			t.Errorf("pipelines of several script calls: got none, want some (64 goroutines calling at once)")
		}
	})
}

// testClusterBatch sends one batch of Locks on every master of a cluster
// (two locks on each, in different slots): each lock is taken on the master
// that serves its slot, then all are released in another batch.
func testClusterBatch(t *testing.T, tc *redistest.Cluster) {
	ctx := testCtx(t, hangGuard)
	prefix := topoPrefix(t)
	rdb := tc.Client(t)
	c := clientOn(t, rdb, WithKeyPrefix(prefix))
	a, bm := c.NewMutex(nameOn(t, tc, tc.Masters[0], prefix, "a")), c.NewMutex(nameOn(t, tc, tc.Masters[1], prefix, "b"))
	g := newCallGate(a.spec.hash(), bm.spec.hash())
	rdb.AddHook(g.hook())
	ra, rb := stall(t, c, g, a, bm)
	var ms []*DistMutex
	for i, n := range tc.Masters {
		for _, base := range []string{"x", "y"} {
			name := nameOn(t, tc, n, prefix, fmt.Sprint(base, i, "-"))
			ms = append(ms, c.NewMutex(name))
		}
	}
	var holds []*asyncLock
	for _, m := range ms {
		holds = append(holds, lockAsync(t, m, nil, ""))
	}
	want := calls("acquire", ms...)
	waitFor(t, "the Locks queued", func() bool { return slices.Equal(queuedCalls(c), want) })
	close(g.open)
	for _, r := range []<-chan error{ra, rb} {
		if err := await(t, r, "the held calls' LockContext"); err != nil {
			t.Fatalf("LockContext of a held call: got %v, want nil", err)
		}
	}
	for i, h := range holds {
		if r := await(t, h.locked, "a batched LockContext"); r.err != nil {
			t.Fatalf("LockContext(%q): got %v, want nil", ms[i].Name(), r.err)
		}
	}
	if got := g.pipeWith(want[0]); !slices.Equal(got, want) {
		t.Errorf("pipeline: got %q, want %q", got, want)
	}
	for _, m := range ms {
		owner := tc.Owner(t, tc.Masters[0], keySlot(m.spec.hash()))
		if n := owner.RDB.Exists(ctx, m.spec.hash()).Val(); n != 1 {
			t.Errorf("lock %q on %v, which serves its slot: EXISTS got %d, want 1", m.Name(), owner, n)
		}
	}
	for _, h := range holds {
		h.unlock()
	}
	for i, h := range holds {
		if err := await(t, h.unlocked, "a batched UnlockContext"); err != nil {
			t.Errorf("UnlockContext(%q): got %v, want nil", ms[i].Name(), err)
		}
		if n := rdb.Exists(ctx, ms[i].spec.hash()).Val(); n != 0 {
			t.Errorf("lock %q after UnlockContext: EXISTS got %d, want 0", ms[i].Name(), n)
		}
	}
}
