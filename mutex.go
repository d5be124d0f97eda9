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

// WithoutRenewal makes the lease fixed: the watchdog does not renew it, and the
// hold simply ends when the lease runs out (as with SET NX PX), after which Lost
// closes and Unlock reports ErrLockLost. Nested locks do not extend it.
// Default: holds are renewed every lease/3 until unlocked.
func WithoutRenewal() MutexOption {
	return func(m *mutexConfig) { m.noRenew = true }
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
// P{name}:fence, P{name}:queue and P{name}:queue:alive for the Client's
// prefix P, and the Client hears of it on the channel
// P{name}:released:<client id>: one cluster slot. It sends no command. It
// panics if name is empty, longer than MaxNameLen bytes, or starts with '}'
// (the keys would lose their shared hash tag), or if an option is invalid.
func (c *Client) NewMutex(name string, opts ...MutexOption) *DistMutex {
	cfg := c.configure("NewMutex", name, opts)
	m := &DistMutex{}
	m.init(c, name, cfg, kindMutex)
	return m
}

// configure checks what NewMutex or NewRWMutex (fn) was given, panicking
// with a message that says what is wrong.
func (c *Client) configure(fn, name string, opts []MutexOption) mutexConfig {
	if c == nil {
		panic("remutex: " + fn + " on a nil Client")
	}
	cfg := mutexConfig{lease: DefaultLease}
	for _, o := range opts {
		if o == nil {
			panic("remutex: " + fn + ": nil option")
		}
		o(&cfg)
	}
	if err := checkName(name); err != nil {
		panic("remutex: " + fn + ": " + err.Error())
	}
	if cfg.lease < MinLease || cfg.lease > MaxLease {
		panic(fmt.Sprintf("remutex: WithLease(%v): lease must be between %v and %v", cfg.lease, MinLease, MaxLease))
	}
	return cfg
}

func (m *DistMutex) init(c *Client, name string, cfg mutexConfig, kind lockKind) {
	m.c = c
	m.spec = c.newSpec(name, cfg, kind)
	m.renew = !cfg.noRenew
	m.reentrant = !cfg.nonReentrant
}

// checkName says what is wrong with a lock name, or nil.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty lock name")
	case len(name) > MaxNameLen:
		return fmt.Errorf("lock name of %d bytes exceeds %d", len(name), MaxNameLen)
	case name[0] == '}':
		return fmt.Errorf("lock name %q starts with '}': its keys would not share a cluster slot", name)
	}
	return nil
}

// Tuning of the wait path. They are not options: the benchmarks chose them.
const (
	// starveAfter is how long the head of a lock's queue may wait before
	// releases hand the lock to it instead of letting newcomers barge
	// (starvation mode, decided by the scripts on the server's clock).
	starveAfter = 3 * time.Millisecond
	// maxQueueTTL bounds the liveness of a queue entry on the server; the
	// waiter refreshes it every third of that. A grant carries a claim lease
	// of the same length until the watchdog extends it.
	maxQueueTTL = 750 * time.Millisecond
	// linger is how long a lock's subscription is kept after its last local
	// waiter left, to spare subscribe/unsubscribe churn under contention.
	linger = 250 * time.Millisecond
)

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
// holds m, Lock raises its hold count (one round trip) instead. Transient Redis
// errors are retried with capped exponential backoff and reported to the error
// handler; Lock returns only once the lock is held. Permanent errors (a key of
// another type, NOPERM, OOM when Redis reached maxmemory, a script error, a
// closed Client) panic with the error, whose message starts "remutex: " (a
// recovered value works with errors.Is and errors.As). A nested Lock on a hold
// that was lost raises the count all the same and reports ErrLockLost to the
// error handler: Lost stays closed, and the matching Unlocks report
// ErrLockLost.
func (m *DistMutex) Lock() {
	if _, err := m.lock(context.Background(), false, true); err != nil {
		panic(err)
	}
}

