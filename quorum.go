package remutex

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoQuorum reports that a quorum Client could not reach a majority of its
// servers for a call (they failed, not that the lock was busy). It is
// transient: Lock retries it.
var ErrNoQuorum = errors.New("remutex: no majority of servers answered")

// NewQuorumClient returns a Client whose locks live on a majority of
// independent Redis servers (the Redlock algorithm), for deployments where no
// single Redis, however replicated, may decide alone. The servers must not
// replicate each other. Its DistMutex API is the same as NewClient's:
//
//   - An acquisition succeeds when a majority of the servers granted it within
//     the lease's validity (lease minus the time the acquisition took, minus a
//     drift margin); otherwise what it got is released again.
//   - Reentrancy and renewal work per server; a hold is lost when fewer than a
//     majority renew it, or its validity passes without a majority renewal.
//   - Waiters are woken by pub/sub from every server; the starvation queue of
//     NewClient is not used, so heavy contention is served in normal mode.
//   - Fencing (WithFencing): each server keeps its own counter. The token of
//     an acquisition is the highest its majority granted, and before Lock
//     returns that value is written back (raised, never lowered) to a
//     majority of the counters. Any later majority shares a server with it, so
//     tokens strictly increase as long as no server loses its counter; a
//     server restarted without persistence reseeds from its clock, which keeps
//     them rising unless clocks jump back. This costs one more round trip.
//   - Like every lease lock, and Redlock in particular, it assumes bounded
//     clock drift between the servers and the client: a server whose clock
//     jumps forward expires leases early.
//
// Owner tokens carry a per-try suffix (<client id>:<goroutine id>.<n>): a
// try that lost gives back what it got late, in the background, and must
// never touch a later try's field. It panics with fewer than three servers or
// a nil one. The redis clients stay the caller's to close.
func NewQuorumClient(rdbs []redis.UniversalClient, opts ...Option) *Client {
	if len(rdbs) < 3 {
		panic(fmt.Sprintf("remutex: NewQuorumClient: need at least 3 independent servers, got %d", len(rdbs)))
	}
	for i, rdb := range rdbs {
		if rdb == nil || isNilPointer(rdb) {
			panic(fmt.Sprintf("remutex: NewQuorumClient: redis client %d is nil", i))
		}
	}
	c := NewClient(rdbs[0], opts...)
	c.nodes = make([]*node, len(rdbs))
	for i, rdb := range rdbs {
		c.nodes[i] = newNode(c, rdb)
	}
	c.one = nil
	c.majority = len(rdbs)/2 + 1
	return c
}

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

// fanOut calls f on every node at once and returns as soon as decided says
// the answers so far settle the question, all answered, or the others took
// much longer than the majority (see minGrace), so that a dead, paused or
// slow server does not hold up a majority. Answers are in node order; a node
// that has not answered has errNoAnswer. Calls still running continue in the
// background, joined by Close, and hand their answer to late if it is not nil.
func fanOut[T any](c *Client, f func(*node) (T, error), decided func([]answer[T]) bool, late func(*node, answer[T])) []answer[T] {
	type indexed struct {
		i int
		a answer[T]
	}
	ch := make(chan indexed, len(c.nodes))
	var mu sync.Mutex
	finished := false
	for i, n := range c.nodes {
		c.bg.Add(1)
		go func() {
			defer c.bg.Done()
			v, err := f(n)
			a := answer[T]{v, err}
			mu.Lock()
			if finished {
				mu.Unlock()
				if late != nil {
					late(n, a)
				}
				return
			}
			ch <- indexed{i, a} // buffered for every node: never blocks
			mu.Unlock()
		}()
	}
	got := make([]answer[T], len(c.nodes))
	for i := range got {
		got[i].err = errNoAnswer
	}
	start := time.Now()
	var grace <-chan time.Time
wait:
	for answered := 0; answered < len(c.nodes); {
		select {
		case x := <-ch:
			answered++
			got[x.i] = x.a
			if decided(got) {
				break wait
			}
			if answered == c.majority {
				// The majority's answers did not settle it: wait for the
				// others only a little longer than those took, so that a
				// server that does not answer (paused, partitioned) counts
				// as failed instead of holding the caller up until its
				// client's read timeout.
				t := time.NewTimer(max(2*time.Since(start), minGrace))
				defer t.Stop()
				grace = t.C
			}
		case <-grace:
			break wait
		}
	}
	mu.Lock()
	finished = true
	mu.Unlock()
	for {
		select {
		case x := <-ch: // answered after the decision, before finished was set
			if late != nil {
				late(c.nodes[x.i], x.a)
			}
		default:
			return got
		}
	}
}

