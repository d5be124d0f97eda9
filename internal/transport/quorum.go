package transport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/wire"
)

// NewQuorum returns the backend of a quorum of independent servers, rdbs
// (at least three, none nil: the root checks), each a node whose queue
// only wakes waiters: a grant on one server is not a majority's.
func NewQuorum(cfg Config, rdbs []redis.UniversalClient) Backend {
	q := &quorum{majority: len(rdbs)/2 + 1, nodes: make([]*node, len(rdbs))}
	for i, rdb := range rdbs {
		q.nodes[i] = newNode(cfg, rdb, false)
	}
	return q
}

// quorum is the backend of NewQuorumClient: the same scripts on every node,
// decided by a majority.
type quorum struct {
	nodes    []*node
	majority int
	bg       sync.WaitGroup // calls still running after a decision; joined by close
	mu       sync.Mutex
	closed   bool // set by close before it waits for bg: no fan-out starts after
}

// (A quorum's servers are many: one refusing is no answer.)
func (q *quorum) Refusal() <-chan struct{} { return nil }
func (q *quorum) Refused() error           { return nil }

func (q *quorum) Grants() bool      { return false }
func (q *quorum) FreshOwners() bool { return true }
func (q *quorum) Acked() bool       { return false }
func (q *quorum) Exact() bool       { return false }

// errNotExact answers the calls that only an exact backend serves: the
// kinds that make them refuse a quorum Client at construction.
var errNotExact = errors.New("remutex: a quorum Client does not serve this call")

func (q *quorum) Script(context.Context, *Spec, *Script, ...interface{}) (interface{}, error) {
	return nil, errNotExact
}

func (q *quorum) Get(context.Context, ...interface{}) ([]interface{}, error) { return nil, errNotExact }

// answer is one node's reply in a fan-out.
type answer[T any] struct {
	v   T
	err error
}

// errNoAnswer stands for a node that had not answered when a fan-out was
// decided.
var errNoAnswer = errors.New("no answer yet")

// minGrace is the least a fan-out waits for the other servers once a
// majority answered without settling the question: enough for a healthy
// server a little farther away, or one that needs a new connection; short
// against a lease.
const minGrace = 50 * time.Millisecond

// indexed is a node's answer with the node's index.
type indexed[T any] struct {
	i int
	a answer[T]
}

// fanOut calls f on every node at once and returns as soon as decided says
// the answers so far settle the question, all answered, or the others took
// much longer than the majority (see minGrace), so that a dead, paused or
// slow server does not hold up a majority. Answers are in node order; a node
// that has not answered has errNoAnswer. Calls still running continue in the
// background, joined by close, and hand their answer to late if it is not nil.
func fanOut[T any](q *quorum, f func(*node) (T, error), decided func([]answer[T]) bool, late func(*node, answer[T])) []answer[T] {
	ch := make(chan indexed[T], len(q.nodes))
	var mu sync.Mutex
	finished := false
	if !q.start() {
		got := make([]answer[T], len(q.nodes))
		for i := range got {
			got[i].err = ErrClosed
		}
		return got
	}
	for i, n := range q.nodes {
		go func() {
			defer q.bg.Done()
			v, err := f(n)
			mu.Lock()
			if !finished {
				ch <- indexed[T]{i, answer[T]{v, err}} // buffered for every node: never blocks
				mu.Unlock()
				return
			}
			mu.Unlock()
			if late != nil {
				late(n, answer[T]{v, err})
			}
		}()
	}
	got := gather(len(q.nodes), q.majority, ch, decided)
	mu.Lock()
	finished = true
	mu.Unlock()
	for {
		select {
		case x := <-ch: // answered after the decision, before finished was set
			if late != nil {
				late(q.nodes[x.i], x.a)
			}
		default:
			return got
		}
	}
}

