package remutex

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/remutex/remutex/internal/transport"
)

// Per-goroutine hold bookkeeping. The local hold count is the truth: scripts
// are told the count a goroutine has and the count it wants. Everything here
// is guarded by Client.mu.

// closedChan is what Lost returns to a goroutine that holds nothing.
var closedChan = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

// lockState is a Client's local view of one lock: the holds of its
// goroutines and its local waiters in arrival order. DistMutex values of the
// same name share it.
type lockState struct {
	holds   []*hold   // reentrant holds; at most one valid, lost ones until unlocked
	extra   int       // NonReentrant holds, which live on their DistMutex
	waiters []*waiter // FIFO
	// leftovers are holds dropped while their field may still be on the
	// server (see leftOverLocked).
	leftovers []leftover
	// early are messages for queue entries that had no local waiter yet: the
	// call that queued a waiter may return after its grant was sent.
	early []early
	// warned is when a retried error of the lock was last logged, unlogged
	// how many were not since (see warnRetry).
	warned   time.Time
	unlogged int
}

// leftover is a hold whose final release failed (or, lost, whose rollback
// failed): its field may stay on the server until its lease ends there.
type leftover struct {
	owner interface{}
	gid   int64     // its goroutine (NonReentrant: 0)
	until time.Time // its lease's end: then the server has dropped it
	kept  time.Time // the end of its minimum hold (WithMinHold), kept by its release
}

// leftOverLocked records that h was dropped while its field may still be on
// the server. Every acquisition has an owner token of its own, so the field
// cannot be mistaken for a later hold's; but it keeps the lock taken, and the
// next acquisition of the same goroutine would wait for its own ended hold:
// that acquisition releases it first (see clearLeftovers). A quorum's tries
// give back what they got themselves, so nothing is left over for them.
func (m *DistMutex) leftOverLocked(h *hold) {
	if m.c.be.FreshOwners() {
		return
	}
	st := m.c.stateLocked(m)
	st.leftovers = append(st.leftovers, leftover{owner: h.owner, gid: h.gid, until: time.Now().Add(m.spec.Lease), kept: h.acquired.Add(m.spec.minHold)})
}

func (m *DistMutex) leftOver(h *hold) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	m.leftOverLocked(h)
}

// takeLeftoverLocked removes and reports the leftover of owner; expired
// ones go too (the server has dropped their field).
func (st *lockState) takeLeftoverLocked(owner interface{}) bool {
	return len(st.takeLeftoversLocked(func(l leftover) bool { return l.owner == owner })) > 0
}

// takeLeftoversOfLocked removes and returns what goroutine gid left on the
// server.
func (st *lockState) takeLeftoversOfLocked(gid int64) []leftover {
	return st.takeLeftoversLocked(func(l leftover) bool { return l.gid == gid })
}

func (st *lockState) takeLeftoversLocked(match func(leftover) bool) []leftover {
	if len(st.leftovers) == 0 {
		return nil
	}
	var found []leftover
	now, keep := time.Now(), st.leftovers[:0]
	for _, l := range st.leftovers {
		switch {
		case !now.Before(l.until):
		case match(l):
			found = append(found, l)
		default:
			keep = append(keep, l)
		}
	}
	clear(st.leftovers[len(keep):])
	st.leftovers = keep
	return found
}

// clearLeftovers releases, before goroutine gid takes m (or, for a
// DistRWMutex, its other side: a read hold that ran out locally is still a
// reader on the server for a moment), the fields its ended holds may have
// left there; the attempt would otherwise wait for them. What cannot be
// released now stays a leftover, and ends by its lease.
// (Its release keeps the rest of its minimum hold.)
func (m *DistMutex) clearLeftovers(ctx context.Context, ls []leftover) {
	for _, l := range ls {
		if err := rollback(ctx, m.c.be, &m.spec, l.owner, keepArg(l.kept)); err != nil {
			m.c.mu.Lock()
			st := m.c.stateLocked(m)
			st.leftovers = append(st.leftovers, l)
			m.c.mu.Unlock()
		}
	}
}

// early is a message that came before its waiter was registered.
type early struct {
	key     string // its wait (see waitKey)
	granted bool
	grant   grant
	told    string // a DistOnce run's outcome (see waiter.told)
	at      time.Time
}

// keepEarlyLocked keeps a message whose waiter is not registered (yet).
func (st *lockState) keepEarlyLocked(e early) {
	keep := st.early[:0]
	for _, x := range st.early {
		if e.at.Sub(x.at) < maxQueueTTL {
			keep = append(keep, x)
		}
	}
	if len(keep) == maxEarly {
		keep = append(keep[:0], keep[1:]...)
	}
	st.early = append(keep, e)
}