// acquireVotes counts a fan-out of acquire replies.
type acquireVotes struct {
	granted, lost, busy int
	fence, wait         int64
	permanent, last     error
}

func countAcquire(as []answer[scriptReply]) (v acquireVotes) {
	for _, a := range as {
		switch {
		case a.err != nil:
			if a.err != errNoAnswer {
				v.last = a.err
				if !transient(a.err) {
					v.permanent = a.err
				}
			}
		case a.v.code == replyGranted:
			v.granted++
			v.fence = max(v.fence, a.v.val)
		case a.v.code == replyLost:
			v.lost++
		default:
			v.busy++
			v.wait = max(v.wait, a.v.val)
		}
	}
	return v
}

// acquire runs the acquire script on the lock's server, or on a quorum.
func (c *Client) acquire(ctx context.Context, k *lockKeys, owner interface{}, have, want int, lease, fencing interface{}) (scriptReply, error) {
	if c.one != nil {
		return c.one.acquire(ctx, k, owner, have, want, lease, fencing)
	}
	n := len(c.nodes)
	if fencing == "1" {
		fencing = "2" // every server draws a new token; see acquire.lua
	}
	// Grants that arrive after the decision are kept in lateGrants until the
	// acquisition is known to fail, and given back then (or at once after).
	var mu sync.Mutex
	failed := false
	var lateGrants []*node
	giveBack := func(nd *node) {
		_, _ = nd.release(context.WithoutCancel(ctx), k, owner, 0, "0", 0)
	}
	as := fanOut(c, func(nd *node) (scriptReply, error) {
		return nd.acquire(ctx, k, owner, have, want, lease, fencing)
	}, func(as []answer[scriptReply]) bool {
		v := countAcquire(as)
		return v.granted >= c.majority || v.granted+countNoAnswer(as) < c.majority
	}, func(nd *node, a answer[scriptReply]) {
		if have > 0 || a.err != nil || a.v.code != replyGranted {
			return
		}
		mu.Lock()
		f := failed
		if !f {
			lateGrants = append(lateGrants, nd)
		}
		mu.Unlock()
		if f {
			giveBack(nd)
		}
	})
	v := countAcquire(as)
	if v.granted >= c.majority {
		if have > 0 || fencing != "2" {
			return scriptReply{code: replyGranted, val: v.fence}, nil
		}
		err := c.raiseFence(ctx, k, v.fence)
		if err == nil {
			return scriptReply{code: replyGranted, val: v.fence}, nil
		}
		v.last = err
	}
	if have == 0 {
		// Give back the minority we got, so that it blocks nobody.
		mu.Lock()
		failed = true
		late := lateGrants
		mu.Unlock()
		for i, a := range as {
			if a.err == nil && a.v.code == replyGranted {
				giveBack(c.nodes[i])
			}
		}
		for _, nd := range late {
			giveBack(nd)
		}
	}
	switch {
	case have > 0 && v.lost > n-c.majority:
		return scriptReply{code: replyLost}, nil
	case v.permanent != nil:
		return scriptReply{}, v.permanent
	case v.busy > 0 && have == 0:
		return scriptReply{code: replyBusy, val: v.wait, split: v.granted > 0}, nil
	}
	return scriptReply{}, fmt.Errorf("%w: %d of %d granted (%v)", ErrNoQuorum, v.granted, n, v.last)
}

func countNoAnswer[T any](as []answer[T]) (k int) {
	for _, a := range as {
		if a.err == errNoAnswer {
			k++
		}
	}
	return k
}

// raiseFence writes token back to the fence counters (never lowering them)
// and succeeds when a majority took it.
func (c *Client) raiseFence(ctx context.Context, k *lockKeys, token int64) error {
	ok := func(as []answer[interface{}]) (k int) {
		for _, a := range as {
			if a.err == nil {
				k++
			}
		}
		return k
	}
	as := fanOut(c, func(n *node) (interface{}, error) {
		return raiseScript.Run(ctx, n.rdb, k.keys[1:2], token).Result()
	}, func(as []answer[interface{}]) bool { return ok(as) >= c.majority }, nil)
	if got := ok(as); got < c.majority {
		return fmt.Errorf("%w: fence raised on %d of %d", ErrNoQuorum, got, len(c.nodes))
	}
	return nil
}

