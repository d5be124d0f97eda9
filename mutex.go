package remutex

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/petermattis/goid"
)

// Limits of NewMutex and its options.
const (
	// DefaultLease is the lease of a mutex without WithLease.
	DefaultLease = 30 * time.Second
	// MinLease and MaxLease bound WithLease.
	MinLease = 50 * time.Millisecond
	MaxLease = 24 * time.Hour
	// MaxNameLen is the longest lock name NewMutex accepts, in bytes.
	MaxNameLen = 1024
)

// DistMutex is a mutual exclusion lock shared by every process that uses the
// same name on the same Redis. Create it with Client.NewMutex (a zero
// DistMutex is not usable: its methods panic); it must not be copied after
// first use.
//
// Holds belong to goroutines, not to the DistMutex value: two DistMutex values
// of one name and Client share their holds, so a goroutine may Lock one and
// Unlock the other. A goroutine that already holds the lock and locks it again
// only raises its hold count (see NonReentrant for sync.Mutex behaviour).
//
// The lock is held while its lease, renewed by the Client's watchdog, lasts:
// no two goroutines anywhere hold it while a lease is valid. If the lease is
// lost anyway (Redis unreachable past the lease, the key deleted), Lost
// closes and Unlock reports ErrLockLost. Use fencing (WithFencing) where a
// holder that was paused past its lease must not write.
type DistMutex struct {
	_         noCopy
	c         *Client
	spec      lockSpec
	renew     bool
	reentrant bool
	// NonReentrant: the holds of the value, in the order taken (a
	// DistMutex has at most one; a DistRWMutex's read side one per RLock);
	// guarded by c.mu.
	nr []*hold
	// pair is the other side of a DistRWMutex (its write side for the read
	// side, and the reverse); nil for a DistMutex.
	pair *DistMutex
}

var _ sync.Locker = (*DistMutex)(nil)

type mutexConfig struct {
	lease        time.Duration
	minHold      time.Duration
	noRenew      bool
	fencing      bool
	nonReentrant bool
}

// MutexOption configures a DistMutex.
type MutexOption func(*mutexConfig)

// WithLease sets the lease: how long the lock outlives a holder that stops
// renewing it (a crashed process), and how long a WithoutRenewal hold lasts.
// Default 30s; valid from 50ms to 24h, anything else panics in NewMutex.
func WithLease(d time.Duration) MutexOption {
	return func(m *mutexConfig) { m.lease = d }
}

// WithoutRenewal makes the lease fixed: the watchdog does not renew it, and
// when the lease runs out (as with SET NX PX) the hold ends for its
// goroutine: Lost closes, HoldCount is 0, the next Lock or TryLock takes the
// lock anew, and the ended hold's Unlock reports ErrLockLost. "Hold for a
// fixed time" is this option and a TryLock per tick, without Unlock. Nested
// locks do not extend it. Default: holds are renewed every lease/3 until
// unlocked.
func WithoutRenewal() MutexOption {
	return func(m *mutexConfig) { m.noRenew = true }
}

// WithMinHold makes a released hold keep the lock taken until d has passed
// since it was acquired, as ShedLock's "lock at least for": the final Unlock
// ends the goroutine's hold as usual (HoldCount 0, Lost and the hold's
// contexts untouched), but the lock's key stays, held by nobody, until then,
// so that the same job started by other processes a little later (clocks and
// schedulers differ) finds it taken and skips the run. A hold released after
// d frees the lock at once. The time counts from when the acquisition's
// reply (or grant) reached this process, so that the key stays at least d
// after Redis granted it. Inspect shows such a key's holder with Kept set
// and the time left as its TTL; ForceUnlock releases it; deleting the key
// frees it early. With WithoutRenewal (the fixed lease: "lock at most for")
// d must not exceed the lease. For scheduled jobs: a tick of T and clock
// skew S want S < d < T. Every release that ends a hold keeps its minimum
// hold, also one sent again in the background after a call cut off; one
// that cannot reach Redis before the hold's lease ends there (a partition)
// cannot, and the key then ends with the lease. Default: 0, the lock is
// free at Unlock. d outside
// MinLease..MaxLease (or above a fixed lease) panics in NewMutex, as does
// the option for a DistRWMutex.
func WithMinHold(d time.Duration) MutexOption {
	return func(m *mutexConfig) { m.minHold = d }
}

