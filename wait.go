package remutex

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/remutex/remutex/internal/transport"
	"github.com/remutex/remutex/internal/wire"
)

// attempt is one goroutine's effort to take a lock it does not hold, from
// the Lock call until it holds the lock or gives up.
type attempt struct {
	m       *DistMutex
	gid     int64
	try     bool // TryLock: one call, never queued
	permits int  // the count it takes: 1, or a semaphore's permits
	start   time.Time
	held    *hold // the hold it took, once complete

	owner  interface{} // the owner token (a string), boxed once for script calls
	pinned bool        // a read under the goroutine's write hold, whose token is pin
	pin    string
	// entryOwner is the owner its queue entry names where that is not the
	// owner of each try: a quorum's tries each have a token of their own,
	// and its wait keeps one entry.
	entryOwner string
	waitID     uint64 // names this wait's queue entry, with the owner
	known      bool   // the entry is known queued (see acquire.lua)
	prev       string // known: the entry as the latest answered call left it
	at         int64  // the send time the entry of its next call names (see transport.EntryString)
	again      bool   // the latest call got no answer: the next one names the same entry

	watching    bool    // holds a reference to the lock's subscription
	w           *waiter // the local waiter, once waiting
	timer       *time.Timer
	sent        time.Time // send time of the latest call
	refreshed   time.Time // send time of the latest call that kept the entry alive
	heard       bool      // the subscription was confirmed before the entry's latest refresh was sent
	heardAtSend bool      // the subscription was confirmed when the latest call was sent
	pttl        time.Duration
	split       bool            // quorum: contenders split the servers; hold off a while
	granted     bool            // the latest wake-up was the queue's grant (Event.Granted)
	lastErr     error           // the transient error being retried, or nil
	refusal     <-chan struct{} // closed at a refused dial since it began (see transport.Backend.Refusal)
	bo, poll    backoff
	splitBo     backoff
}

// initAttemptLocked prepares an attempt of goroutine gid.
func (m *DistMutex) initAttemptLocked(a *attempt, gid int64, try bool) {
	c := m.c
	*a = attempt{m: m, gid: gid, try: try, start: time.Now(), refusal: c.be.Refusal()}
	switch {
	case m.pinnedOwnerLocked(a, gid):
	case c.be.FreshOwners():
		// Set per call in acquire.
		a.entryOwner = c.id + ":" + strconv.FormatInt(gid, 10)
	default:
		a.owner = m.newOwnerLocked(gid)
	}
	if !try { // (TryLock never queues)
		a.newWaitIDLocked()
	}
}

// newOwnerLocked returns a new owner token for an acquisition of goroutine
// gid: <client id>:<goroutine id>.<n> (NonReentrant: <client id>:n<n>),
// with n a number the Client never gives again. Every acquisition (and
// every try on a quorum) has a token of its own, so a call of an earlier
// one, however late or often it reaches Redis (a resend, a release posted
// behind a call cut off), finds nothing of a later one to change.
func (m *DistMutex) newOwnerLocked(gid int64) string {
	if !m.reentrant {
		gid = -1
	}
	var b [128]byte // (one allocation: the string)
	return string(wire.AppendOwner(b[:0], m.c.id, gid, m.c.nextSeqLocked()))
}

// run takes the lock: one call that acquires it or queues the caller, then,
// if it is busy, the wait.
func (a *attempt) run(ctx context.Context) (bool, error) {
	m := a.m
	if !a.try {
		// A subscription that exists already (the lock was waited for a
		// moment ago) is kept while the call is out, and if it was confirmed
		// then, no message for this attempt can be missed.
		a.watching = m.c.be.Watch(m.spec.channel, false)
		defer a.unwatch()
	}
	for {
		r, err := a.call(ctx)
		switch {
		case err == nil && r.Code == replyGranted:
			held, err := a.complete(ctx, r.Val, a.sent, m.spec.Lease)
			if held || err != nil || a.try {
				return held, err
			}
			// Granted too late to be valid, and released again: once more.
		case err != nil && cutOff(ctx, err):
			if a.try {
				return false, ctxErr(ctx, a.noReply())
			}
			// Redis may have applied the call whose reply never came.
			a.lastErr = a.noReply()
			return a.giveUpAtOnce(ctx, ctx.Err())
		case a.try && err != nil:
			return false, err
		case a.try:
			return false, nil
		case err == nil || transient(err):
			return a.wait(ctx, r, err)
		case errors.Is(err, ErrClosed):
			// Closed while the call was out: Redis may have queued the
			// caller all the same.
			return a.giveUpAtOnce(ctx, err)
		default:
			return false, err
		}
	}
}

