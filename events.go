package remutex

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// EventKind says what an Event reports.
type EventKind int

const (
	// EventAcquired: a goroutine took the lock (a first Lock, not a nested
	// one). Duration is the time from the Lock call until it held the lock;
	// Granted says whether the queue handed it over.
	EventAcquired EventKind = iota + 1
	// EventWaited: a Lock that found the lock busy stopped waiting. Duration
	// is the time from the Lock call until then; Err is nil if it then held
	// the lock (reported by EventAcquired just before), or if it waited in a
	// DistOnce's Do whose run ended and told it the outcome (no
	// EventAcquired then), else why it gave up: it wraps
	// context.DeadlineExceeded or context.Canceled when ctx ended the wait.
	EventWaited
	// EventReleased: the final Unlock released the lock. Duration is how long
	// it was held. Err is nil, or the error of a release that failed: the
	// hold was dropped locally all the same, and the lock expires on the
	// server within its lease.
	EventReleased
	// EventRenewed: the watchdog renewed the hold. Duration is the round trip
	// of the renewal.
	EventRenewed
	// EventLost: the hold was lost. Duration is how long it had been held; Err
	// wraps ErrLockLost and the cause, Reason names the cause.
	EventLost
	// EventWaiting: a Lock found the lock busy and begins to wait (or its
	// context ended during its first call, which may have queued it); an
	// EventWaited follows when the wait ends. Duration is the time from the
	// Lock call until then. A Lock whose context has ended before the call
	// reports neither.
	EventWaiting
	// EventRenewFailed: a renewal of the hold failed (a Redis error, or no
	// reply before the hold's validity deadline). The watchdog tries again
	// soon; if no renewal succeeds before that deadline, EventLost follows.
	// Duration is the time the renewal took; Err says it failed (the Redis
	// error itself goes to the Client's logger). A renewal that finds the
	// lock no longer held by the owner is not a failure but a loss
	// (EventLost, LossDenied).
	EventRenewFailed
)