// WithFencing makes every acquisition draw a fencing token from a counter in
// Redis (key P{N}:fence, kept without expiry). Tokens strictly increase
// across acquisitions by any Client, also after a Redis restart without
// persistence (the counter is re-seeded from the server's clock in µs).
// Nested acquisitions keep the token of their hold. Default: off, Fence is 0.
func WithFencing() MutexOption {
	return func(m *mutexConfig) { m.fencing = true }
}

// NonReentrant makes the mutex behave exactly like sync.Mutex: a second Lock
// blocks whichever goroutine calls it, and any goroutine may Unlock. The hold
// then belongs to the DistMutex value (HoldCount is 0 or 1 for every
// goroutine, Lost and Fence describe the mutex's hold). Default: reentrant
// per goroutine.
func NonReentrant() MutexOption {
	return func(m *mutexConfig) { m.nonReentrant = true }
}

// NewMutex returns the mutex called name. Its keys are P{name},
// P{name}:fence and P{name}:waiting for the Client's prefix P, and the Client hears of it on the channel
// P{name}:released:<client id>: one cluster slot. It sends no command. It
// panics if name is empty, longer than MaxNameLen bytes, or starts with '}'
// (the keys would lose their shared hash tag), or if an option is invalid.
func (c *Client) NewMutex(name string, opts ...MutexOption) *DistMutex {
	cfg := c.configure("NewMutex", name, opts)
	m := &DistMutex{}
	m.init(c, name, cfg, mutexKind)
	return m
}

// Name returns the lock's name.
func (m *DistMutex) Name() string {
	m.client()
	return m.spec.name
}

// client returns m's Client, panicking for a zero DistMutex.
func (m *DistMutex) client() *Client {
	if m.c == nil {
		panic("remutex: DistMutex not created by Client.NewMutex (a zero DistMutex is not usable)")
	}
	return m.c
}

// Lock locks m, waiting until it is free. If the calling goroutine already
// holds m, Lock raises its hold count (one round trip, which checks that
// Redis still has the hold) instead; a hold that was lost has ended, and
// Lock takes the lock anew (see Unlock for the Unlocks the lost hold is
// owed). Transient Redis errors are retried with capped exponential backoff
// and reported to the error handler (and, at most every 10s per lock, to
// the logger); Lock returns only once the lock is held.
//
// Errors that no retry can mend panic with the error, whose message starts
// "remutex: " (a recovered value works with errors.Is and errors.As): a key
// of another type under the lock's name (*WrongTypeError), a hold without
// expiry (*NoExpiryError), a user that may not run a command (NOPERM; see
// Client.Check), ErrAuthRequired, a server that does not speak the Redis
// protocol, OOM, a script error. Check the connection up front with
// Client.Check rather than meeting these at the first Lock.
//
// On a closed Client (Close or Shutdown, before or while Lock waits) Lock
// blocks for good, like a sync.Mutex that is never unlocked: it cannot
// return without the lock, and a process that shuts down must not crash.
// Use LockContext where a goroutine must stop at shutdown: it returns
// ErrClosed.
func (m *DistMutex) Lock() {
	if _, err := m.lock(context.Background(), false); err != nil {
		if errors.Is(err, ErrClosed) || m.c.isClosed() {
			// (Closed while its call was out, which then failed: the redis
			// client may be closed after the Client, as a program ends.)
			m.c.blockClosed(m)
		}
		panic(err)
	}
}

// LockContext locks m like Lock, but gives up when ctx is done, returning
// ctx's error (and the last Redis error, if one was being retried, or that
// a call was still unanswered), as a *LockError; it then leaves nothing
// behind (no hold, no queue entry, no renewal, no subscription once it
// lingered out). It returns within about a millisecond of ctx's end,
// whatever Redis does and whatever the redis client's timeouts and retries:
// a call still in flight then is treated as one whose reply was lost, and
// leaving the queue (with a grant it may have got) is left to a call that
// follows it to Redis in the background. It returns ErrClosed after Close
// or Shutdown, and the errors that Lock panics with.
func (m *DistMutex) LockContext(ctx context.Context) error {
	_, err := m.lock(ctx, false)
	return err
}

