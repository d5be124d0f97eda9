package transport

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Client's goroutines that call lock scripts at the same moment share
// round trips: what Redis costs per call is mostly the system calls that
// read a command and write its reply, and a pipeline of many calls pays them
// once. go-redis sends each call on a connection of its own, so the node
// coalesces them itself, the way the watchdog batches renewals.
//
// A call without a context that can end (Lock, Unlock's nested release)
// that finds nothing of the node's in flight is sent at once, on its
// caller's goroutine, exactly as it would be alone: a lone caller waits for
// nothing. Every other call queues, and one drainer goroutine sends
// everything queued as one pipeline (go-redis splits a Cluster pipeline by
// node and routes each call by its slot), hands each caller its own reply,
// and goes on while calls keep coming. Before it looks at the queue again it
// yields the processor: the callers it has just answered often call again
// at once (an Unlock follows a Lock), and without the pause they would split
// into two trains of half the size. At most two round trips of a node are in
// flight: a call sent alone and the drainer's. Every call still goes through
// node.send, so each has its own reply or error and the NOSCRIPT fallback;
// the caller's retries, above, are unchanged; the uncontended releases of a
// round ask whether anybody waits with one EXISTS (see lookTogether).
// WithReplicaAck's acquisitions (acquire and WAIT pipelined on the master's
// connection) queue as jobs of their own, run by the drainer after the
// round's pipeline.
//
// Deadlines: a caller whose context ends returns ctx's error at once,
// whatever go-redis does meanwhile (its ReadTimeout, retries and dials do
// not follow a context unless ContextTimeoutEnabled is set): that is why a
// call with such a context never runs on its caller's goroutine. If its call
// was not sent yet it never will be; if it was, it goes on in the drainer's
// round for the others, and the caller treats it as a call whose reply
// never came (it may be applied). What it posts next to undo it (see
// postCtx) is queued before the caller returns, so it reaches Redis after
// the call it undoes: the drainer's rounds are sequential, and go-redis has
// finished with a round, retries included, when the next begins.
type batcher struct {
	n       *node
	mu      sync.Mutex
	alone   int        // calls in flight on their callers' goroutines
	queue   []*pending // waiting for the drainer, in arrival order
	drainer bool       // the drainer goroutine is running
	closed  bool       // after close, calls are refused (ErrClosed)
	wg      sync.WaitGroup
	// stopped ends the calls the drainer has out (their contexts' base),
	// once close has waited long enough for them; stop ends it.
	stopped context.Context
	stop    context.CancelFunc
	// The context of the drainer's rounds until stop (see batchContext); a
	// drainer starts only after the last one ended (see take), under mu.
	roundCtx detached
}

// pending is one queued call (or job) and what its caller waits on.
type pending struct {
	ctx    context.Context
	cl     call // a copy, so that the caller's call may live on its stack
	cl2    call // with pair: a second call, in the same round trip after cl
	pair   bool
	job    func(ctx context.Context) // a job instead of a call (see batcher.run)
	posted bool                      // nobody waits for it (see postCtx)
	until  time.Time                 // its deadline; zero for none
	state  pendState                 // guarded by batcher.mu
	err    error                     // set before done when it was never sent (ErrClosed)
	done   chan struct{}             // a value once cl.cmd holds the reply (or err is set)
}

type pendState uint8

const (
	pendQueued pendState = iota
	pendSent             // taken by the drainer: it may reach Redis
	pendGone             // dropped unsent: its caller's context ended
)

var pendingPool = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

// postedKey marks a context whose calls are posted: see postCtx.
type postedKey struct{}

// errPosted is what a posted call returns: it was queued, and nobody waits
// for its reply.
var errPosted = errors.New("remutex: call posted")

// UnlockCtx is the context of the calls of Unlock (Release, RUnlock): it
// never ends, but a caller that waits on its call is answered after
// UnlockTimeout whatever Redis does, errUnlockBound (see batcher.wait).
// Unlock needs no context of its own per call for that, and its
// uncontended cycle no allocations.
var UnlockCtx context.Context = bounded{context.Background()}

type bounded struct{ context.Context }