func (k EventKind) String() string {
	switch k {
	case EventAcquired:
		return "acquired"
	case EventWaited:
		return "waited"
	case EventReleased:
		return "released"
	case EventRenewed:
		return "renewed"
	case EventLost:
		return "lost"
	case EventWaiting:
		return "waiting"
	case EventRenewFailed:
		return "renew_failed"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// LossReason says why a hold was lost (Event.Reason of an EventLost).
type LossReason int

const (
	// LossExpired: no renewal succeeded before the hold's validity deadline
	// (Redis unreachable or too slow for longer than the lease allows).
	LossExpired LossReason = iota + 1
	// LossDenied: a renewal found the lock no longer held by the owner (its
	// key expired, was deleted, or is held by another).
	LossDenied
	// LossGone: a nested Lock or an Unlock found the lock no longer held by
	// the owner.
	LossGone
	// LossLeaseEnd: the fixed lease of a WithoutRenewal hold ran out.
	LossLeaseEnd
	// LossClosed: Client.Close ended the hold.
	LossClosed
)

func (r LossReason) String() string {
	switch r {
	case LossExpired:
		return "expired"
	case LossDenied:
		return "denied"
	case LossGone:
		return "gone"
	case LossLeaseEnd:
		return "lease_end"
	case LossClosed:
		return "closed"
	}
	return fmt.Sprintf("LossReason(%d)", int(r))
}

// lossReason names a cause that loseLocked was given.
func lossReason(cause error) LossReason {
	switch cause {
	case errExpired:
		return LossExpired
	case errDenied:
		return LossDenied
	case errLeaseEnd:
		return LossLeaseEnd
	case ErrClosed:
		return LossClosed
	}
	return LossGone
}

// errRenewFailed is the Err of an EventRenewFailed.
var errRenewFailed = errors.New("remutex: renewal failed (Redis error or no reply before the hold's validity deadline); retrying")

// Event describes something that happened to a lock, for the hook set with
// WithHook: metrics, tracing or logs without remutex depending on a library
// for them.
//
// Every EventAcquired is followed, once the hold ends, by exactly one
// EventReleased or EventLost of the same Hold; every EventWaiting by one
// EventWaited. The events of different goroutines may reach the hook in
// another order than they happened: the next holder's EventAcquired may come
// before the previous holder's EventReleased.
type Event struct {
	Kind     EventKind
	Lock     string        // the lock's name
	Owner    string        // the hold's owner token: <client id>:<goroutine id>.<n>, one per acquisition, the id being <22 base64url>.<host>.<pid>
	Fence    int64         // the hold's fencing token, 0 without WithFencing
	Duration time.Duration // see the EventKind
	Err      error         // EventWaited (gave up), EventReleased (release failed), EventRenewFailed and EventLost
	Read     bool          // a read hold of a DistRWMutex (false for a DistMutex, for write holds and for a DistSemaphore's acquisitions)

	// Hold tells the Client's holds apart: the events of one hold, from its
	// EventAcquired to its EventReleased or EventLost, carry the same
	// nonzero number, which no other hold of the Client (same client id in
	// Owner) carries. 0 for EventWaiting and EventWaited.
	Hold uint64
	// Granted: for EventAcquired, the lock was handed to this waiter by the
	// queue (a grant at a release, on a single server) rather than taken
	// free by its own call.
	Granted bool
	// Reason: for EventLost, why the hold was lost.
	Reason LossReason
	// Context is the context of the call the event happened in: the ctx of
	// LockContext or TryLockContext for EventWaiting, EventWaited and
	// EventAcquired (context.Background() for Lock; TryLock's own deadline
	// context), so that a hook can relate the event to the caller's trace.
	// It is context.Background() for the other events. It is valid during
	// the hook call only: a hook must not keep it.
	Context context.Context
}

// WithHook sets a function that is called for every Event of the Client's
// locks. It runs synchronously on the goroutine where the event happened (the
// caller of Lock or Unlock; the watchdog for EventRenewed and most EventLost)
// after remutex released its own locks, so it must be quick and must not
// block; it may call remutex. Default: none.
func WithHook(f func(Event)) Option {
	return func(c *Client) { c.hook = f }
}

// notice is news to pass on once Client.mu is released: contexts of a hold
// to end (with cause), an error for the error handler, an event for the
// hook.
type notice struct {
	err   error
	ev    Event
	ctxs  []context.CancelCauseFunc
	cause error
}

// announce ends the contexts of notices, then passes them on to the error
// handler and the hook.
func (c *Client) announce(ns []notice) {
	for _, n := range ns {
		for _, cancel := range n.ctxs {
			cancel(n.cause)
		}
		if n.err != nil {
			c.report(n.err)
		}
		c.emit(n.ev)
	}
}

func (c *Client) emit(ev Event) {
	if c.hook != nil && ev.Kind != 0 {
		if ev.Context == nil {
			ev.Context = context.Background()
		}
		c.hook(ev)
	}
}

// event builds an Event about hold h.
func (h *hold) event(kind EventKind, d time.Duration, err error) Event {
	return Event{Kind: kind, Lock: h.m.spec.name, Owner: ownerString(h.owner), Fence: h.fence, Duration: d, Err: err, Read: h.m.spec.read, Hold: h.id}
}

// giveUpAtOnce is giveUp for a Lock whose first call ctx cut off: Redis may
// have queued the caller, so to a hook it is a wait that ended at once
// (EventWaiting, then EventWaited with the error).
func (a *attempt) giveUpAtOnce(ctx context.Context, cause error) (bool, error) {
	c := a.m.c
	if c.hook == nil {
		return a.giveUp(ctx, cause)
	}
	c.emit(a.waitEvent(ctx, EventWaiting, nil))
	held, err := a.giveUp(ctx, cause)
	c.emit(a.waitEvent(ctx, EventWaited, err))
	return held, err
}

// waitEvent builds an Event about attempt a's wait, which began at its Lock
// call.
func (a *attempt) waitEvent(ctx context.Context, kind EventKind, err error) Event {
	return Event{Kind: kind, Lock: a.m.spec.name, Owner: ownerString(a.owner), Duration: time.Since(a.start), Err: err, Read: a.m.spec.read, Context: ctx}
}