// LockContext locks m like Lock, but gives up when ctx is done, returning
// ctx.Err() wrapped with the lock's name (and the last Redis error, if one
// was being retried); it then leaves nothing behind (no hold, no queue entry,
// no renewal, no subscription once it lingered out). Permanent errors are
// returned, wrapped. A nested LockContext on a lost hold returns ErrLockLost
// and leaves the count as it was. ctx ends the wait between round trips; a
// round trip in flight ends by ctx only if the redis client has
// ContextTimeoutEnabled, otherwise by its ReadTimeout.
func (m *DistMutex) LockContext(ctx context.Context) error {
	_, err := m.lock(ctx, false, false)
	return err
}

// TryLock tries to lock m once and reports whether it did, like
// sync.Mutex.TryLock. It never waits for the lock, never joins the queue and
// leaves nothing behind when it fails. Its attempt gets tryLockTimeout
// (300ms) of the redis client's time, so that it answers within a few
// hundred milliseconds when Redis is unreachable (go-redis alone retries
// refused connections for over a second); if that cuts off a call Redis may
// have applied, what it got is released again (for at most 200ms more, after
// which its lease ends it). A round trip in flight is cut off at the
// deadline only if the redis client has ContextTimeoutEnabled, otherwise at
// its ReadTimeout. TryLock returns false while the lock is in starvation
// mode (its longest waiter is owed the next hand-off), on a transient error
// or no answer in time, and for a nested TryLock on a hold that was lost
// (all reported to the error handler); it panics on permanent errors as
// Lock does.
func (m *DistMutex) TryLock() bool {
	ctx, cancel := context.WithTimeout(context.Background(), tryLockTimeout)
	defer cancel()
	ok, err := m.lock(ctx, true, true)
	switch {
	case err == nil:
		return ok
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		m.c.report(m.wrap(fmt.Errorf("TryLock: Redis did not answer within %v: %w", tryLockTimeout, context.DeadlineExceeded)))
		return false
	case transient(err) || errors.Is(err, ErrLockLost):
		m.c.report(err)
		return false
	case errors.Is(err, ErrUpgrade):
		return false
	}
	panic(err)
}

// TryLock's bounds: its attempt, and the release of what an attempt cut off
// by its deadline may have got.
const (
	tryLockTimeout = 300 * time.Millisecond
	tryUndoTimeout = 200 * time.Millisecond
)

// TryLockContext is TryLock that returns errors instead of reporting them,
// governed by ctx alone (no deadline of its own): (false, nil) means the
// lock is held by another owner, or owed to a waiter, or the grant came back
// too late to be valid (it was released again). If ctx ends while its call
// is out, it returns ctx's error, wrapped, and releases what the call may
// have got, as TryLock does.
func (m *DistMutex) TryLockContext(ctx context.Context) (bool, error) {
	return m.lock(ctx, true, false)
}

// Unlock unlocks m: it lowers the calling goroutine's hold count, and the
// final Unlock releases the lock and passes it on to the longest waiter.
// Unlock of a mutex the goroutine (NonReentrant: anyone) does not hold panics
// with "remutex: unlock of unlocked mutex". Unlock of a lost hold does not
// panic: it reports ErrLockLost to the error handler. Transient errors are
// retried for at most a second (and never past the hold's validity), then
// reported to the error handler; the hold is dropped locally either way, so
// a lock that could not be released expires within its lease.
func (m *DistMutex) Unlock() {
	if err := m.unlock(context.Background(), true); err != nil {
		m.c.report(err)
	}
}

// UnlockContext unlocks m like Unlock, returning ErrNotHeld if the caller
// holds nothing and ErrLockLost if the hold ended before this call. Other
// errors are returned when ctx ends, a second of retries passed, or the
// hold's validity ran out first; the hold is then dropped locally (renewal
// stops) and the lock expires on the server within its lease.
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
// normally never closes it.
func (m *DistMutex) Lost() <-chan struct{} {
	c := m.client()
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := m.holdLocked(m.gid()); h != nil {
		return h.lostChanLocked()
	}
	return closedChan
}

// Fence returns the fencing token of the calling goroutine's hold of m: 0
// without WithFencing or if it holds nothing.
func (m *DistMutex) Fence() int64 {
	if h := m.current(); h != nil {
		return h.fence
	}
	return 0
}