// TryLock tries to lock m once and reports whether it did, like
// sync.Mutex.TryLock. It never waits for the lock, never joins the queue and
// leaves nothing behind when it fails. It answers within TryLockTimeout
// (300ms) whatever Redis does (paused, refusing connections, black-holed)
// and whatever the redis client's options: a call not answered by then is
// treated as one whose reply was lost, and what it may have got is released
// by a call that follows it to Redis in the background. A nested TryLock of
// a goroutine that holds m raises its count (one round trip).
//
// A connection that Redis refuses (nothing listens at its address) is an
// answer: TryLock and TryLockContext return at the first refused dial
// (go-redis would otherwise retry it for seconds), with an error matching
// syscall.ECONNREFUSED; the call may still reach Redis later, and what it
// may get is released as above. To hear of refused dials the Client adds a
// hook to the redis client that watches dials and changes nothing.
//
// TryLock returns false when the lock is held by another owner, while
// others wait for it (the queue's head is owed it), when
// Redis did not answer in time or refused the connection, on a transient error, on a closed Client,
// and for a goroutine that holds only the read lock of a DistRWMutex (the
// errors are reported to the error handler). It panics on the errors that
// Lock panics with.
func (m *DistMutex) TryLock() bool {
	ctx, cancel := context.WithTimeout(context.Background(), TryLockTimeout)
	defer cancel()
	ok, err := m.lock(ctx, true)
	switch {
	case err == nil:
		return ok
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		// TryLock's own deadline, or a timer of a pipeline it shared that
		// fired a moment before it: no answer in time, either way.
		m.c.report(m.wrapOp("trylock", fmt.Errorf("Redis did not answer within %v: %w", TryLockTimeout, context.DeadlineExceeded)))
		return false
	case transient(err) || errors.Is(err, ErrClosed):
		m.c.report(err)
		return false
	case errors.Is(err, ErrUpgrade):
		return false
	}
	panic(err)
}

// TryLockTimeout bounds TryLock: it answers within it.
const TryLockTimeout = 300 * time.Millisecond

// TryLockContext is TryLock that returns errors instead of reporting them,
// governed by ctx alone (no deadline of its own): (false, nil) means the
// lock is held by another owner, or owed to a waiter, or the grant came back
// too late to be valid (it was released again). It returns within about a
// millisecond of ctx's end, with ctx's error, and what a call still in
// flight may have got is released in the background, as by TryLock.
func (m *DistMutex) TryLockContext(ctx context.Context) (bool, error) {
	return m.lock(ctx, true)
}

// Unlock unlocks m: it lowers the calling goroutine's hold count, and the
// final Unlock releases the lock and passes it on to the longest waiter.
// Unlock of a mutex the goroutine (NonReentrant: anyone) does not hold panics
// with "remutex: unlock of unlocked mutex" (the message says more). Unlock of
// a hold that was lost, before or as its release finds, does not panic: it
// reports ErrLockLost to the error handler.
//
// Unlock returns within UnlockTimeout (1s) whatever Redis does (paused,
// refusing connections, black-holed) and whatever the redis client's
// timeouts and retries: transient errors are retried until then (never past
// the hold's validity) and reported to the error handler. The hold is
// dropped locally either way; a release that did not get through is sent
// again in the background, and the lock expires within its lease if it
// never does.
func (m *DistMutex) Unlock() {
	if err := m.unlock(unlockCtx, true); err != nil {
		m.c.report(err)
	}
}

// UnlockContext unlocks m like Unlock, returning ErrNotHeld if the caller
// holds nothing and ErrLockLost if the hold ended before this call. It
// returns at ctx's end, whatever Redis does; other errors are returned when
// a second of retries passed or the hold's validity ran out first. The hold
// is then dropped locally (renewal stops), its release is sent again in the
// background, and the lock expires on the server within its lease if that
// never gets through either.
func (m *DistMutex) UnlockContext(ctx context.Context) error {
	return m.unlock(ctx, false)
}

// HoldCount returns the calling goroutine's hold count of m: 0 if it does not
// hold it. For a NonReentrant mutex it is 1 while the mutex is held by anyone
// through this DistMutex.
func (m *DistMutex) HoldCount() int {
	if h := m.current(); h != nil {
		return h.count
	}
	return 0
}

