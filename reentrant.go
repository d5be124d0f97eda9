package remutex

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Per-goroutine hold bookkeeping. The local hold count is the truth: scripts
// are told the count a goroutine has and the count it wants. Everything here
// is guarded by Client.mu.

var (
	errHoldGone = errors.New("the lock's key no longer holds this owner (expired, deleted or overwritten)")
	errExpired  = errors.New("no renewal succeeded before the lease's validity deadline")
	errDenied   = errors.New("renewal found the lock no longer held by this owner (its key expired, was deleted, or is held by another)")
)

// closedChan is what Lost returns to a goroutine that holds nothing.
var closedChan = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

// lockKeys are the keys and channel of one lock, computed once per DistMutex,
// boxed once for script calls.
type lockKeys struct {
	keys       [5]string // hash, fence, queue, queue:alive, last
	args       []interface{}
	channel    string
	channelArg interface{}
}

func newLockKeys(prefix, name string) lockKeys {
	hash := prefix + "{" + name + "}"
	k := lockKeys{
		keys:    [5]string{hash, hash + ":fence", hash + ":queue", hash + ":queue:alive", hash + ":last"},
		channel: hash + ":released",
	}
	k.args = make([]interface{}, len(k.keys))
	for i, s := range k.keys {
		k.args[i] = s
	}
	k.channelArg = k.channel
	return k
}

func (k *lockKeys) hash() string { return k.keys[0] }

// hashTag returns the part of key Redis Cluster hashes: the text between the
// first '{' and the next '}', or "" when that is empty or missing.
func hashTag(key string) string {
	_, rest, ok := strings.Cut(key, "{")
	if !ok {
		return ""
	}
	tag, _, ok := strings.Cut(rest, "}")
	if !ok {
		return ""
	}
	return tag
}

// lockState is a Client's local view of one lock: the holds of its
// goroutines and its local waiters in arrival order. DistMutex values of the
// same name share it.
type lockState struct {
	key     string
	holds   []*hold   // reentrant holds; at most one valid, lost ones until unlocked
	extra   int       // NonReentrant holds, which live on their DistMutex
	waiters []*waiter // FIFO
	// lastOwner is the latest reentrant hold, kept so that the goroutine that
	// held the lock last can take it again without building its owner token.
	lastOwner *hold
}

func (st *lockState) idle() bool { return len(st.holds) == 0 && st.extra == 0 && len(st.waiters) == 0 }

// hold is one acquisition: a goroutine's (NonReentrant: a DistMutex's) from
// the first Lock to the last Unlock.
type hold struct {
	m        *DistMutex
	owner    string
	ownerArg interface{}
	relID    interface{} // unique per hold (with owner): marks its final release
	gid      int64
	count    int
	fence    int64

	acquired time.Time // when the hold began
	valid    time.Time // validity deadline on the monotonic clock
	next     time.Time // next renewal
	inBatch  bool      // a renewal of it is in flight
	ending   bool      // its final release is in flight: renewal replies are moot
	lostCh   chan struct{}
	lostErr  error // non-nil once lost; wraps ErrLockLost
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
// that set the full lease.
func (h *hold) extendLocked(valid time.Time) {
	if h.lostErr == nil && valid.After(h.valid) {
		h.valid = valid
	}
}

// waiter is a goroutine waiting in Lock or LockContext.
type waiter struct {
	ev      chan struct{} // capacity 1: something happened, look again
	entry   string        // its entry in the Redis queue, "" in normal mode
	granted bool          // the queue handed it the lock (grant message)
	fence   int64
}

func (w *waiter) signal() {
	select {
	case w.ev <- struct{}{}:
	default:
	}
}

// stateLocked returns the lock's state, creating it if needed.
func (c *Client) stateLocked(m *DistMutex) *lockState {
	key := m.k.hash()
	if st, ok := c.locks[key]; ok {
		return st
	}
	c.sweepLocked()
	st := &lockState{key: key}
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

// holdLocked returns the hold of goroutine gid (NonReentrant: of m), or nil.
func (m *DistMutex) holdLocked(gid int64) *hold {
	if !m.reentrant {
		return m.nr
	}
	st := m.c.locks[m.k.hash()]
	if st == nil {
		return nil
	}
	for _, h := range st.holds {
		if h.gid == gid {
			return h
		}
	}
	return nil
}

func (m *DistMutex) addHoldLocked(h *hold) {
	st := m.c.stateLocked(m)
	if m.reentrant {
		st.holds = append(st.holds, h)
		st.lastOwner = h
	} else {
		m.nr = h
		st.extra++
	}
}

// dropHoldLocked forgets a hold whose count reached 0.
func (m *DistMutex) dropHoldLocked(h *hold) {
	c := m.c
	c.wd.removeLocked(h)
	st := c.locks[m.k.hash()]
	if !m.reentrant {
		if m.nr == h {
			m.nr = nil
			if st != nil {
				st.extra--
			}
		}
		return
	}
	if st == nil {
		return
	}
	for i, x := range st.holds {
		if x == h {
			st.holds = append(st.holds[:i], st.holds[i+1:]...)
			break
		}
	}
}

// wakeHeadLocked tells the first local waiter in normal mode (or, if all are
// queued in Redis, the first one) to try again.
func (m *DistMutex) wakeHeadLocked() {
	if st := m.c.locks[m.k.hash()]; st != nil {
		st.wakeHeadLocked()
	}
}

func (st *lockState) wakeHeadLocked() {
	for _, w := range st.waiters {
		if w.entry == "" {
			w.signal()
			return
		}
	}
	if len(st.waiters) > 0 {
		st.waiters[0].signal()
	}
}

func (st *lockState) removeWaiterLocked(w *waiter) {
	for i, x := range st.waiters {
		if x == w {
			st.waiters = append(st.waiters[:i], st.waiters[i+1:]...)
			return
		}
	}
}

// loseLocked marks h lost: Lost closes, renewal stops, Unlock will report
// ErrLockLost. It returns the notice to announce once c.mu is released (none
// if h was lost already).
func (c *Client) loseLocked(h *hold, cause error) []notice {
	if h.lostErr != nil {
		return nil
	}
	h.lostErr = fmt.Errorf("%w: %w", ErrLockLost, cause)
	if h.lostCh != nil {
		close(h.lostCh)
	}
	c.wd.removeLocked(h)
	c.log.Warn("remutex: lock lost", "lock", h.m.name, "owner", h.owner, "fence", h.fence, "cause", cause.Error())
	err := h.m.wrap(h.lostErr)
	return []notice{{err: err, ev: h.event(EventLost, time.Since(h.acquired), err)}}
}

// jitter returns a random duration in [0, d).
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}
