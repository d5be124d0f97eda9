package remutex

import (
	"fmt"
	"time"
)

// EventKind says what an Event reports.
type EventKind int

const (
	// EventAcquired: a goroutine took the lock (a first Lock, not a nested
	// one). Duration is the time from the Lock call until it held the lock.
	EventAcquired EventKind = iota + 1
	// EventWaited: a Lock found the lock busy and waited. Duration is the time
	// it waited; Err is nil if it then held the lock, else why it gave up.
	EventWaited
	// EventReleased: the final Unlock released the lock. Duration is how long
	// it was held.
	EventReleased
	// EventRenewed: the watchdog renewed the hold. Duration is the round trip
	// of the renewal.
	EventRenewed
	// EventLost: the hold was lost. Duration is how long it had been held; Err
	// wraps ErrLockLost and the cause.
	EventLost
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
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event describes something that happened to a lock, for the hook set with
// WithHook: metrics, tracing or logs without remutex depending on a library
// for them.
type Event struct {
	Kind     EventKind
	Lock     string        // the lock's name
	Owner    string        // the hold's owner token: <client id>:<goroutine id>, the id being <32 hex>.<host>.<pid>
	Fence    int64         // the hold's fencing token, 0 without WithFencing
	Duration time.Duration // see the EventKind
	Err      error         // EventWaited (gave up) and EventLost
	Read     bool          // a read hold of a DistRWMutex (false for a DistMutex and for write holds)
}

// WithHook sets a function that is called for every Event of the Client's
// locks. It runs synchronously on the goroutine where the event happened (the
// caller of Lock or Unlock; the watchdog for EventRenewed and most EventLost)
// after remutex released its own locks, so it must be quick and must not
// block; it may call remutex. Default: none.
func WithHook(f func(Event)) Option {
	return func(c *Client) { c.hook = f }
}

// notice is news to pass on once Client.mu is released: an error for the
// error handler, an event for the hook.
type notice struct {
	err error
	ev  Event
}

// announce passes notices on to the error handler and the hook.
func (c *Client) announce(ns []notice) {
	for _, n := range ns {
		if n.err != nil {
			c.report(n.err)
		}
		c.emit(n.ev)
	}
}

func (c *Client) emit(ev Event) {
	if c.hook != nil && ev.Kind != 0 {
		c.hook(ev)
	}
}

// event builds an Event about hold h.
func (h *hold) event(kind EventKind, d time.Duration, err error) Event {
	return Event{Kind: kind, Lock: h.m.spec.name, Owner: ownerString(h.owner), Fence: h.fence, Duration: d, Err: err, Read: h.m.spec.read}
}
