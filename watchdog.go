package remutex

import (
	"context"
	"time"
)

// watchdog renews every hold of a Client. One goroutine does it, started with
// the first hold and stopped and joined by Close; it keeps no goroutine or
// timer per lock. Holds that are due are renewed together: one script call per
// cluster slot (one in all on a single node), sent in one pipeline (see
// node.renew). The
// pipeline runs in a helper goroutine the watchdog owns, so that a reply that
// never comes cannot keep the watchdog from declaring holds lost when their
// validity deadline passes.
//
// A hold is valid until the send time of its last successful acquire or
// renewal plus its lease minus a drift margin. A renewal whose reply arrives
// after that counts as failed. A renewal that finds another owner loses the
// hold at once; failed renewals are retried sooner, and when the deadline
// passes without success the hold is lost.
type watchdog struct {
	c       *Client
	holds   map[*hold]struct{} // guarded by c.mu
	started bool               // guarded by c.mu
	wake    time.Time          // when the goroutine looks next; guarded by c.mu
	timer   *time.Timer        // fires at wake; reset under c.mu
	quit    chan struct{}
	done    chan struct{}
}

// addLocked starts tracking h, starting the goroutine on first use.
func (w *watchdog) addLocked(h *hold) {
	if w.holds == nil {
		w.holds = make(map[*hold]struct{})
		w.timer = time.NewTimer(time.Hour)
		w.quit = make(chan struct{})
		w.done = make(chan struct{})
	}
	w.holds[h] = struct{}{}
	if !w.started {
		w.started = true
		go w.run()
	}
	// Bring the goroutine's wake-up forward only if it would look too late
	// for h. Moving its timer does not wake it: a Lock+Unlock cycle does not
	// cost a goroutine switch, and taking many locks not a scan of every
	// hold each.
	if t := earliest(h.next, h.valid); w.wake.IsZero() || t.Before(w.wake) {
		w.wake = t
		w.timer.Reset(time.Until(t))
	}
}

// renewWindow is how early a hold may be renewed: when one hold is due, every
// hold past half its renewal interval goes along, so that holds taken at
// different moments come to share one round trip per interval.
func renewWindow(h *hold) time.Duration { return h.m.spec.Lease / 6 }

func (w *watchdog) removeLocked(h *hold) {
	delete(w.holds, h)
	w.drainedLocked()
}

// drainedLocked tells Shutdown that no live hold is left, once none is.
func (w *watchdog) drainedLocked() {
	c := w.c
	if c.draining && len(w.holds) == 0 && !isClosed(c.drained) {
		close(c.drained)
	}
}

// loseAllLocked marks every tracked hold lost (Close) and returns the notices.
func (w *watchdog) loseAllLocked(cause error) (lost []notice) {
	for h := range w.holds {
		lost = append(lost, w.c.loseLocked(h, cause)...)
	}
	return lost
}

// stop ends the goroutine and waits for it (and any renewal in flight).
func (w *watchdog) stop() {
	w.c.mu.Lock()
	started := w.started
	w.c.mu.Unlock()
	if started {
		close(w.quit)
		<-w.done
	}
}

type renewal struct {
	holds []*hold
	sent  time.Time
	res   []int64 // per hold: 1 renewed, 0 not ours, -1 failed
}

func (w *watchdog) run() {
	defer close(w.done)
	defer w.timer.Stop()
	var inflight chan *renewal
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for {
		due, lost := w.scan(inflight != nil)
		w.c.announce(lost)
		if len(due) > 0 {
			inflight = make(chan *renewal, 1)
			go w.renew(ctx, due, inflight)
		}
		select {
		case <-w.timer.C:
		case r := <-inflight:
			inflight = nil
			w.c.announce(w.apply(r))
		case <-w.quit:
			cancel()
			if inflight != nil {
				<-inflight
			}
			return
		}
	}
}

// scan loses the holds past their deadline, picks the holds due for renewal
// (unless a renewal is in flight) and sets the timer for the next look.
func (w *watchdog) scan(busy bool) (due []*hold, lost []notice) {
	c := w.c
	now := time.Now()
	wake := now.Add(time.Hour)
	var (
		near     []*hold // holds within their renewal window
		nearWake = wake
		anyDue   bool
	)
	c.mu.Lock()
	defer c.mu.Unlock()
	for h := range w.holds {
		if !now.Before(h.valid) {
			cause := errExpired
			if !h.m.renew {
				cause = errLeaseEnd
			}
			lost = append(lost, c.loseLocked(h, cause)...)
			continue
		}
		wake = earliest(wake, h.valid)
		if !h.m.renew || h.inBatch || h.ending || busy {
			// A renewal in flight wakes the loop when it ends. A hold whose
			// final release is in flight needs none: the reply would be moot,
			// and the hold would be sent again after each moot reply.
			continue
		}
		if now.Before(h.next.Add(-renewWindow(h))) {
			wake = earliest(wake, h.next)
			continue
		}
		// Within its window: renewed now if some hold is due.
		near = append(near, h)
		nearWake = earliest(nearWake, h.next)
		anyDue = anyDue || !now.Before(h.next)
	}
	if anyDue {
		for _, h := range near {
			h.inBatch = true
		}
		due = near
	} else {
		wake = earliest(wake, nearWake)
	}
	w.wake = wake
	w.timer.Reset(time.Until(wake))
	return due, lost
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// renew sends the renewal of holds and passes the outcome back. What it
// needs of the holds is read under c.mu: their goroutines change them.
func (w *watchdog) renew(ctx context.Context, holds []*hold, out chan<- *renewal) {
	c := w.c
	r := &renewal{holds: holds, sent: time.Now()}
	items := make([]renewItem, len(holds))
	c.mu.Lock()
	// A reply later than the earliest deadline is useless: stop waiting then.
	deadline := holds[0].valid
	for i, h := range holds {
		deadline = earliest(deadline, h.valid)
		items[i] = renewItem{Key: h.m.spec.hash(), Owner: h.owner, Lease: h.m.spec.renewArg}
	}
	c.mu.Unlock()
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	r.res = c.be.Renew(ctx, items)
	out <- r
}

// apply records the outcome of a renewal round trip.
func (w *watchdog) apply(r *renewal) (news []notice) {
	c := w.c
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, h := range r.holds {
		h.inBatch = false
		if _, ok := w.holds[h]; !ok || h.ending {
			continue // unlocked, being unlocked, or lost meanwhile
		}
		switch {
		case r.res[i] == 0:
			news = append(news, c.loseLocked(h, errDenied)...)
		case r.res[i] == 1 && now.Before(h.valid):
			h.extendLocked(r.sent)
			h.next = r.sent.Add(h.m.spec.Lease / 3)
			if c.hook != nil {
				news = append(news, notice{ev: h.event(EventRenewed, now.Sub(r.sent), nil)})
			}
		default:
			// Failed or too late: try again soon; scan loses the hold when
			// its deadline passes first.
			h.next = now.Add(max(h.m.spec.Lease/12, 5*time.Millisecond))
			if c.hook != nil {
				news = append(news, notice{ev: h.event(EventRenewFailed, now.Sub(r.sent), errRenewFailed)})
			}
		}
	}
	return news
}