// gather collects n answers from ch until decided says they settle the
// question, all came, or a majority answered and the others took twice as
// long as that (at least minGrace): a server that does not answer (paused,
// partitioned) then counts as failed instead of holding the caller up until
// its client's read timeout.
func gather[T any](n, majority int, ch <-chan indexed[T], decided func([]answer[T]) bool) []answer[T] {
	got := make([]answer[T], n)
	for i := range got {
		got[i].err = errNoAnswer
	}
	start := time.Now()
	var grace <-chan time.Time
	for answered := 0; answered < n; {
		select {
		case x := <-ch:
			answered++
			got[x.i] = x.a
			if decided(got) {
				return got
			}
			if answered == majority {
				t := time.NewTimer(max(2*time.Since(start), minGrace))
				defer t.Stop()
				grace = t.C
			}
		case <-grace:
			return got
		}
	}
	return got
}

// acquireVotes counts a fan-out of acquire replies.
type acquireVotes struct {
	granted, lost, busy, pending int
	fence, wait                  int64
	permanent, last              error
}

func countAcquire(as []answer[Reply]) (v acquireVotes) {
	for _, a := range as {
		switch {
		case a.err == errNoAnswer:
			v.pending++
		case a.err != nil:
			v.last = a.err
			if !Transient(a.err) {
				v.permanent = a.err
			}
		case a.v.Code == wire.Granted:
			v.granted++
			v.fence = max(v.fence, a.v.Val)
		case a.v.Code == wire.Lost:
			v.lost++
		default:
			v.busy++
			v.wait = max(v.wait, a.v.Val)
		}
	}
	return v
}

// giveBack gives back what a failed try may have got on a minority of
// servers, so that it blocks nobody: every server that granted it, or
// failed to answer (the call may have been applied), including answers that
// arrive after the try was decided.
type giveBack struct {
	mu     sync.Mutex
	failed bool
	held   bool    // the try won a majority
	late   []*node // granted (or unknown) after the decision
	queued []*node // queued the caller after the decision, before it was known
}

// grantedLate takes an answer that came after the decision and may hold
// the lock: given back at once if the try failed, else kept until it is
// known.
func (g *giveBack) grantedLate(ctx context.Context, nd *node, s *Spec, owner interface{}) {
	g.mu.Lock()
	failed := g.failed
	if !failed {
		g.late = append(g.late, nd)
	}
	g.mu.Unlock()
	if failed {
		PostRelease(ctx, nd, s, owner, "0")
	}
}

// queuedLate takes an answer that came after the decision and queued the
// caller: its entry is left at once if the try won, else kept (the waiter
// goes on waiting in it).
func (g *giveBack) queuedLate(ctx context.Context, nd *node, s *Spec, r AcquireReq) {
	g.mu.Lock()
	held := g.held
	if !held && !g.failed {
		g.queued = append(g.queued, nd)
	}
	g.mu.Unlock()
	if held {
		postLeave(ctx, nd, s, r)
	}
}

// hold leaves the queues of the servers where a try that won a majority
// was queued instead: an entry left there would stay ahead of the waiters
// behind it for as long as its Client listens (a quorum's queue only wakes
// its head, and a woken Client that no longer waits in that entry takes
// nothing).
func (g *giveBack) hold(ctx context.Context, q *quorum, as []answer[Reply], s *Spec, r AcquireReq) {
	g.mu.Lock()
	g.held = true
	queued := g.queued
	g.mu.Unlock()
	for i, a := range as {
		if queuedIn(a) {
			queued = append(queued, q.nodes[i])
		}
	}
	for _, nd := range queued {
		postLeave(ctx, nd, s, r)
	}
}

// queuedIn reports whether a server's answer says it queued the caller.
func queuedIn(a answer[Reply]) bool {
	return a.err == nil && a.v.Code == wire.Queued
}

// postLeave posts the leave of r's queue entry on nd (see postCtx).
func postLeave(ctx context.Context, nd *node, s *Spec, r AcquireReq) {
	_ = nd.Leave(PostCtx(ctx, max(s.Lease, time.Second)), s, r.Owner, strings.TrimPrefix(r.Entry, "+"))
}