// noReply is the last error of an attempt whose call was cut off: that it
// got no answer, or what kept it from getting one, a refused connection
// since the attempt began (its call then waits for go-redis's dial
// retries).
func (a *attempt) noReply() error {
	if isClosed(a.refusal) {
		if err := a.m.c.be.Refused(); err != nil {
			return fmt.Errorf("%w: the connection was refused: %w", errNoReply, err)
		}
	}
	return errNoReply
}

func (a *attempt) unwatch() {
	if a.watching {
		a.m.c.be.Unwatch(a.m.spec.channel)
	}
}

// call sends acquire: for a Lock it also queues the caller (or refreshes its
// entry) when the lock is busy.
func (a *attempt) call(ctx context.Context) (reply, error) {
	m := a.m
	c := m.c
	if c.be.FreshOwners() {
		// A quorum gives back, in the background, what a failed try got
		// late: a token per try keeps that from touching a later try.
		c.mu.Lock()
		a.owner = a.freshOwnerLocked()
		c.mu.Unlock()
	}
	a.heardAtSend = a.watching && isClosed(c.be.Ready(m.spec.channel))
	first := a.sent.IsZero()
	a.sent = time.Now()
	if !a.again && c.be.Grants() {
		// A new send time for the entry only once the previous call was
		// answered: the entry of a call that got no answer may be queued as
		// it named it, and the next call must find it (see enqueue.lua).
		a.at = int64(a.sent.Sub(c.epoch) / time.Millisecond)
	}
	r, err := c.be.Acquire(ctx, &m.spec.Spec, acquireReq{
		Owner: a.owner, Want: a.permits, Lease: m.spec.leaseArg, Fence: m.spec.fence, Place: a.place(), Quick: first, Try: a.try,
	})
	a.again = err != nil
	return r, err
}

// place is where the attempt stands in the queue (see queuePlace).
func (a *attempt) place() queuePlace {
	if a.try {
		return queuePlace{} // (TryLock never queues)
	}
	return queuePlace{Wait: a.waitID, At: a.at, Arrival: a.start.UnixMilli(), Owner: a.entryOwnerString(), Known: a.known, Prev: a.prev, Permits: a.permits}
}

// newWaitIDLocked gives the attempt a wait id of its own, and so a queue
// entry no earlier grant can name.
func (a *attempt) newWaitIDLocked() {
	a.waitID = a.m.c.nextSeqLocked()
	a.known, a.prev, a.again = false, "", false
}

// renewEntry is called when acquire says the attempt's queue entry is gone
// (handed the lock, which then ended before the waiter took it, or expired):
// the attempt queues again under a new entry, so that a grant of the old
// one, still on its way, cannot be taken for the new wait.
func (a *attempt) renewEntry() {
	c := a.m.c
	c.mu.Lock()
	a.newWaitIDLocked()
	c.mu.Unlock()
	a.refreshed = time.Time{}
	a.entryChanged()
}

// entry is the attempt's queue entry as its next call (or the latest, if it
// got no answer) names it (see transport.EntryString), its arrival when the Lock
// began.
func (a *attempt) entry() string {
	return transport.EntryString(&a.m.spec.Spec, a.waitID, a.at, a.start.UnixMilli(), a.permits, a.entryOwnerString())
}

// entries are the attempt's entries that may be queued, for leave.lua: the
// latest call's and the one the latest answered call left, if another
// ("<entry>|<entry>").
func (a *attempt) entries() string {
	e := a.entry()
	if a.prev == "" || a.prev == e {
		return e
	}
	return a.prev + "|" + e
}

// key names the attempt's wait in the messages of its grants (see waitKey).
func (a *attempt) key() string { return wire.WaitKey(a.waitID, a.entryOwnerString()) }

