package remutex

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// A Client's goroutines that call lock scripts at the same moment share
// round trips: what Redis costs per call is mostly the system calls that
// read a command and write its reply, and a pipeline of many calls pays them
// once. go-redis sends each call on a connection of its own, so the node
// coalesces them itself, the way the watchdog batches renewals.
//
// A call that finds nothing of the node's in flight is sent at once, on its
// caller's goroutine, exactly as it would be alone: a lone caller waits for
// nothing. Calls that come while another is in flight queue; one drainer
// goroutine sends everything queued as one pipeline (go-redis splits a
// Cluster pipeline by node and routes each call by its slot), hands each
// caller its own reply, and goes on while calls keep coming. Before it looks
// at the queue again it yields the processor: the callers it has just
// answered often call again at once (an Unlock follows a Lock), and without
// the pause they would split into two trains of half the size. At most two
// round trips of a node are in flight: a call sent alone and a pipeline.
// Every call still goes through node.send, so each has its own reply or
// error and the NOSCRIPT fallback; the caller's retries, above, are
// unchanged. WithReplicaAck's acquisitions keep their own path (acquire and
// WAIT pipelined on the master's connection) and are not coalesced.
//
// A queued caller whose context ends returns ctx's error at once. If its
// call was not sent yet it never will be; if it was, the pipeline goes on
// for the others, and the caller treats the call as one whose reply never
// came (it may have been applied), as it would a call cut off by its
// context: a call it makes next to undo it goes in a later round trip.
type batcher struct {
	n       *node
	mu      sync.Mutex
	alone   int        // calls in flight on their callers' goroutines
	queue   []*pending // waiting for the drainer, in arrival order
	drainer bool       // the drainer goroutine is running
	closed  bool       // after close every call is sent at once
	wg      sync.WaitGroup
}

// pending is one queued call and what its caller waits on.
type pending struct {
	ctx   context.Context
	cl    call          // a copy, so that the caller's call may live on its stack
	state pendState     // guarded by batcher.mu
	done  chan struct{} // a value once cl.cmd holds the reply
}

type pendState uint8

const (
	pendQueued pendState = iota
	pendSent             // taken by the drainer: it may reach Redis
	pendGone             // dropped unsent: its caller's context ended
)

var pendingPool = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

// do sends cl, alone at once when nothing else of the node is in flight,
// else in the next pipeline. It returns ctx's error if ctx ends first.
func (b *batcher) do(ctx context.Context, cl *call) error {
	b.mu.Lock()
	if b.closed || (b.alone == 0 && !b.drainer) {
		b.alone++
		b.mu.Unlock()
		b.n.send(ctx, b.n.rdb, []*call{cl}, false, false)
		b.mu.Lock()
		b.alone--
		b.mu.Unlock()
		return nil
	}
	p := pendingPool.Get().(*pending)
	p.ctx, p.cl, p.state = ctx, *cl, pendQueued
	b.queue = append(b.queue, p)
	if !b.drainer {
		b.drainer = true
		b.wg.Add(1)
		go b.drain()
	}
	b.mu.Unlock()
	select {
	case <-p.done:
		cl.cmd = p.cl.cmd
		p.ctx, p.cl = nil, call{}
		pendingPool.Put(p)
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		if p.state == pendQueued {
			p.state = pendGone
		}
		b.mu.Unlock()
		// p is not reused: the drainer may still answer it.
		return ctx.Err()
	}
}

// drain sends what is queued, one pipeline at a time, until nothing is.
func (b *batcher) drain() {
	defer b.wg.Done()
	var ps []*pending
	var calls []*call
	for {
		ps, calls = b.take(ps[:0], calls[:0])
		if ps == nil {
			return
		}
		if len(calls) > 0 {
			ctx, cancel := batchContext(ps)
			b.n.send(ctx, b.n.rdb, calls, false, false)
			cancel()
		}
		for _, p := range ps {
			p.done <- struct{}{}
		}
		clear(ps)
	}
}

// take moves the queued calls that still have a caller into ps and calls;
// it returns nil ps, and ends the drainer, when the queue is empty.
func (b *batcher) take(ps []*pending, calls []*call) ([]*pending, []*call) {
	if cap(ps) > 0 {
		// The callers just answered are likely to call again at once (a
		// Lock's Unlock follows it): let them, and send their calls together.
		runtime.Gosched()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.drainer = false
		return nil, calls
	}
	for i, p := range b.queue {
		b.queue[i] = nil
		switch {
		case p.state == pendGone:
		case p.ctx.Err() != nil:
			p.state = pendGone
		default:
			p.state = pendSent
			ps = append(ps, p)
			calls = append(calls, &p.cl)
		}
	}
	b.queue = b.queue[:0]
	if ps == nil {
		ps = []*pending{}
	}
	return ps, calls
}

// batchContext is the context of a pipeline of ps's calls. No caller's
// cancellation may cut the others' calls short: it keeps the first caller's
// values, not its cancellation, and ends at the latest of the callers'
// deadlines (with no deadline if one has none), so that a server that does
// not answer holds up no longer than its callers would have waited.
func batchContext(ps []*pending) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(ps[0].ctx)
	var latest time.Time
	for _, p := range ps {
		d, ok := p.ctx.Deadline()
		if !ok {
			return ctx, func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(ctx, latest)
}

// close waits for the drainer; calls after it are sent at once.
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

// close stops the node: its coalescing of calls, then its subscriptions.
func (n *node) close() {
	n.batch.close()
	n.subscriber.close()
}