// fail gives back every grant of a try that failed.
func (g *giveBack) fail(ctx context.Context, q *quorum, as []answer[Reply], s *Spec, owner interface{}) {
	g.mu.Lock()
	g.failed = true
	late := g.late
	g.mu.Unlock()
	for i, a := range as {
		if mayHold(a) && a.err != errNoAnswer {
			late = append(late, q.nodes[i])
		}
	}
	for _, nd := range late {
		PostRelease(ctx, nd, s, owner, "0") // queued at once, on no one's time
	}
}

// mayHold reports whether a server's answer leaves the try's owner
// possibly holding the lock there: it granted, or its answer was lost.
func mayHold(a answer[Reply]) bool {
	return a.err != nil || a.v.Code == wire.Granted
}

func (q *quorum) Acquire(ctx context.Context, s *Spec, r AcquireReq) (Reply, error) {
	if r.Fence == FenceOn {
		r.Fence = FenceFresh // every server draws a new token; see acquire.lua
	}
	// The entry once, for every server and for what follows the decision,
	// which may come after the attempt moved on.
	r.Entry = r.entryArg(s)
	first := r.Have == 0
	var g giveBack
	as := fanOut(q, func(nd *node) (Reply, error) { return nd.Acquire(ctx, s, r) },
		func(as []answer[Reply]) bool {
			v := countAcquire(as)
			return v.granted >= q.majority || v.granted+v.pending < q.majority
		},
		func(nd *node, a answer[Reply]) {
			switch {
			case first && mayHold(a):
				g.grantedLate(ctx, nd, s, r.Owner)
			case first && queuedIn(a):
				g.queuedLate(ctx, nd, s, r)
			}
		})
	v := countAcquire(as)
	if v.granted >= q.majority && (!first || r.Fence == FenceOff) {
		if first {
			g.hold(ctx, q, as, s, r)
		}
		return Reply{Code: wire.Granted, Val: v.fence}, nil
	}
	if v.granted >= q.majority {
		if v.last = q.raiseFence(ctx, s, v.fence); v.last == nil {
			g.hold(ctx, q, as, s, r)
			return Reply{Code: wire.Granted, Val: v.fence}, nil
		}
	}
	if first {
		g.fail(ctx, q, as, s, r.Owner)
	}
	switch {
	case !first && v.lost > len(q.nodes)-q.majority:
		return Reply{Code: wire.Lost}, nil
	case v.permanent != nil:
		return Reply{}, v.permanent
	case v.busy > 0 && first:
		return Reply{Code: wire.Queued, Val: v.wait, Split: v.granted > 0}, nil
	}
	return Reply{}, fmt.Errorf("%w: %d of %d granted (%v)", ErrNoQuorum, v.granted, len(q.nodes), v.last)
}

// raiseFence writes token back to the fence counters (never lowering them)
// and succeeds when a majority took it.
func (q *quorum) raiseFence(ctx context.Context, s *Spec, token int64) error {
	ok := func(as []answer[interface{}]) (k int) {
		for _, a := range as {
			if a.err == nil {
				k++
			}
		}
		return k
	}
	as := fanOut(q, func(n *node) (interface{}, error) {
		return n.evalOn(ctx, s.KeyArgs[1:2], RaiseScript, token)
	}, func(as []answer[interface{}]) bool { return ok(as) >= q.majority }, nil)
	if got := ok(as); got < q.majority {
		return fmt.Errorf("%w: fence raised on %d of %d", ErrNoQuorum, got, len(q.nodes))
	}
	return nil
}