// current returns a copy of the calling goroutine's hold, or nil.
func (m *DistMutex) current() *hold {
	c := m.client()
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := m.holdLocked(m.gid()); h != nil {
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

// lock is the single implementation of the Lock family. try makes one
// attempt; plain marks the sync.Locker forms, which retry transient errors
// forever and count nested locks of a lost hold.
func (m *DistMutex) lock(ctx context.Context, try, plain bool) (bool, error) {
	c := m.client()
	if err := ctx.Err(); err != nil {
		return false, m.wrap(err)
	}
	gid := m.gid()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false, m.wrap(ErrClosed)
	}
	if h := m.holdLocked(gid); h != nil && m.reentrant {
		c.mu.Unlock()
		return m.nested(ctx, h, try, plain)
	}
	if m.upgradeLocked(gid) {
		c.mu.Unlock()
		return false, m.wrap(ErrUpgrade)
	}
	var a attempt
	m.initAttemptLocked(&a, gid, try)
	left := c.stateLocked(m).takeLeftoverLocked(a.owner)
	c.mu.Unlock()
	if left {
		m.clearLeftover(ctx, &a)
	}
	held, err := a.run(ctx)
	if try && err != nil && ctx.Err() != nil {
		m.undoTry(ctx, a.owner)
	}
	return held, err
}

// undoTry releases what a TryLock cut off by the end of its context may
// have got: Redis may have applied the call whose reply never came. The
// owner token is the attempt's own (the goroutine holds nothing here, or it
// is a NonReentrant mutex's fresh one), so no other hold is touched. It
// takes at most tryUndoTimeout; failing that, the lease ends the grant. A
// quorum gives back what a failed try got itself.
func (m *DistMutex) undoTry(ctx context.Context, owner interface{}) {
	if m.c.be.freshOwners() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tryUndoTimeout)
	defer cancel()
	_, _ = m.c.be.release(ctx, &m.spec, owner, 0, "0")
}

// nested raises the hold count of a goroutine that already holds m.
func (m *DistMutex) nested(ctx context.Context, h *hold, try, plain bool) (bool, error) {
	c := m.c
	var bo backoff
	for {
		c.mu.Lock()
		lost, have := h.lostErr, h.count
		if lost != nil && plain && !try {
			h.count++
		}
		c.mu.Unlock()
		if lost != nil {
			if plain && !try {
				c.report(m.wrap(lost))
				return true, nil
			}
			return false, m.wrap(lost)
		}
		sent := time.Now()
		r, err := c.be.acquire(ctx, &m.spec, acquireReq{owner: h.owner, have: have, want: have + 1, lease: m.spec.keepArg})
		switch {
		case err == nil && r.code == replyGranted:
			c.mu.Lock()
			h.count = have + 1
			if m.renew {
				h.extendLocked(sent)
			}
			c.mu.Unlock()
			return true, nil
		case err == nil:
			c.mu.Lock()
			lost := c.loseLocked(h, errHoldGone)
			c.mu.Unlock()
			c.announce(lost)
		case try || !transient(err):
			return false, m.wrap(err)
		default:
			if err := m.pause(ctx, &bo, err, "acquire"); err != nil {
				return false, err
			}
		}
	}
}

// pause waits out one backoff step after a transient error, reporting it.
func (m *DistMutex) pause(ctx context.Context, bo *backoff, cause error, op string) error {
	m.c.report(m.wrap(cause))
	m.c.log.Warn("remutex: retrying after transient error", "lock", m.spec.name, "op", op, "err", cause)
	t := time.NewTimer(bo.next())
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return m.ctxErr(ctx, cause)
	case <-m.c.closing:
		return m.wrap(ErrClosed)
	}
}

// ctxErr is ctx's error wrapped with the lock's name and, when there was
// one, the last Redis error that was being retried.
func (m *DistMutex) ctxErr(ctx context.Context, last error) error {
	if last == nil {
		return m.wrap(ctx.Err())
	}
	return m.wrap(fmt.Errorf("%w (last error: %w)", ctx.Err(), last))
}