// errUnlockBound is the error of a call of UnlockCtx that got no answer in
// time: it may still be applied (see postCtx).
var errUnlockBound = fmt.Errorf("Redis did not answer within %v: %w", UnlockTimeout, context.DeadlineExceeded)

// PostCtx returns a context for calls that undo or leave behind what a call
// cut off by its caller's context may have done: each is queued behind that
// call before the caller goes on, and sent by the drainer while the caller
// is long gone, within d (a call still queued then is dropped: what it
// would have undone ends by its lease; one that got no answer is sent
// again meanwhile, see drain). Node calls made with it return
// errPosted at once. It has no cancellation: nobody is left to cancel it.
func PostCtx(parent context.Context, d time.Duration) context.Context {
	return context.WithValue(context.WithoutCancel(parent), postedKey{}, time.Now().Add(d))
}

// postedUntil returns the time by which a posted call must be sent, and
// whether ctx is posted.
func postedUntil(ctx context.Context) (time.Time, bool) {
	t, ok := ctx.Value(postedKey{}).(time.Time)
	return t, ok
}

func isPosted(ctx context.Context) bool {
	_, ok := postedUntil(ctx)
	return ok
}

// do sends cl: alone at once when its context cannot end and nothing else
// of the node is in flight, else in the drainer's next round. It returns
// ctx's error if ctx ends first, errPosted at once for a posted context, and
// ErrClosed after close.
func (b *batcher) do(ctx context.Context, cl *call) error { return b.doPair(ctx, cl, nil) }

// doPair is do for cl and, if not nil, cl2 after it in the same round trip.
func (b *batcher) doPair(ctx context.Context, cl, cl2 *call) error {
	b.mu.Lock()
	if !b.closed && !cl.try && b.alone == 0 && !b.drainer {
		switch {
		case ctx == UnlockCtx && b.n.bounded != nil:
			b.alone++
			b.mu.Unlock()
			return b.bound(cl, cl2)
		case ctx.Done() == nil && ctx != UnlockCtx && !isPosted(ctx):
			b.alone++
			b.mu.Unlock()
			b.sendAlone(ctx, b.n.rdb, cl, cl2)
			return nil
		}
	}
	var refused <-chan struct{}
	if cl.try {
		refused = b.n.dials.Refusal() // (before the call can dial)
	}
	p, err := b.enqueueLocked(ctx, cl, cl2, nil)
	b.mu.Unlock()
	if err != nil {
		return err
	}
	return b.waitRefused(ctx, p, refused, func() {
		cl.cmd = p.cl.cmd
		if cl2 != nil {
			cl2.cmd = p.cl2.cmd
		}
	})
}

// sendAlone sends cl (and cl2) on the caller's goroutine, counted in alone.
func (b *batcher) sendAlone(ctx context.Context, t target, cl, cl2 *call) {
	if cl2 == nil {
		b.n.send(ctx, t, []*call{cl}, false, false)
	} else {
		b.n.send(ctx, t, []*call{cl, cl2}, false, true)
	}
	b.mu.Lock()
	b.alone--
	b.mu.Unlock()
}

// bound sends an Unlock's cl (and cl2) on the caller's goroutine through
// the node's bounded client (see boundedTarget), with a context that ends
// after UnlockTimeout. A call that got no answer by then returns
// errUnlockBound, as one sent by the drainer does: it may still be applied.
func (b *batcher) bound(cl, cl2 *call) error {
	bc := takeBound()
	b.sendAlone(bc, b.n.bounded, cl, cl2)
	if bc.put() && (Transient(cl.cmd.Err()) || cl2 != nil && Transient(cl2.cmd.Err())) {
		return errUnlockBound
	}
	return nil
}

// job runs f in the drainer's next round: a call that must keep its own
// connection (acquire and WAIT), in order with the node's other calls. Its
// context is ctx's values with its deadline; it returns as do does.
func (b *batcher) job(ctx context.Context, f func(ctx context.Context)) error {
	b.mu.Lock()
	p, err := b.enqueueLocked(ctx, nil, nil, f)
	b.mu.Unlock()
	if err != nil {
		return err
	}
	return b.wait(ctx, p, func() {})
}