// giveBack posts the release of a grant the attempt will not take, and,
// for a wait, the leave of its entries (what the grant did not take from the
// queue, the leave does): see transport.PostCtx.
func (a *attempt) giveBack(ctx context.Context) {
	m := a.m
	if a.try || a.waitID == 0 || m.c.be.FreshOwners() {
		postRelease(ctx, m.c.be, &m.spec, a.owner, "0")
		return
	}
	a.postLeave(ctx)
}

// postLeave posts the leave of the attempt's entries, with a grant they
// may have got meanwhile, behind its latest call (see transport.PostCtx): it is not
// waited for. It has until the lease (at least a second) to reach Redis.
func (a *attempt) postLeave(ctx context.Context) {
	m := a.m
	_ = m.c.be.Leave(transport.PostCtx(ctx, max(m.spec.Lease, time.Second)), &m.spec.Spec, a.owner, a.entries())
}

// freshOwnerLocked returns a new owner token for the attempt: see
// newOwnerLocked, and pinnedOwnerLocked for a read under the goroutine's
// write hold.
func (a *attempt) freshOwnerLocked() string {
	if a.pinned {
		return a.pin + "/r" + strconv.FormatUint(a.m.c.nextSeqLocked(), 10)
	}
	return a.m.newOwnerLocked(a.gid)
}

// renewOwner gives the attempt an owner token and a wait of its own anew,
// after it gave back a grant of the previous one: a later call or grant of
// the same token could be undone by that give-back, however late it
// arrives. (A quorum's tries have their own tokens.)
func (a *attempt) renewOwner() {
	if a.m.c.be.FreshOwners() {
		return
	}
	c := a.m.c
	c.mu.Lock()
	a.owner = a.freshOwnerLocked()
	a.newWaitIDLocked()
	c.mu.Unlock()
	a.refreshed = time.Time{}
	a.entryChanged()
}

// entryOwnerString is the owner its queue entries name: a quorum's names
// the goroutine, not the try (see initAttemptLocked).
func (a *attempt) entryOwnerString() string {
	if a.entryOwner != "" {
		return a.entryOwner
	}
	return ownerString(a.owner)
}

// entryChanged tells the local waiter, if any, the attempt's current wait:
// a grant it has not taken yet was of an earlier one, and is dropped.
func (a *attempt) entryChanged() {
	if a.w == nil {
		return
	}
	k := a.key()
	c := a.m.c
	c.mu.Lock()
	a.w.key, a.w.granted, a.w.told = k, false, ""
	if st := c.locks[a.m.spec.hash()]; st != nil {
		st.claimEarlyLocked(a.w)
	}
	c.mu.Unlock()
}

// complete records a granted lock as the goroutine's hold. The grant was
// made by a call sent at sent and lasts d (a lease, or a queue grant's claim
// lease); a grant already past its validity is released again and not
// reported as held.
func (a *attempt) complete(ctx context.Context, fence int64, sent time.Time, d time.Duration) (bool, error) {
	m := a.m
	c := m.c
	h := &hold{m: m, owner: a.owner, gid: a.gid, count: a.permits, fence: fence}
	h.valid = sent.Add(validity(d))
	h.next = sent.Add(d / 3) // from the send time, like valid: a slow reply leaves time to renew
	now := time.Now()
	c.mu.Lock()
	if c.draining || !now.Before(h.valid) {
		// Closed meanwhile, or granted too late to be valid: given back by a
		// call that follows this one (see transport.PostCtx). The give-back may reach
		// Redis late, after any later call: the attempt goes on under an
		// owner token of its own, which it cannot touch.
		closed := c.draining
		c.mu.Unlock()
		a.giveBack(ctx)
		if closed {
			return false, ErrClosed
		}
		a.renewOwner()
		return false, nil
	}
	h.acquired = now
	h.id = c.nextSeqLocked()
	m.addHoldLocked(h)
	c.wd.addLocked(h)
	a.held = h
	c.mu.Unlock()
	if c.hook != nil {
		ev := h.event(EventAcquired, now.Sub(a.start), nil)
		ev.Granted, ev.Context = a.granted, ctx
		c.emit(ev)
	}
	return true, nil
}

