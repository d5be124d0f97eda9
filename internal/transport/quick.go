package transport

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/remutex/remutex/internal/wire"
)

// quick is what a DistMutex, a DistRWMutex's read side or a DistSemaphore
// sends for its uncontended cycle. Its acquisition is quick_lock.lua
// (quick_rlock.lua, quick_sem.lua), the free path of the full script alone,
// on the keys it reads, with the owner and the lease (a semaphore's holding
// and size too) as its only arguments: Redis pays about as much per
// argument of a script call as per command the script runs. Its final
// release is no script at all: a pipeline of HDEL of the owner's field
// (ZREM of a reader) and EXISTS of the queue, one round trip. A script call
// costs redis-server some 13k instructions before it runs a command, and
// this release needs none: the goroutine's count is known locally; HDEL of
// the owner's own field is idempotent (a resent one finds nothing, as a
// resent release.lua does) and harmless after a loss; and the pipeline needs
// no MULTI, for a waiter that queues after the HDEL finds the lock free and
// takes it, and one that queued before it is seen by the EXISTS, after
// which wake.lua (rwwake.lua, sem_wake.lua) hands the lock to the queue's
// head. Once a
// lock is seen contended (a busy reply, a waiter found at release, a
// hand-off), the full scripts are sent at once for contendedFor, so that a
// contended lock does not pay two calls where one does.
type Quick struct {
	lock, wake           *Script
	lockKeys, fencedKeys []interface{}
	// A semaphore's unfenced Acquire(1) once its size was found right:
	// quick_lock.lua on the holders and the queue (see quick_sem.lua).
	oneKeys []interface{}
	del     interface{}   // "hdel", or "zrem" for a reader (held as an interface: no conversion per release)
	delKey  interface{}   // the key of the holds
	look    []interface{} // EXISTS of the queue (read only: shared by the calls)
	Until   *atomic.Int64 // unix ns: contended until then (shared with other locks)
}

// NewQuick returns the uncontended cycle that build (MutexQuick,
// ReadQuick, SemQuick) makes on a lock's keys (see wire.LockKeys,
// wire.RWKeys), or nil for no build; until is where the lock's contention
// is marked (shared with other locks).
func NewQuick(build func(q *Quick, keys []string) *Quick, keys []string, until *atomic.Int64) *Quick {
	if build == nil {
		return nil
	}
	hash, queue := keys[0], keys[2]
	q := build(&Quick{del: "hdel", delKey: hash, look: []interface{}{"exists", queue}, Until: until}, keys)
	q.fencedKeys = append(slices.Clip(q.lockKeys), keys[1])
	return q
}

// MutexQuick is the uncontended cycle of a DistMutex (and a DistOnce's
// lock): quick_lock.lua on the hash and the queue, HDEL, wake.lua.
func MutexQuick(q *Quick, keys []string) *Quick {
	q.lock, q.wake, q.lockKeys = QuickLock, WakeScript, []interface{}{keys[0], keys[2]}
	return q
}

// ReadQuick is a DistRWMutex's readers': quick_rlock.lua, which also reads
// the readers, ZREM of the reader, rwwake.lua.
func ReadQuick(q *Quick, keys []string) *Quick {
	readers := keys[3]
	q.lock, q.wake, q.lockKeys = QuickRLock, RWWake, []interface{}{keys[0], keys[2], readers}
	q.del, q.delKey = "zrem", readers
	return q
}

// SemQuick is a DistSemaphore's: quick_sem.lua, which also reads the size,
// HDEL of the holding, sem_wake.lua; an unfenced Acquire(1), once the size
// is known right, runs quick_lock.lua (see QuickLock).
func SemQuick(q *Quick, keys []string) *Quick {
	q.oneKeys = []interface{}{keys[0], keys[2]}
	q.lock, q.wake, q.lockKeys = QuickSem, SemWake, []interface{}{keys[0], keys[2], keys[3]}
	return q
}

// calm says whether the lock has not been seen contended lately.
func (q *Quick) calm() bool { return q != nil && time.Now().UnixNano() >= q.Until.Load() }

// Contended marks the lock contended: the full scripts for contendedFor.
func (q *Quick) Contended() {
	if q != nil {
		q.Until.Store(time.Now().Add(contendedFor).UnixNano())
	}
}

// quickLock runs the lock's quick_lock.lua or quick_rlock.lua: granted with
// the fence token (0 without fencing), or not (the lock is not free), the
// lock then marked contended.
func (n *node) quickLock(ctx context.Context, s *Spec, r AcquireReq) (granted bool, fence int64, err error) {
	q := s.Quick
	keys := q.lockKeys
	if r.Fence != FenceOff {
		keys = q.fencedKeys
	}
	var v interface{}
	switch {
	case !s.Permits:
		v, err = n.evalTry(ctx, r.Try, keys, q.lock, r.Owner, r.Lease)
	case r.Want == 1 && r.Fence == FenceOff && s.Sized.Load():
		// (A fenced holding keeps its token in its value: quick_sem.lua.)
		v, err = n.evalTry(ctx, r.Try, q.oneKeys, QuickLock, r.Owner, r.Lease)
	case r.Want == 1:
		v, err = n.evalTry(ctx, r.Try, keys, q.lock, r.Owner, r.Lease, s.Size)
	default:
		v, err = n.evalTry(ctx, r.Try, keys, q.lock, r.Owner, r.Lease, s.Size, strconv.Itoa(r.Want))
	}
	if err != nil {
		return false, 0, err
	}
	f, err := wire.Int64(v)
	switch {
	case err != nil:
		return false, 0, err
	case f < 0:
		s.Quick.Contended()
		return false, 0, nil
	}
	return true, f, nil
}