// Lost returns a channel that is closed when the calling goroutine's hold of m
// is lost (lease expired, key deleted, Redis lost it, Client closed). It is
// already closed if the goroutine holds nothing; a hold that is unlocked
// normally never closes it. It answers for the calling goroutine: a goroutine
// that the holder starts holds nothing, and its Lost is closed at once. Take
// the channel before starting it, or hand it the hold's context
// (HoldContext, Do).
func (m *DistMutex) Lost() <-chan struct{} {
	return m.client().lostOf(func() *hold { return m.liveLocked(m.gid()) })
}

// Fence returns the fencing token of the calling goroutine's hold of m: 0
// without WithFencing or if it holds nothing. A hold that was lost keeps
// its token until its Unlocks (or a new hold) replace it, so that a
// critical section that goes on after the loss still writes with it, and
// the storage refuses it.
func (m *DistMutex) Fence() int64 {
	return m.client().fenceOf(func() *hold { return m.holdLocked(m.gid()) })
}

// current returns a copy of the calling goroutine's hold, or nil.
func (m *DistMutex) current() *hold {
	c := m.client()
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := m.liveLocked(m.gid()); h != nil {
		cp := *h
		return &cp
	}
	return nil
}

func (m *DistMutex) gid() int64 {
	if m.reentrant {
		return goid.Get()
	}
	return 0
}

func (m *DistMutex) wrap(err error) error { return lockError(m.spec.name, err) }

// wrapOp wraps err in a *LockError of operation op ("lock", "trylock",
// "unlock": "r" before it on the read side; "hold").
func (m *DistMutex) wrapOp(op string, err error) error {
	if m.spec.read && op != "hold" {
		op = "r" + op
	}
	return &LockError{Lock: m.spec.name, Op: op, Err: err}
}

// lock is the single implementation of the Lock family: one attempt with
// try, else until held. Its errors are *LockError of "lock" or "trylock".
func (m *DistMutex) lock(ctx context.Context, try bool) (bool, error) {
	held, err := m.acquire(ctx, try, 1)
	if err != nil {
		return false, m.wrapOp(lockOp(try), err)
	}
	return held, nil
}

func lockOp(try bool) string {
	if try {
		return "trylock"
	}
	return "lock"
}

// errEnded says that the hold a nested Lock was to raise ended (it was
// lost): the goroutine takes the lock anew.
var errEnded = errors.New("remutex: hold ended")

// acquire raises the calling goroutine's hold of m, or takes m anew: a
// semaphore's permits.
func (m *DistMutex) acquire(ctx context.Context, try bool, permits int) (bool, error) {
	c := m.client()
	if err := ctx.Err(); err != nil {
		return false, err
	}
	gid := m.gid()
	for {
		c.mu.Lock()
		h := m.liveLocked(gid)
		switch {
		case c.closed || c.draining && (h == nil || !m.reentrant):
			c.mu.Unlock()
			return false, ErrClosed
		case h != nil && m.reentrant:
			c.mu.Unlock()
			// (h.m: the value that took the hold, whose options every call
			// on the hold keeps.)
			held, err := h.m.nested(ctx, h, try)
			if err == errEnded {
				continue // lost meanwhile: take the lock anew
			}
			return held, err
		case m.upgradeLocked(gid):
			c.mu.Unlock()
			return false, ErrUpgrade
		}
		return m.fresh(ctx, gid, try, permits)
	}
}

// fresh takes m for goroutine gid, which holds nothing of it; called with
// c.mu held, it releases it.
func (m *DistMutex) fresh(ctx context.Context, gid int64, try bool, permits int) (bool, error) {
	h, err := m.take(ctx, gid, try, permits)
	return h != nil, err
}

// take is fresh that returns the hold it took, or nil.
func (m *DistMutex) take(ctx context.Context, gid int64, try bool, permits int) (*hold, error) {
	c := m.c
	var a attempt
	m.initAttemptLocked(&a, gid, try)
	a.permits = permits
	left := c.stateLocked(m).takeLeftoversOfLocked(gid)
	var pairLeft []leftover
	if m.pair != nil && !a.pinned {
		pairLeft = c.stateLocked(m.pair).takeLeftoversOfLocked(gid)
	}
	c.attempts++ // Close waits for it to post what undoes it
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.attemptDoneLocked(1)
		c.mu.Unlock()
	}()
	m.pair.clearLeftovers(ctx, pairLeft)
	m.clearLeftovers(ctx, left)
	held, err := a.run(ctx)
	if try && err != nil && (cutOff(ctx, err) || transient(err) || errors.Is(err, ErrClosed)) {
		m.undoTry(ctx, a.owner)
	}
	if !held {
		return nil, err
	}
	return a.held, err
}