// enqueueLocked queues cl (or job f) with ctx and starts the drainer. For a
// posted context it returns errPosted, having queued it all the same.
func (b *batcher) enqueueLocked(ctx context.Context, cl, cl2 *call, f func(context.Context)) (*pending, error) {
	if b.closed {
		return nil, ErrClosed
	}
	p := pendingPool.Get().(*pending)
	p.ctx, p.job, p.state, p.err = ctx, f, pendQueued, nil
	p.until, p.posted = postedUntil(ctx)
	if !p.posted {
		p.until, _ = ctx.Deadline()
	}
	if cl != nil {
		p.cl = *cl
	}
	if p.pair = cl2 != nil; p.pair {
		p.cl2 = *cl2
	}
	b.queue = append(b.queue, p)
	if !b.drainer {
		b.drainer = true
		b.wg.Add(1)
		go b.drain()
	}
	if p.posted {
		return nil, errPosted
	}
	return p, nil
}

// wait waits for p's round, then takes its reply with got; or returns
// ctx's error when ctx ends first (errUnlockBound after UnlockTimeout for
// UnlockCtx).
func (b *batcher) wait(ctx context.Context, p *pending, got func()) error {
	return b.waitRefused(ctx, p, nil, got)
}

// waitRefused is wait that also returns when refused closes: a dial of
// the redis client was refused after the call was queued (see dialWatch).
// The call may still be sent and applied once Redis listens again: it is
// treated as one whose reply was lost.
func (b *batcher) waitRefused(ctx context.Context, p *pending, refused <-chan struct{}, got func()) error {
	var bound <-chan time.Time
	if ctx == UnlockCtx {
		t := timerPool.Get().(*time.Timer)
		t.Reset(UnlockTimeout)
		defer func() {
			t.Stop()
			timerPool.Put(t)
		}()
		bound = t.C
	}
	select {
	case <-refused:
		b.abandon(p)
		return fmt.Errorf("the connection was refused: %w", b.n.dials.Refused())
	case <-bound:
		b.abandon(p)
		return errUnlockBound
	case <-p.done:
		err := p.err
		if err == nil {
			got()
		}
		p.Release()
		return err
	case <-ctx.Done():
		b.abandon(p)
		return ctx.Err()
	case <-b.n.subscriber.to.Done():
		// Close: nobody waits for Redis any more.
		b.abandon(p)
		return ErrClosed
	}
}

// abandon gives p up: unsent, it never will be; sent, it goes on in the
// drainer's round, and p is not reused (the drainer may still answer it).
func (b *batcher) abandon(p *pending) {
	b.mu.Lock()
	if p.state == pendQueued {
		p.state = pendGone
	}
	b.mu.Unlock()
}

// timerPool holds stopped timers (see batcher.wait).
var timerPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

func (p *pending) Release() {
	*p = pending{done: p.done}
	pendingPool.Put(p)
}

// drain runs the queued calls and jobs, one round at a time, until nothing
// is queued.
//
// A posted call that fails for want of an answer (a connection cut, a
// timeout: go-redis's own retries, which MaxRetries may have turned off,
// are spent) is sent again, first in the next round, after a backoff of
// 10 ms to postRetryLimit, until it succeeds or its time (see postCtx) is
// up. What was queued meanwhile waits for it: a posted call undoes what a
// call of the same owner token may have done, and must reach Redis before
// that owner's next call does, as when it succeeds at once. After Close it
// is not sent again: the lease ends what it would have undone.
func (b *batcher) drain() {
	defer b.wg.Done()
	var ps, again []*pending
	var calls []*call
	var bo Backoff
	for {
		if again = b.retries(again, &bo); len(again) == 0 {
			bo = Backoff{}
		}
		ps, calls = b.take(ps[:0], calls[:0], again)
		if ps == nil {
			return
		}
		b.round(ps, calls)
		again = again[:0]
		for _, p := range ps {
			switch {
			case !p.posted:
				p.done <- struct{}{}
			case p.job == nil && p.failed() && time.Now().Before(p.until):
				again = append(again, p)
			default:
				p.Release() // nobody waits for it
			}
		}
		clear(ps)
	}
}