// quickRelease is the final release of an uncontended hold: HDEL (ZREM) and
// EXISTS of the queue in one round trip, then, only if somebody waits,
// wake.lua (rwwake.lua) to pass the lock on. Its replies are release.lua's.
// A reply error of the HDEL (a key of another type) means the hold is not
// there: not held, as release.lua answers.
func (n *node) quickRelease(ctx context.Context, s *Spec, owner interface{}) (int64, error) {
	q := s.Quick
	pc := pairPool.Get().(*pairCalls)
	del, look := &pc.calls[0], &pc.calls[1]
	*del = call{args: append(pc.args[:0], q.del, q.delKey, owner), once: true}
	*look = call{args: q.look, look: true}
	if err := n.batch.doPair(ctx, del, look); err != nil {
		return 0, err // (not put back: the drainer may still send pc's arguments)
	}
	defer pairPool.Put(pc)
	if held, err := n.held(del); !held {
		return wire.NotHeld, err
	}
	if waiting, err := look.cmd.Int64(); err != nil || waiting == 0 {
		return wire.Done, nil // (an error: the waiters look again at their next refresh)
	}
	q.Contended()
	v, err := n.eval(ctx, s, q.wake, n.pub(ctx))
	return n.woken(s, v, err), nil
}

// held reads a release's HDEL (ZREM) of its field: whether the hold was
// there, or the round trip's error. A reply error (a key of another type)
// means the hold is not there: not held, as release.lua answers.
func (n *node) held(del *call) (bool, error) {
	gone, err := del.cmd.Int64()
	switch {
	case err != nil && IsReply(err):
		return false, nil
	case err != nil:
		n.reloadAfter(err)
		return false, err
	}
	return gone == 1, nil
}

// woken is a release's reply after wake.lua answered v or err: handed off,
// or done. A wake that failed is logged: the release itself is done.
func (n *node) woken(s *Spec, v interface{}, err error) int64 {
	if err != nil {
		n.log.Warn("remutex: waking the queue after a release failed; its waiters look again at their next refresh", "lock", s.Name, "err", err)
		return wire.Done
	}
	if res, _ := wire.Int64(v); res == wire.Handoff {
		return wire.Handoff
	}
	return wire.Done
}

// hands says whether the lock's contended final release can be handRelease:
// a DistMutex's, whose wake.lua passes the lock on as release.lua would.
func (q *Quick) hands() bool { return q != nil && q.wake == WakeScript }

// handRelease is the final release of a hold on a lock seen contended: HDEL
// of the owner's field and wake.lua, in one pipeline, one round trip, as
// release.lua's one call would be. It is the quick release with wake.lua
// sent at once instead of EXISTS (the lock was seen contended: somebody
// likely waits), and what it leaves in Redis is release.lua's: HDEL is
// idempotent and names this acquisition's owner, as release.lua's does, and
// wake.lua hands a free lock to the queue's head, as release.lua does after
// it, and does nothing to a lock held (by a newcomer that came between the
// two, which acquire.lua made the head's first: newcomers still queue).
//
// redis-server writes the replies of a round trip after its last command,
// the client queued last first (it puts a client with a reply at the front
// of its list of clients to write to): the releaser is queued by the HDEL's
// reply, the waiter's Client after it by wake.lua's message, so the
// message goes out before the releaser's replies, where release.lua's
// reply went out before it. And wake.lua, with one argument where
// release.lua has four, costs Redis less (docs/performance.md has both).
func (n *node) handRelease(ctx context.Context, s *Spec, owner interface{}) (int64, error) {
	q := s.Quick
	pc := pairPool.Get().(*pairCalls)
	del, wake := &pc.calls[0], &pc.calls[1]
	*del = call{args: append(pc.args[:0], q.del, q.delKey, owner), once: true}
	pc.pub[0] = n.pub(ctx)
	*wake = call{s: q.wake, keys: s.KeyArgs, args: pc.pub[:], buf: pc.built[:0]}
	if err := n.batch.doPair(ctx, del, wake); err != nil {
		return 0, err // (not put back: the drainer may still send pc's arguments)
	}
	defer func() {
		clear(pc.built[:])
		pairPool.Put(pc)
	}()
	if held, err := n.held(del); !held {
		return wire.NotHeld, err
	}
	v, err := n.answer(wake.cmd)
	res := n.woken(s, v, err)
	if res == wire.Handoff {
		q.Contended()
	}
	return res, nil
}

// pairCalls are the two calls of a quickRelease or handRelease, pooled: a
// cycle allocates what go-redis needs, little more.
type pairCalls struct {
	calls [2]call
	args  []interface{}
	pub   [1]interface{} // wake.lua's argument
	built [8]interface{} // wake.lua's command (see call.build)
}

var pairPool = sync.Pool{New: func() any { return &pairCalls{args: make([]interface{}, 0, 3)} }}