// claimEarlyLocked hands w a message for its entry that came before it was
// registered.
func (st *lockState) claimEarlyLocked(w *waiter) {
	for i, e := range st.early {
		if e.key == w.key {
			w.granted, w.grant, w.told = e.granted, e.grant, e.told
			w.signal()
			st.early = append(st.early[:i], st.early[i+1:]...)
			return
		}
	}
}

func (st *lockState) idle() bool { return len(st.holds) == 0 && st.extra == 0 && len(st.waiters) == 0 }

// hold is one acquisition: a goroutine's (NonReentrant: a DistMutex's) from
// the first Lock to the last Unlock.
type hold struct {
	m     *DistMutex
	owner interface{} // the owner token (a string), boxed once for script calls
	gid   int64
	count int
	fence int64
	id    uint64 // Event.Hold

	acquired time.Time // when the hold began
	valid    time.Time // validity deadline on the monotonic clock
	next     time.Time // next renewal
	inBatch  bool      // a renewal of it is in flight
	ending   bool      // its final release is in flight: renewal replies are moot
	dropped  bool      // no longer listed (unlocked, or forgotten; see endLocked)
	lostCh   chan struct{}
	lostErr  error                     // non-nil once lost; wraps ErrLockLost
	ctxs     []context.CancelCauseFunc // its HoldContexts, ended with it
	outcome  interface{}               // a DistOnce run's: its final release's argument (once_release.lua); nil else
}

func (h *hold) lostChanLocked() chan struct{} {
	if h.lostCh == nil {
		if h.lostErr != nil {
			return closedChan
		}
		h.lostCh = make(chan struct{})
	}
	return h.lostCh
}

// extendLocked moves the validity deadline forward after a successful call
// that set the full lease at sent. (The next renewal stays where it is: a
// nested call's reply races with the watchdog's renewals.)
func (h *hold) extendLocked(sent time.Time) {
	if valid := sent.Add(validity(h.m.spec.Lease)); h.lostErr == nil && valid.After(h.valid) {
		h.valid = valid
	}
}

// validity is how long a grant of d (a lease or a claim lease) counts as
// valid on the local clock, from the send time of the call that made it: d
// minus a drift margin of d/40 + 5ms for clock-rate differences and the
// watchdog waking late on a loaded machine. Renewal comes every lease/3, so a
// wide margin costs nothing while Redis answers.
func validity(d time.Duration) time.Duration { return d - d/40 - 5*time.Millisecond }

// waiter is a goroutine waiting in Lock or LockContext.
type waiter struct {
	ev      chan struct{} // capacity 1: something happened, look again
	key     string        // its wait (see waitKey): what its entries' messages name
	granted bool          // the queue handed it the lock (a grant message)
	grant   grant         // that grant
	// told is the outcome of the DistOnce run it waited for, which the
	// run's final release told it when it removed its entry (an 'o'
	// message): "" none, "d" done, or "e" and the error record.
	told string
}

func (w *waiter) signal() {
	select {
	case w.ev <- struct{}{}:
	default:
	}
}

// stateLocked returns the lock's state, creating it if needed.
func (c *Client) stateLocked(m *DistMutex) *lockState { return c.stateOfLocked(m.spec.hash()) }

// stateOfLocked returns the state of the lock whose holds live in key,
// creating it if needed.
func (c *Client) stateOfLocked(key string) *lockState {
	if st, ok := c.locks[key]; ok {
		return st
	}
	c.sweepLocked()
	st := &lockState{}
	c.locks[key] = st
	return st
}

// sweepLocked removes idle lock states once they make up most of the
// registry: a lock used over and over keeps its state, and the registry stays
// proportional to the locks in use. It looks only when the registry has
// doubled since it last looked, so that creating n states costs O(n) in all.
func (c *Client) sweepLocked() {
	if len(c.locks) < max(64, c.sweepAt) {
		return
	}
	c.sweepAt = 2 * len(c.locks)
	idle := 0
	for _, st := range c.locks {
		if st.idle() {
			idle++
		}
	}
	if idle*2 < len(c.locks) {
		return
	}
	for k, st := range c.locks {
		if st.idle() {
			delete(c.locks, k)
		}
	}
}

func (c *Client) nextSeqLocked() uint64 {
	c.seq++
	return c.seq
}

// holdLocked returns the hold that an Unlock of goroutine gid (NonReentrant:
// of m) ends or lowers: its live hold, else its latest hold that ended by a
// loss and still awaits its Unlocks; nil if there is none.
//
// A hold that is lost ends for its goroutine at once (see liveLocked): the
// next Lock takes the lock anew. Its Unlocks are still owed, and they come
// after those of any hold taken since: a goroutine's Unlocks pair with its
// Locks last-in first-out, as a nested Lock's do.
func (m *DistMutex) holdLocked(gid int64) *hold {
	if !m.reentrant {
		// The latest hold whose final release is not in flight already.
		for i := len(m.nr) - 1; i >= 0; i-- {
			if !m.nr[i].ending {
				return m.nr[i]
			}
		}
		if len(m.nr) > 0 {
			return m.nr[len(m.nr)-1]
		}
		return nil
	}
	st := m.c.locks[m.spec.hash()]
	if st == nil {
		return nil
	}
	var ended *hold
	for _, h := range st.holds {
		if h.gid != gid {
			continue
		}
		if h.lostErr == nil {
			return h
		}
		ended = h
	}
	return ended
}