// undoTry posts the release of what a TryLock's call may have got when its
// reply never came (its context ended, or the connection failed after
// sending it): Redis may have applied it. It is queued behind that call
// before TryLock returns, so that it cannot overtake it, nor come after the
// goroutine's next call (see transport.PostCtx). The owner token is the attempt's own
// (the goroutine holds nothing here, or it is a NonReentrant mutex's fresh
// one), so no other hold is touched. A quorum gives back what a failed try
// got itself.
func (m *DistMutex) undoTry(ctx context.Context, owner interface{}) {
	if !m.c.be.FreshOwners() {
		postRelease(ctx, m.c.be, &m.spec, owner, "0")
	}
}

// nested raises the hold count of a goroutine that already holds m. It
// returns errEnded if the hold is lost, before or by its call: the goroutine
// then takes the lock anew, for Lock never reports a hold that Redis does
// not have.
func (m *DistMutex) nested(ctx context.Context, h *hold, try bool) (bool, error) {
	c := m.c
	var bo backoff
	for {
		c.mu.Lock()
		lost, have := h.lostErr, h.count
		c.mu.Unlock()
		if lost != nil {
			return false, errEnded
		}
		sent := time.Now()
		r, err := c.be.Acquire(ctx, &m.spec.Spec, acquireReq{Owner: h.owner, Have: have, Want: have + 1, Lease: m.spec.keepArg})
		switch {
		case err == nil && r.Code == replyGranted:
			c.mu.Lock()
			ended := h.lostErr != nil
			if !ended {
				h.count = have + 1
				if m.renew {
					h.extendLocked(sent)
				}
			}
			c.mu.Unlock()
			if !ended {
				return true, nil
			}
		case err == nil:
			c.mu.Lock()
			lost := c.loseLocked(h, errHoldGone)
			c.mu.Unlock()
			c.announce(lost)
		case cutOff(ctx, err):
			return false, ctxErr(ctx, errNoReply)
		case try || !transient(err):
			return false, err
		default:
			if err := m.pause(ctx, &bo, err, lockOp(try)); err != nil {
				return false, err
			}
		}
	}
}

// errNoReply is the last error of a wait whose call was cut off by its
// context before Redis answered.
var errNoReply = errors.New("Redis did not answer the call in flight")

// pause waits out one backoff step after a transient error, reporting it.
func (m *DistMutex) pause(ctx context.Context, bo *backoff, cause error, op string) error {
	m.c.report(m.wrapOp(op, cause))
	m.warnRetry(op, cause)
	t := time.NewTimer(bo.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctxErr(ctx, cause)
	case <-m.c.stopping:
		return ErrClosed
	}
}

// cutOff reports whether err ended a call because ctx's deadline passed:
// ctx is done, or err is a deadline that a timer of the redis client (set
// from ctx's deadline) met a moment before ctx's own, which cutOff then
// waits for.
func cutOff(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	if !ok || err == nil || !errors.Is(err, context.DeadlineExceeded) || time.Until(d) > 5*time.Millisecond {
		return false
	}
	<-ctx.Done()
	return true
}

// ctxErr is ctx's error and, when there was one, the last Redis error that
// was being retried.
func ctxErr(ctx context.Context, last error) error {
	if last == nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w (last error: %w)", ctx.Err(), last)
}

// warnRetry logs a transient error that op retries, at most once per
// warnEvery for the lock, with the number of errors it did not log since.
func (m *DistMutex) warnRetry(op string, err error) {
	c := m.c
	now := time.Now()
	c.mu.Lock()
	st := c.stateLocked(m)
	if !st.warned.IsZero() && now.Sub(st.warned) < warnEvery {
		st.unlogged++
		c.mu.Unlock()
		return
	}
	skipped := st.unlogged
	st.warned, st.unlogged = now, 0
	c.mu.Unlock()
	c.log.Warn("remutex: retrying after transient error", "lock", m.spec.name, "op", op, "err", err, "unlogged", skipped)
}