// release runs the release script on the lock's server, or on a quorum:
// released when a majority released, not held when no majority can have
// held it.
func (c *Client) release(ctx context.Context, k *lockKeys, owner interface{}, want int, lease, seq interface{}) (int64, error) {
	if c.one != nil {
		return c.one.release(ctx, k, owner, want, lease, seq)
	}
	count := func(as []answer[int64]) (ok, notHeld int, last error) {
		for _, a := range as {
			switch {
			case a.err != nil:
				if a.err != errNoAnswer {
					last = a.err
				}
			case a.v == releaseNotHeld:
				notHeld++
			default:
				ok++
			}
		}
		return ok, notHeld, last
	}
	// A final release waits for every server that answers in time (each
	// must free its key, so that the next acquisition finds them all free);
	// a nested one only for a majority.
	as := fanOut(c, func(n *node) (int64, error) {
		return n.release(ctx, k, owner, want, lease, seq)
	}, func(as []answer[int64]) bool {
		ok, notHeld, _ := count(as)
		return want > 0 && (ok >= c.majority || notHeld > len(c.nodes)-c.majority)
	}, nil)
	ok, notHeld, last := count(as)
	switch {
	case ok >= c.majority:
		return 1, nil
	case notHeld > len(c.nodes)-c.majority:
		return releaseNotHeld, nil
	case ok+countNoAnswer(as) >= c.majority:
		// The servers that did not answer in time still get the call (it
		// runs on in the background): asking them again could only find
		// the fields gone and misreport the hold as lost.
		return 1, nil
	}
	return 0, fmt.Errorf("%w: %d of %d released (%v)", ErrNoQuorum, ok, len(c.nodes), last)
}

// renew renews holds on the lock's server, or on a quorum: renewed where a
// majority renewed, lost where no majority can have it.
func (c *Client) renew(ctx context.Context, items []renewItem) []int64 {
	if c.one != nil {
		return c.one.renew(ctx, items)
	}
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
			case ok >= c.majority:
				res[i] = 1
			case no > len(c.nodes)-c.majority:
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
	as := fanOut(c, func(n *node) ([]int64, error) { return n.renew(ctx, items), nil },
		func(as []answer[[]int64]) bool { _, settled := tally(as); return settled }, nil)
	res, _ := tally(as)
	return res
}

// queueing reports whether waiters use the starvation queue: on a single
// deployment only.
func (c *Client) queueing() bool { return c.one != nil }

func (c *Client) enqueue(ctx context.Context, k *lockKeys, owner, entry string, ttl time.Duration, lease, fencing interface{}) (scriptReply, error) {
	return c.one.enqueue(ctx, k, owner, entry, ttl, lease, fencing)
}

func (c *Client) leave(ctx context.Context, k *lockKeys, owner, entry string) error {
	return c.one.leave(ctx, k, owner, entry)
}

// subAcquire, subRelease, subReady and subPolling manage the waiters'
// subscriptions on every node.
func (c *Client) subAcquire(channel string) {
	for _, n := range c.nodes {
		n.sub.acquire(channel)
	}
}

func (c *Client) subRelease(channel string) {
	for _, n := range c.nodes {
		n.sub.release(channel)
	}
}

// subReady returns a closed channel once enough nodes deliver the channel's
// messages: one, or for a quorum a majority. A release publishes on every
// server it releases on, and a hold lives on at least a majority, so any
// majority of subscriptions hears it; fewer may all be on servers the hold
// never had. Until then it returns the ready channel of a node still
// missing.
func (c *Client) subReady(channel string) <-chan struct{} {
	need := 1
	if c.one == nil {
		need = c.majority
	}
	var missing <-chan struct{}
	for _, n := range c.nodes {
		r := n.sub.ready(channel)
		select {
		case <-r:
			if need--; need == 0 {
				return r
			}
		default:
			if missing == nil {
				missing = r
			}
		}
	}
	return missing
}

func (c *Client) subPolling() bool {
	for _, n := range c.nodes {
		if n.sub.polling() {
			return true
		}
	}
	return false
}