// postRetryLimit is the longest wait between two sends of a posted call.
const postRetryLimit = 250 * time.Millisecond

// retries waits, after a round whose posted calls again failed, before
// they are sent again; it returns those still to send (none after Close).
func (b *batcher) retries(again []*pending, bo *Backoff) []*pending {
	if len(again) == 0 {
		return again
	}
	if bo.First == 0 {
		bo.First, bo.Limit = 10*time.Millisecond, postRetryLimit
	}
	t := time.NewTimer(bo.Next())
	defer t.Stop()
	closing := false
	select {
	case <-t.C:
	case <-b.n.subscriber.to.Done():
		closing = true
	}
	keep, now := again[:0], time.Now()
	for _, p := range again {
		if closing || !now.Before(p.until) {
			p.Release()
			continue
		}
		keep = append(keep, p)
	}
	clear(again[len(keep):])
	return keep
}

// failed reports whether p's call (or pair) got no answer.
func (p *pending) failed() bool {
	return Transient(p.cl.cmd.Err()) || p.pair && Transient(p.cl2.cmd.Err())
}

// round sends a round's calls as one pipeline, then runs its jobs.
func (b *batcher) round(ps []*pending, calls []*call) {
	if len(calls) > 0 {
		ctx, cancel := b.batchContext(ps)
		if looks := b.looks(calls); looks != nil {
			b.lookTogether(ctx, calls, looks)
		} else {
			b.n.send(ctx, b.n.rdb, calls, false, false)
		}
		cancel()
	}
	for _, p := range ps {
		if p.job != nil {
			ctx, cancel := b.jobContext(p)
			p.job(ctx)
			cancel()
		}
	}
}

// looks returns the looks among calls (the EXISTS after an uncontended
// release's HDEL, see quickRelease) when there are several to send as one,
// else nil. A cluster's keys are in many slots, and its calls are not
// merged.
func (b *batcher) looks(calls []*call) []*call {
	if b.n.cluster {
		return nil
	}
	var looks []*call
	for _, cl := range calls {
		if cl.look {
			looks = append(looks, cl)
		}
	}
	if len(looks) < 2 {
		return nil
	}
	return looks
}

// lookTogether sends calls with its looks as one EXISTS of all their keys,
// last in the pipeline, after every HDEL they follow: a waiter queued before
// a release is still seen, and one that queued after it found the lock free
// (see quick). Redis runs one command where it would run one a release.
// When the count is 0, as it is when nobody waits, each look's reply is 0;
// otherwise the looks are sent again one by one, in a second round trip, to
// tell which locks have waiters.
func (b *batcher) lookTogether(ctx context.Context, calls, looks []*call) {
	rest := make([]*call, 0, len(calls)-len(looks)+1)
	args := make([]interface{}, 1, 1+len(looks))
	args[0] = "exists"
	for _, cl := range calls {
		if cl.look {
			args = append(args, cl.args[1:]...)
		} else {
			rest = append(rest, cl)
		}
	}
	all := &call{args: args}
	b.n.send(ctx, b.n.rdb, append(rest, all), false, true)
	if n, err := all.cmd.Int64(); err != nil || n > 0 {
		b.n.send(ctx, b.n.rdb, looks, false, true)
		return
	}
	for _, cl := range looks {
		cl.cmd = redis.NewCmd(ctx, cl.args...)
		cl.cmd.SetVal(int64(0))
	}
}