// wait blocks until the attempt holds the lock, ctx ends, or a permanent
// error. r and err are the outcome of the call that found the lock busy
// (and queued the caller) or failed.
//
// On a single server each release hands the lock to the waiter that has
// waited longest (a 'g' message naming its entry, to its Client alone) and
// newcomers queue behind it; it holds the lock from the message alone. On a
// quorum a release only wakes it (a 'w' message), and it takes the lock
// with its next call. Between messages the waiter calls again every third
// of the queue's time to live (which the call renews), and when the
// holder's lease would run out.
func (a *attempt) wait(ctx context.Context, r reply, err error) (_ bool, failed error) {
	a.enter()
	defer a.exit()
	if c := a.m.c; c.hook != nil {
		c.emit(a.waitEvent(ctx, EventWaiting, nil))
		defer func() {
			err := failed
			var ended *runEnded
			if errors.As(err, &ended) {
				err = nil // (not a failure: the Do has its outcome; see EventWaited)
			}
			c.emit(a.waitEvent(ctx, EventWaited, err))
		}()
	}
	for {
		switch {
		case err != nil && cutOff(ctx, err):
			if a.lastErr == nil {
				a.lastErr = a.noReply()
			}
			return a.giveUp(ctx, ctx.Err())
		case err != nil && !transient(err):
			return a.giveUp(ctx, err)
		case err == nil && r.Code == replyGranted:
			held, err := a.complete(ctx, r.Val, a.sent, a.m.spec.Lease)
			if held || err != nil {
				return held, err
			}
			// Granted too late to be valid, and released again: look again.
		case err == nil && r.Code == replyGone:
			if out := a.told(); out != "" || (a.m.spec.records && !a.m.c.be.Acked()) {
				// (A once's entry is gone, most likely, because its run
				// ended and told the outcome, and the message was missed:
				// Do reads the records rather than queue again.)
				return a.ended(ctx, out)
			}
			a.renewEntry() // and queue again at once
		default:
			a.note(r, err)
			granted, g, err := a.sleep(ctx)
			a.granted = granted
			if err != nil {
				return a.giveUp(ctx, err)
			}
			if granted {
				if held, err := a.claim(ctx, g); held || err != nil {
					return held, err
				}
			}
			if out := a.told(); out != "" {
				return a.ended(ctx, out)
			}
		}
		r, err = a.call(ctx)
	}
}

// enter makes the attempt a local waiter and subscribes to the lock's
// channel.
func (a *attempt) enter() {
	c := a.m.c
	a.w = &waiter{ev: make(chan struct{}, 1), key: a.key()}
	a.poll = backoff{First: 2 * time.Millisecond, Limit: 100 * time.Millisecond}
	a.splitBo = backoff{First: time.Millisecond, Limit: 50 * time.Millisecond}
	a.timer = time.NewTimer(time.Hour)
	c.mu.Lock()
	st := c.stateLocked(a.m)
	st.waiters = append(st.waiters, a.w)
	st.claimEarlyLocked(a.w)
	c.mu.Unlock()
	if !a.watching {
		a.watching = c.be.Watch(a.m.spec.channel, true)
	}
}

// exit removes the local waiter.
func (a *attempt) exit() {
	c := a.m.c
	a.timer.Stop()
	c.mu.Lock()
	if st := c.locks[a.m.spec.hash()]; st != nil {
		st.removeWaiterLocked(a.w)
	}
	c.mu.Unlock()
}

// note takes in the outcome of a call that did not get the lock.
func (a *attempt) note(r reply, err error) {
	m := a.m
	if err != nil {
		a.lastErr = err
		m.c.report(m.wrapOp(lockOp(a.try), err))
		m.warnRetry(lockOp(a.try), err)
		return
	}
	a.lastErr, a.bo = nil, backoff{}
	a.pttl = time.Duration(r.Val) * time.Millisecond
	a.split = r.Split
	if r.Code == replyQueued {
		a.refreshed, a.heard = a.sent, a.heardAtSend
		if !a.m.c.be.FreshOwners() {
			a.prev = a.entry()
			// From now on the entry is known queued: a call that finds it
			// gone must not add it again (see renewEntry). (A quorum's
			// entries, on servers that may not all have them, are never
			// handed the lock.)
			a.known = true
		}
	}
	if !a.split {
		a.splitBo = backoff{First: time.Millisecond, Limit: 50 * time.Millisecond}
	}
}

// grant is a queue grant a waiter took from a message: the fencing token,
// and the send time the granted entry named (see transport.EntryString).
type grant struct {
	fence, at int64
}

