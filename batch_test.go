package remutex

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
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
	b := &c.be.(*node).batch
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, p := range b.queue {
		if p.state == pendQueued {
			out = append(out, scriptNames[p.cl.s.hash]+":"+fmt.Sprint(p.cl.keys[0]))
		}
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
	b := &c.be.(*node).batch
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// stall makes c's node busy: the call on a (sent alone, at once) and the call
// on b (the drainer's, sent alone too) are held by g, so that the calls made
// after it queue. It returns the two lock calls' results.
func stall(t *testing.T, c *Client, g *callGate, a, b *DistMutex) (ra, rb <-chan error) {
	t.Helper()
	ctx := testCtx(t, hangGuard)
	ca, cb := make(chan error, 1), make(chan error, 1)
	go func() { ca <- a.LockContext(ctx) }()
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
		check := b.rdb(t)
		if n := check.Exists(context.Background(), ms[2].spec.hash()).Val(); n != 0 {
			t.Errorf("the cancelled caller's grant: EXISTS %s got %d, want 0", ms[2].spec.hash(), n)
		}
		if ok, err := b.client(t).NewMutex(ms[2].spec.name).TryLockContext(testCtx(t, hangGuard)); !ok || err != nil {
			t.Errorf("TryLockContext of the cancelled caller's lock from another Client: got (%v, %v), want (true, nil)", ok, err)
		}
	})
}