// liveLocked returns the hold of goroutine gid (NonReentrant: of m) that is
// not lost, or nil: what HoldCount, Lost, Fence and a nested Lock see.
func (m *DistMutex) liveLocked(gid int64) *hold {
	if h := m.holdLocked(gid); h != nil && h.lostErr == nil {
		return h
	}
	return nil
}

func (m *DistMutex) addHoldLocked(h *hold) {
	st := m.c.stateLocked(m)
	if m.reentrant {
		st.holds = append(st.holds, h)
	} else {
		if !m.spec.multi {
			// A mutex has one hold: one still listed was lost and never
			// unlocked (or its final release is in flight, and it goes
			// when that settles).
			for _, old := range slices.Clone(m.nr) {
				if !old.ending {
					m.dropHoldLocked(old)
				}
			}
		}
		m.nr = append(m.nr, h)
		st.extra++
	}
}

// dropHoldLocked forgets a hold whose count reached 0.
func (m *DistMutex) dropHoldLocked(h *hold) {
	c := m.c
	h.dropped = true
	c.wd.removeLocked(h)
	st := c.locks[m.spec.hash()]
	if st == nil {
		return
	}
	if !m.reentrant {
		m.nr = removeHold(m.nr, h)
		st.extra--
		return
	}
	st.holds = removeHold(st.holds, h)
}

func removeHold(hs []*hold, h *hold) []*hold {
	for i, x := range hs {
		if x == h {
			return append(hs[:i], hs[i+1:]...)
		}
	}
	return hs
}

func (st *lockState) removeWaiterLocked(w *waiter) {
	for i, x := range st.waiters {
		if x == w {
			st.waiters = append(st.waiters[:i], st.waiters[i+1:]...)
			return
		}
	}
}

// loseLocked marks h lost: Lost closes, the hold's contexts end, renewal
// stops, and the hold ends for its goroutine (see holdLocked): Unlock will
// report ErrLockLost, and the next Lock takes the lock anew. If the lock's
// field may still be on the server (the validity ran out first), it is a
// leftover that the goroutine's next acquisition clears first, so that it
// does not take the field for its own. It returns the notice to announce
// once c.mu is released (none if h was lost already).
func (c *Client) loseLocked(h *hold, cause error) []notice {
	if h.lostErr != nil {
		return nil
	}
	h.lostErr = fmt.Errorf("%w: %w", ErrLockLost, cause)
	if h.lostCh != nil {
		close(h.lostCh)
	}
	c.wd.removeLocked(h)
	if cause == errExpired || cause == errLeaseEnd {
		h.m.leftOverLocked(h)
	}
	c.endLocked(h)
	c.log.Warn("remutex: lock lost", "lock", h.m.spec.name, "owner", ownerString(h.owner), "fence", h.fence, "cause", cause.Error())
	err := h.m.wrapOp("hold", h.lostErr)
	ev := h.event(EventLost, time.Since(h.acquired), err)
	ev.Reason = lossReason(cause)
	return []notice{{err: err, ev: ev, ctxs: h.takeContextsLocked(), cause: err}}
}

// endLocked keeps h, just lost, for the Unlocks its goroutine owes: folded
// into an earlier lost hold of the same goroutine and lock, whose Unlocks
// come after h's and report the same, or counted towards maxEnded.
func (c *Client) endLocked(h *hold) {
	m := h.m
	if !m.reentrant || h.ending {
		// One hold per DistMutex value, replaced by its next Lock; or a
		// final release in flight, which drops the hold when it settles.
		return
	}
	st := c.stateLocked(m)
	for _, e := range st.holds {
		if e != h && e.gid == h.gid && e.lostErr != nil {
			e.count += h.count
			e.lostErr = h.lostErr
			m.dropHoldLocked(h)
			return
		}
	}
	c.ended = append(c.ended, h)
	if len(c.ended) <= maxEnded {
		return
	}
	// Forget holds unlocked since, then the oldest if still too many.
	keep := c.ended[:0]
	for _, e := range c.ended {
		if !e.dropped {
			keep = append(keep, e)
		}
	}
	clear(c.ended[len(keep):])
	c.ended = keep
	if len(c.ended) > maxEnded {
		old := c.ended[0]
		c.ended = c.ended[1:]
		old.m.dropHoldLocked(old)
	}
}

// backoff is capped exponential backoff with jitter (see
// transport.Backoff).
type backoff = transport.Backoff

// ownerString is an owner token as text.
func ownerString(owner interface{}) string {
	s, _ := owner.(string)
	return s
}