// release releases on every server: released when a majority released, not
// held when no majority can have held it.
func (q *quorum) Release(ctx context.Context, s *Spec, owner interface{}, want int, lease interface{}) (int64, error) {
	count := func(as []answer[int64]) (ok, notHeld, pending int, last error) {
		for _, a := range as {
			switch {
			case a.err == errNoAnswer:
				pending++
			case a.err != nil:
				last = a.err
			case a.v == wire.NotHeld:
				notHeld++
			default:
				ok++
			}
		}
		return ok, notHeld, pending, last
	}
	// A final release waits for every server that answers in time (each
	// must free its key, so that the next acquisition finds them all free);
	// a nested one only for a majority.
	as := fanOut(q, func(n *node) (int64, error) { return n.Release(ctx, s, owner, want, lease) },
		func(as []answer[int64]) bool {
			ok, notHeld, _, _ := count(as)
			return want > 0 && (ok >= q.majority || notHeld > len(q.nodes)-q.majority)
		}, nil)
	ok, notHeld, pending, last := count(as)
	switch {
	case ok >= q.majority:
		return wire.Done, nil
	case notHeld > len(q.nodes)-q.majority:
		return wire.NotHeld, nil
	case ok+pending >= q.majority:
		// The servers that did not answer in time still get the call (it
		// runs on in the background): asking them again could only find
		// the fields gone and misreport the hold as lost.
		return wire.Done, nil
	}
	return 0, fmt.Errorf("%w: %d of %d released (%v)", ErrNoQuorum, ok, len(q.nodes), last)
}

// leave removes a waiter's entries everywhere, best effort.
func (q *quorum) Leave(ctx context.Context, s *Spec, owner interface{}, entry string) error {
	as := fanOut(q, func(n *node) (struct{}, error) { return struct{}{}, n.Leave(ctx, s, owner, entry) },
		func([]answer[struct{}]) bool { return false }, nil)
	for _, a := range as {
		if a.err != nil && a.err != errNoAnswer {
			return a.err
		}
	}
	return nil
}

// renew renews holds on every server: renewed where a majority renewed, lost
// where no majority can have it.
func (q *quorum) Renew(ctx context.Context, items []RenewItem) []int64 {
	tally := func(as []answer[[]int64]) ([]int64, bool) {
		res := make([]int64, len(items))
		settled := true
		for i := range items {
			var ok, no int
			for _, a := range as {
				if a.err == nil {
					switch a.v[i] {
					case 1:
						ok++
					case 0:
						no++
					}
				}
			}
			switch {
			case ok >= q.majority:
				res[i] = 1
			case no > len(q.nodes)-q.majority:
				res[i] = 0
			default:
				res[i] = -1
				settled = false
			}
		}
		return res, settled
	}
	// The watchdog cancels ctx once the majority decided: the calls to the
	// other servers must still renew there, or the hold would live on the
	// fastest majority only and no longer survive the loss of a minority.
	ctx = context.WithoutCancel(ctx)
	as := fanOut(q, func(n *node) ([]int64, error) { return n.Renew(ctx, items), nil },
		func(as []answer[[]int64]) bool { _, settled := tally(as); return settled }, nil)
	res, _ := tally(as)
	return res
}

// watch, unwatch, ready, polling and close manage the waiters'
// subscriptions on every node.
func (q *quorum) Watch(channel string, create bool) bool {
	if !create {
		return false
	}
	for _, n := range q.nodes {
		n.Watch(channel, true)
	}
	return true
}

func (q *quorum) Unwatch(channel string) {
	for _, n := range q.nodes {
		n.Unwatch(channel)
	}
}

// ready returns a closed channel once a majority of nodes deliver the
// channel's messages. A release publishes on every server it releases on,
// and a hold lives on at least a majority, so any majority of subscriptions
// hears it; fewer may all be on servers the hold never had. Until then it
// returns the ready channel of a node still missing.
func (q *quorum) Ready(channel string) <-chan struct{} {
	need := q.majority
	var missing <-chan struct{}
	for _, n := range q.nodes {
		r := n.Ready(channel)
		if !IsClosed(r) {
			if missing == nil {
				missing = r
			}
			continue
		}
		if need--; need == 0 {
			return r
		}
	}
	return missing
}

func (q *quorum) Polling() bool {
	for _, n := range q.nodes {
		if n.Polling() {
			return true
		}
	}
	return false
}

// start counts a fan-out's calls in bg, unless the quorum is closed: a
// waiter that gives up after Close woke it must not add to bg while close
// waits for it.
func (q *quorum) start() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.bg.Add(len(q.nodes))
	return true
}

func (q *quorum) Close(deadline time.Time) {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	for _, n := range q.nodes {
		n.Close(deadline)
	}
	q.bg.Wait()
}