// sleep waits for a message, the time to look again, or the end of the wait.
// It reports a grant of the lock.
func (a *attempt) sleep(ctx context.Context) (granted bool, g grant, err error) {
	c := a.m.c
	select {
	case <-ctx.Done():
		return false, g, ctx.Err()
	case <-c.stopping:
		return false, g, ErrClosed
	default:
	}
	ready := c.be.Ready(a.m.spec.channel)
	if a.heard || c.be.Polling() || a.lastErr != nil {
		ready = nil // nothing to look again for when it is confirmed
	} else if isClosed(ready) {
		return false, g, nil // confirmed since the call: a message may have been missed
	}
	a.timer.Reset(a.nextLook(ready == nil))
	select {
	case <-a.timer.C:
	case <-ready:
	case <-a.w.ev:
		c.mu.Lock()
		granted, g = a.w.granted, a.w.grant
		a.w.granted = false
		c.mu.Unlock()
	case <-ctx.Done():
		return false, g, ctx.Err()
	case <-c.stopping:
		return false, g, ErrClosed
	}
	if !a.timer.Stop() {
		select {
		case <-a.timer.C:
		default:
		}
	}
	if a.split && !granted {
		return false, g, a.holdOff(ctx)
	}
	return granted, g, nil
}

// nextLook is how long to sleep before the next call: the backoff after an
// error; else until the entry's refresh is due or the holder's lease would
// end, and at a polling pace while messages could be missed.
func (a *attempt) nextLook(subscribed bool) time.Duration {
	if a.lastErr != nil {
		return a.bo.Next()
	}
	d := max(a.pttl, time.Millisecond)
	if !a.refreshed.IsZero() {
		d = min(d, time.Until(a.refreshed.Add(a.m.spec.ttl/3)))
	}
	if !subscribed || a.m.c.be.Polling() {
		d = min(d, a.poll.Next())
	}
	return max(d, 0)
}

// holdOff waits a random while after a quorum's contenders split its
// servers between them: woken together by each other's give-backs, they
// could otherwise keep splitting them (Redlock's retry delay).
func (a *attempt) holdOff(ctx context.Context) error {
	a.timer.Reset(a.splitBo.Next())
	select {
	case <-a.timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-a.m.c.stopping:
		return ErrClosed
	}
}

// claim takes a lock the queue handed to the attempt. The grant names the
// entry as the call that last wrote it left it, with that call's send time:
// the grant came after it, so it is valid for its claim lease from then,
// however late its message came, and whichever call of the wait (or copy of
// one) wrote it. The watchdog extends it to the full lease if the hold
// outlives a third of that.
//
// A grant that comes past its claim is neither taken nor given back: the
// wait's next call, sent at once under the same owner token, finds out. If
// the claim is still the owner's in Redis, the call takes the lock for the
// full lease (see acquire.lua: "our field exists"), valid from its own send
// time; if not, the lock has moved on and the call queues the waiter again.
// A grant merely processed late (a busy process) thus keeps the waiter's
// turn, where a give-back would pass it to the next in the queue. Where the
// grant must be confirmed by replicas (WithReplicaAck), the next call
// confirms it in the same way.
func (a *attempt) claim(ctx context.Context, g grant) (bool, error) {
	if a.m.c.be.Acked() {
		return false, nil
	}
	sent := a.m.c.epoch.Add(time.Duration(g.at) * time.Millisecond)
	if !time.Now().Before(sent.Add(validity(a.m.spec.claim))) {
		return false, nil
	}
	return a.complete(ctx, g.fence, sent, a.m.spec.claim)
}

// giveUp ends a wait that will not hold the lock, leaving nothing behind:
// the queue entry is removed in Redis, together with a grant it may have
// received meanwhile, by a leave call posted behind the attempt's last call
// (see transport.PostCtx): it is not waited for. Should it not reach Redis, the entry
// is dropped when its turn comes once the Client no longer listens (or with
// the queue, when nobody refreshes it), and a grant ends by its claim lease.
func (a *attempt) giveUp(ctx context.Context, cause error) (bool, error) {
	a.postLeave(ctx)
	if ctx.Err() != nil && cause == ctx.Err() {
		return false, ctxErr(ctx, a.lastErr)
	}
	return false, cause
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool { return transport.IsClosed(ch) }