// take moves the posted calls to send again, then the queued calls that
// still have a caller (or are posted, and not too late), into ps and calls;
// it returns nil ps, and ends the drainer, when there is nothing to send.
func (b *batcher) take(ps []*pending, calls []*call, again []*pending) ([]*pending, []*call) {
	if cap(ps) > 0 {
		// The callers just answered are likely to call again at once (a
		// Lock's Unlock follows it): let them, and send their calls together.
		runtime.Gosched()
	}
	for _, p := range again {
		ps, calls = p.add(ps, calls)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 && len(ps) == 0 {
		b.drainer = false
		return nil, calls
	}
	for i, p := range b.queue {
		b.queue[i] = nil
		switch {
		case p.state == pendGone:
		case p.ctx.Err() != nil || p.posted && time.Now().After(p.until):
			p.state = pendGone
			if !p.posted {
				p.err = p.ctx.Err()
				p.done <- struct{}{}
			}
		default:
			p.state = pendSent
			ps, calls = p.add(ps, calls)
		}
	}
	b.queue = b.queue[:0]
	if ps == nil {
		ps = []*pending{}
	}
	return ps, calls
}

// add appends p and its calls to a round's.
func (p *pending) add(ps []*pending, calls []*call) ([]*pending, []*call) {
	ps = append(ps, p)
	if p.job == nil {
		calls = append(calls, &p.cl)
	}
	if p.pair {
		calls = append(calls, &p.cl2)
	}
	return ps, calls
}

// batchContext is the context of a pipeline of ps's calls. No caller's
// cancellation may cut the others' calls short: it keeps the first caller's
// values, not its cancellation, and ends at the latest of the callers'
// deadlines (with no deadline if one has none), so that a server that does
// not answer holds up no longer than its callers would have waited.
func (b *batcher) batchContext(ps []*pending) (context.Context, context.CancelFunc) {
	// The drainer's own, reused round after round: go-redis keeps no
	// context past a call. But a context made from it (WithDeadline, below)
	// hears of the stop through its AfterFunc, whose callback, once the
	// stop fired it, reads the round's context on a goroutine of its own,
	// maybe after the round ended. A round's cancel unregisters the
	// callback unless it fired, and it fired only if b.stopped ended
	// before that cancel: then every later round gets a context of its own.
	rc := &b.roundCtx
	if b.stopped.Err() != nil {
		rc = new(detached)
	}
	*rc = detached{Context: b.stopped, values: ps[0].ctx}
	ctx := context.Context(rc)
	var latest time.Time
	for _, p := range ps {
		if p.until.IsZero() {
			return ctx, func() {}
		}
		if p.until.After(latest) {
			latest = p.until
		}
	}
	return context.WithDeadline(ctx, latest)
}

// jobContext is the context a job runs with: its caller's values and
// deadline, not its cancellation (a job cut off half way would leave a grant
// nobody rolls back).
func (b *batcher) jobContext(p *pending) (context.Context, context.CancelFunc) {
	if !p.until.IsZero() {
		return context.WithDeadline(b.detach(p.ctx), p.until)
	}
	return b.detach(p.ctx), func() {}
}

// detach returns a context with ctx's values, and neither its deadline nor
// its cancellation but the batcher's stop (see close).
func (b *batcher) detach(ctx context.Context) context.Context {
	return detached{Context: b.stopped, values: ctx}
}

// detached is a context whose values are another's.
type detached struct {
	context.Context
	values context.Context
}

func (d detached) Value(key any) any { return d.values.Value(key) }

// AfterFunc lets a context made from d (WithDeadline) hear of its stop
// without a goroutine of its own (see context.AfterFunc).
func (d detached) AfterFunc(f func()) func() bool { return context.AfterFunc(d.Context, f) }

// close stops the batcher: later calls get ErrClosed, and close waits for
// the drainer to send what is queued (the leaves and releases that waiters
// and holders posted when the Client closed among them) until deadline.
// Then it ends the calls still out (a Redis that refuses connections or does
// not answer), and waits for the drainer to see them end: at once for a
// call that waits to connect or to retry; a call blocked reading a reply
// ends by the redis client's read timeout, which go-redis applies instead
// of the context unless ContextTimeoutEnabled.
func (b *batcher) Close(deadline time.Time) {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	done := make(chan struct{})
	go func() { // (joined below: it ends with the drainer)
		b.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		b.stop()
		<-done
	}
	b.stop()
}

// close stops the node: its coalescing of calls (see batcher.close), then
// its subscriptions.
func (n *node) Close(deadline time.Time) {
	n.dials.closed.Store(true)
	n.batch.Close(deadline)
	n.subscriber.Close()
}
