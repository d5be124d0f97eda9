package remutex

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/petermattis/goid"
	"github.com/redis/go-redis/v9"
)

// Defaults and limits.
const (
	// DefaultLease is the lease of a mutex without WithLease.
	DefaultLease = 30 * time.Second
	// MinLease and MaxLease bound WithLease.
	MinLease = 50 * time.Millisecond
	MaxLease = 24 * time.Hour
	// DefaultKeyPrefix is the key prefix of a Client without WithKeyPrefix.
	DefaultKeyPrefix = "remutex:"
	// MaxNameLen is the longest lock name NewMutex accepts, in bytes.
	MaxNameLen = 1024
)

// Tuning of the wait path. They are not options: the benchmarks chose them.
const (
	// starveAfter is how long a waiter competes in normal mode before it
	// joins the lock's queue in Redis (starvation mode).
	starveAfter = 3 * time.Millisecond
	// maxQueueTTL bounds the liveness of a queue entry on the server; the
	// waiter refreshes it every third of that. A grant carries a claim lease of
	// the same length, extended to the full lease by the watchdog at once.
	maxQueueTTL = 750 * time.Millisecond
	// linger is how long a lock's subscription is kept after its last local
	// waiter left, to spare subscribe/unsubscribe churn under contention.
	linger = 250 * time.Millisecond
)

// Client is a set of distributed mutexes on one Redis deployment. It owns one
// pub/sub connection (waiters are woken by messages, not by polling) and one
// watchdog goroutine that renews every hold of its mutexes. Create it with
// NewClient and stop it with Close; a Client is safe for concurrent use and
// must not be copied.
//
// Each Client stands for one owner process: two Clients on the same Redis
// exclude each other exactly as two processes do.
type Client struct {
	_       noCopy
	id      string // random 128 bits, hex: the owner-token prefix of every hold
	prefix  string
	log     *slog.Logger
	onError func(error)
	hook    func(Event)
	// WithReplicaAck: acquisitions and renewals wait for this many replicas.
	ackReplicas int
	ackTimeout  time.Duration
	nodes       []*node        // the Redis deployments: one, or a quorum's servers
	one         *node          // nodes[0] when there is only one
	majority    int            // quorum Clients: how many nodes make a decision
	bg          sync.WaitGroup // quorum calls still running after a decision

	closing chan struct{} // closed by Close

	mu      sync.Mutex
	closed  bool
	locks   map[string]*lockState // by hash key; see reentrant.go
	sweepAt int                   // registry size at which sweepLocked looks again
	seq     uint64                // wait ids and NonReentrant owner tokens

	wd  watchdog
	sub subscriber
}

// Option configures a Client.
type Option func(*Client)

// WithKeyPrefix sets the prefix of every key and channel of the Client's
// locks. Default: "remutex:". Clients that must exclude each other need the
// same prefix.
func WithKeyPrefix(prefix string) Option {
	return func(c *Client) { c.prefix = prefix }
}

// WithLogger sets the logger for lost leases, retried errors and the
// fallback to polling. Default: slog.Default(), with records below Warn
// discarded. A nil logger panics in NewClient.
func WithLogger(l *slog.Logger) Option {
	return func(c *Client) {
		if l == nil {
			panic("remutex: WithLogger: nil logger")
		}
		c.log = l
	}
}

// WithErrorHandler sets a function that hears of the errors Lock, Unlock and
// TryLock cannot return: lost holds, and transient errors they retried. It is
// called from the goroutine that met the error (the watchdog for lost
// leases) and must not block. Default: none (errors are only logged).
func WithErrorHandler(f func(error)) Option {
	return func(c *Client) { c.onError = f }
}

// WithReplicaAck makes every acquisition and renewal wait until at least n
// replicas acknowledged its write (Redis WAIT, pipelined with the write: no
// extra round trip), for at most timeout. An acquisition that fewer replicas
// acknowledged is rolled back and fails with ErrTooFewReplicas (Lock retries
// it); a renewal that fewer acknowledged counts as failed, so a hold that
// cannot keep n replicas up to date is lost when its validity ends. With it, a
// lock survives the promotion of an acknowledging replica after the primary
// fails; without it, a failover can lose a just-acquired lock and let a second
// holder in. timeout must be shorter than the redis client's ReadTimeout.
// Default: no acknowledgement (n = 0). n < 1 or timeout <= 0 panics in
// NewClient.
func WithReplicaAck(n int, timeout time.Duration) Option {
	return func(c *Client) {
		if n < 1 || timeout <= 0 {
			panic(fmt.Sprintf("remutex: WithReplicaAck(%d, %v): need n >= 1 and timeout > 0", n, timeout))
		}
		c.ackReplicas, c.ackTimeout = n, timeout
	}
}

// NewClient returns a Client that keeps its locks in rdb, which may be a
// *redis.Client, a *redis.ClusterClient, or a failover client. It sends no
// command until a mutex is used. It panics if rdb is nil or an option is
// invalid.
func NewClient(rdb redis.UniversalClient, opts ...Option) *Client {
	if rdb == nil || isNilPointer(rdb) {
		panic("remutex: NewClient: nil redis client")
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		panic("remutex: NewClient: crypto/rand: " + err.Error())
	}
	c := &Client{
		id:      hex.EncodeToString(id[:]),
		prefix:  DefaultKeyPrefix,
		closing: make(chan struct{}),
		locks:   make(map[string]*lockState),
	}
	for _, o := range opts {
		if o == nil {
			panic("remutex: NewClient: nil option")
		}
		o(c)
	}
	if c.log == nil {
		c.log = slog.New(warnHandler{slog.Default().Handler()})
	}
	c.nodes = []*node{newNode(c, rdb)}
	c.one = c.nodes[0]
	c.wd.c = c
	return c
}

func isNilPointer(v interface{}) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// Close stops the Client: its watchdog and pub/sub goroutines are stopped and
// joined before Close returns. Holds still held become lost (their Lost
// channels close, Unlock reports ErrLockLost) and expire on the server within
// their lease: Close does not delete them, so no other holder enters while
// their goroutines may still be working. A goroutine's final Unlock of such a
// hold still deletes its entry, as for any lost hold. Waiting
// Lock calls return ErrClosed (Lock panics with it). The redis client is not
// closed: it belongs to the caller. Close returns ErrClosed if called again.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed = true
	close(c.closing)
	lost := c.wd.loseAllLocked(ErrClosed)
	c.mu.Unlock()
	c.wd.stop()
	for _, n := range c.nodes {
		n.sub.close()
	}
	c.bg.Wait()
	c.announce(lost)
	return nil
}

// report hands err to the error handler, if there is one.
func (c *Client) report(err error) {
	if c.onError != nil {
		c.onError(err)
	}
}

// DistMutex is a mutual exclusion lock shared by every process that uses the
// same name on the same Redis. Create it with Client.NewMutex; it must not be
// copied after first use.
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
	name      string
	k         lockKeys
	lease     time.Duration
	leaseArg  interface{} // lease in ms
	keepArg   interface{} // lease in ms for nested calls; "0" (keep the TTL) WithoutRenewal
	fenceArg  interface{} // "1" WithFencing, else "0"
	renew     bool
	fencing   bool
	reentrant bool
	nr        *hold // NonReentrant: the current hold; guarded by c.mu
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

// NewMutex returns the mutex called name. Its keys are P{name}, P{name}:fence,
// P{name}:queue and P{name}:queue:alive, P{name}:last, and its channel
// P{name}:released, for the Client's prefix P: one cluster slot. It sends no
// command. It panics if name is empty, longer than MaxNameLen bytes, or
// starts with '}' (the keys would lose their shared hash tag), or if an
// option is invalid.
func (c *Client) NewMutex(name string, opts ...MutexOption) *DistMutex {
	if c == nil {
		panic("remutex: NewMutex on a nil Client")
	}
	switch {
	case name == "":
		panic("remutex: NewMutex: empty lock name")
	case len(name) > MaxNameLen:
		panic(fmt.Sprintf("remutex: NewMutex: lock name of %d bytes exceeds %d", len(name), MaxNameLen))
	}
	cfg := mutexConfig{lease: DefaultLease}
	for _, o := range opts {
		if o == nil {
			panic("remutex: NewMutex: nil option")
		}
		o(&cfg)
	}
	if cfg.lease < MinLease || cfg.lease > MaxLease {
		panic(fmt.Sprintf("remutex: WithLease(%v): lease must be between %v and %v", cfg.lease, MinLease, MaxLease))
	}
	m := &DistMutex{
		c:         c,
		name:      name,
		k:         newLockKeys(c.prefix, name),
		lease:     cfg.lease,
		leaseArg:  cfg.lease.Milliseconds(),
		renew:     !cfg.noRenew,
		fencing:   cfg.fencing,
		reentrant: !cfg.nonReentrant,
		fenceArg:  "0",
	}
	if hashTag(m.k.keys[0]) == "" {
		panic(fmt.Sprintf("remutex: NewMutex: lock name %q starts with '}': its keys would not share a cluster slot", name))
	}
	m.keepArg = m.leaseArg
	if !m.renew {
		m.keepArg = "0"
	}
	if m.fencing {
		m.fenceArg = "1"
	}
	return m
}

// Name returns the lock's name.
func (m *DistMutex) Name() string { return m.name }

// Lock locks m, waiting until it is free. If the calling goroutine already
// holds m, Lock raises its hold count (one round trip) instead. Transient Redis
// errors are retried with capped exponential backoff and reported to the error
// handler; Lock returns only once the lock is held. Permanent errors (a key of
// another type, NOPERM, OOM when Redis reached maxmemory, a script error, a
// closed Client) panic with the error,
// whose message starts "remutex: " (a recovered value works with errors.Is and
// errors.As). A nested Lock on a hold that was lost raises the count
// all the same and reports ErrLockLost to the error handler: Lost stays
// closed, and the matching Unlocks report ErrLockLost.
func (m *DistMutex) Lock() {
	if _, err := m.lock(context.Background(), false, true); err != nil {
		panic(err)
	}
}

// LockContext locks m like Lock, but gives up when ctx is done, returning
// ctx.Err() wrapped with the lock's name; it then leaves nothing behind (no
// hold, no queue entry, no renewal, no subscription once it lingered out).
// Permanent errors are returned, wrapped. A nested LockContext on a lost hold
// returns ErrLockLost and leaves the count as it was. ctx ends the wait between
// round trips; a round trip in flight ends by ctx only if the redis client has
// ContextTimeoutEnabled, otherwise by its ReadTimeout.
func (m *DistMutex) LockContext(ctx context.Context) error {
	_, err := m.lock(ctx, false, false)
	return err
}

// TryLock tries to lock m once and reports whether it did, like
// sync.Mutex.TryLock. It never waits, never joins the queue and leaves nothing
// behind when it fails. It returns false while waiters are queued for the
// lock, on a transient error, and for a nested TryLock on a hold that was lost
// (both reported to the error handler); it panics on permanent errors as Lock
// does.
func (m *DistMutex) TryLock() bool {
	ok, err := m.lock(context.Background(), true, true)
	if err != nil {
		if transient(err) || errors.Is(err, ErrLockLost) {
			m.c.report(err)
			return false
		}
		panic(err)
	}
	return ok
}

// TryLockContext is TryLock that returns errors instead of reporting them:
// (false, nil) means the lock is held by another owner, or waiters are
// queued for it, or the grant came back too late to be valid (it was
// released again).
func (m *DistMutex) TryLockContext(ctx context.Context) (bool, error) {
	return m.lock(ctx, true, false)
}

// Unlock unlocks m: it lowers the calling goroutine's hold count, and the
// final Unlock releases the lock and wakes the next waiter. Unlock of a mutex
// the goroutine (NonReentrant: anyone) does not hold panics with "remutex:
// unlock of unlocked mutex". Unlock of a lost hold does not panic: it reports
// ErrLockLost to the error handler. Other errors are retried while the hold's
// lease is valid, then reported; the hold is dropped locally either way, so a
// lock that could not be released expires within its lease.
func (m *DistMutex) Unlock() {
	if err := m.unlock(context.Background(), true); err != nil {
		m.c.report(err)
	}
}

// UnlockContext unlocks m like Unlock, returning ErrNotHeld if the caller
// holds nothing and ErrLockLost if the hold ended before this call. Other
// errors are returned when ctx ends or the hold's lease runs out first; the
// hold is then dropped locally (renewal stops) and the lock expires on the
// server within its lease.
func (m *DistMutex) UnlockContext(ctx context.Context) error {
	return m.unlock(ctx, false)
}

// HoldCount returns the calling goroutine's hold count of m: 0 if it does not
// hold it. For a NonReentrant mutex it is 1 while the mutex is held by anyone
// through this DistMutex.
func (m *DistMutex) HoldCount() int {
	c := m.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := m.holdLocked(m.gid()); h != nil {
		return h.count
	}
	return 0
}

// Lost returns a channel that is closed when the calling goroutine's hold of m
// is lost (lease expired, key deleted, Redis lost it, Client closed). It is
// already closed if the goroutine holds nothing; a hold that is unlocked
// normally never closes it.
func (m *DistMutex) Lost() <-chan struct{} {
	c := m.c
	c.mu.Lock()
	defer c.mu.Unlock()
	h := m.holdLocked(m.gid())
	if h == nil {
		return closedChan
	}
	return h.lostChanLocked()
}

// Fence returns the fencing token of the calling goroutine's hold of m: 0
// without WithFencing or if it holds nothing.
func (m *DistMutex) Fence() int64 {
	c := m.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := m.holdLocked(m.gid()); h != nil {
		return h.fence
	}
	return 0
}

func (m *DistMutex) gid() int64 {
	if m.reentrant {
		return goid.Get()
	}
	return 0
}

func (m *DistMutex) wrap(err error) error { return lockError(m.name, err) }

// validity is how long a grant of d (a lease or a claim lease) counts as
// valid on the local clock, from the send time of the call that made it: d
// minus a drift margin of d/40 + 5ms for clock-rate differences and the
// watchdog waking late on a loaded machine. Renewal comes every lease/3, so a
// wide margin costs nothing while Redis answers.
func validity(d time.Duration) time.Duration { return d - d/40 - 5*time.Millisecond }

// queueTTL is the liveness of this mutex's queue entries on the server.
func (m *DistMutex) queueTTL() time.Duration { return min(m.lease, maxQueueTTL) }

// claimLease is the lease a grant from the queue carries until the watchdog
// extends it: short, so a waiter that died after its last refresh blocks the
// lock only briefly. A fixed lease (WithoutRenewal) is granted whole.
func (m *DistMutex) claimLease() time.Duration {
	if !m.renew {
		return m.lease
	}
	return m.queueTTL()
}

// lock is the single implementation of the Lock family. try makes one
// attempt; plain marks the sync.Locker forms, which retry transient errors
// forever and count nested locks of a lost hold.
func (m *DistMutex) lock(ctx context.Context, try, plain bool) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, m.wrap(err)
	}
	c := m.c
	gid := m.gid()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false, m.wrap(ErrClosed)
	}
	h := m.holdLocked(gid)
	if h != nil && m.reentrant {
		c.mu.Unlock()
		return m.nested(ctx, h, try, plain)
	}
	a := attempt{m: m, gid: gid, start: time.Now()}
	st := c.locks[m.k.hash()]
	switch {
	case c.one != nil && m.reentrant && st != nil && st.lastOwner != nil && st.lastOwner.gid == gid:
		// The goroutine that held this lock last takes it again: reuse its
		// owner token instead of building and boxing it anew.
		a.owner, a.ownerArg = st.lastOwner.owner, st.lastOwner.ownerArg
	case c.one == nil:
		// See attempt.acquire: a quorum draws a token per try.
	case m.reentrant:
		a.owner = c.id + ":" + strconv.FormatInt(gid, 10)
	default:
		a.owner = c.id + ":n" + strconv.FormatUint(c.nextSeqLocked(), 10)
	}
	if a.ownerArg == nil {
		a.ownerArg = a.owner
	}
	c.mu.Unlock()

	var bo backoff
	for {
		r, sent, err := a.acquire(ctx)
		if err == nil && r.code == replyGranted {
			held, err := a.complete(ctx, r.val, sent.Add(validity(m.lease)), false)
			if held || err != nil {
				return held, err
			}
		}
		if try {
			if err != nil {
				return false, m.wrap(err)
			}
			return false, nil
		}
		if err == nil || !transient(err) {
			if err != nil {
				return false, m.wrap(err)
			}
			waitStart := time.Now()
			held, err := a.wait(ctx, r, plain)
			if c.hook != nil {
				c.emit(Event{Kind: EventWaited, Lock: m.name, Owner: a.owner, Duration: time.Since(waitStart), Err: err})
			}
			return held, err
		}
		// A transient error before any waiting: retry, then wait as usual.
		if err := a.pause(ctx, &bo, err); err != nil {
			return false, err
		}
	}
}

// nested raises the hold count of a goroutine that already holds m.
func (m *DistMutex) nested(ctx context.Context, h *hold, try, plain bool) (bool, error) {
	c := m.c
	var bo backoff
	for {
		c.mu.Lock()
		lost, have := h.lostErr, h.count
		c.mu.Unlock()
		if lost != nil {
			if plain && !try {
				c.mu.Lock()
				h.count++
				c.mu.Unlock()
				c.report(m.wrap(lost))
				return true, nil
			}
			return false, m.wrap(lost)
		}
		sent := time.Now()
		r, err := c.acquire(ctx, &m.k, h.ownerArg, have, have+1, m.keepArg, "0")
		switch {
		case err == nil && r.code == replyGranted:
			c.mu.Lock()
			h.count = have + 1
			if m.renew {
				h.extendLocked(sent.Add(validity(m.lease)))
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
			if err := (&attempt{m: m}).pause(ctx, &bo, err); err != nil {
				return false, err
			}
		}
	}
}

// attempt is one goroutine's effort to take a lock it does not hold.
type attempt struct {
	m        *DistMutex
	gid      int64
	owner    string
	ownerArg interface{}
	start    time.Time // the Lock call
}

func (a *attempt) acquire(ctx context.Context) (scriptReply, time.Time, error) {
	m := a.m
	if c := m.c; c.one == nil {
		// A quorum gives back, in the background, what a failed try got
		// late: a token per try keeps that from touching a later try.
		c.mu.Lock()
		a.owner = c.id + ":" + strconv.FormatInt(a.gid, 10) + "." + strconv.FormatUint(c.nextSeqLocked(), 10)
		c.mu.Unlock()
		a.ownerArg = a.owner
	}
	sent := time.Now()
	r, err := m.c.acquire(ctx, &m.k, a.ownerArg, 0, 1, m.leaseArg, m.fenceArg)
	return r, sent, err
}

// pause waits out one backoff step after a transient error, reporting it.
func (a *attempt) pause(ctx context.Context, bo *backoff, cause error) error {
	m := a.m
	err := m.wrap(cause)
	m.c.report(err)
	m.c.log.Warn("remutex: retrying after transient error", "lock", m.name, "op", "acquire", "err", cause)
	t := time.NewTimer(bo.next())
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return m.wrap(fmt.Errorf("%w (last error: %v)", ctx.Err(), cause))
	case <-m.c.closing:
		return m.wrap(ErrClosed)
	}
}

// complete records a granted lock as the goroutine's hold. valid is the
// monotonic deadline up to which the grant is known to be valid; a grant that
// is already past it is released again and not reported as held.
func (a *attempt) complete(ctx context.Context, fence int64, valid time.Time, renewNow bool) (bool, error) {
	m := a.m
	c := m.c
	h := &hold{
		m:        m,
		owner:    a.owner,
		ownerArg: a.ownerArg,
		gid:      a.gid,
		count:    1,
		fence:    fence,
		valid:    valid,
	}
	now := time.Now()
	c.mu.Lock()
	if c.closed || !now.Before(valid) {
		closed := c.closed
		c.mu.Unlock()
		a.abandon(ctx)
		if closed {
			return false, m.wrap(ErrClosed)
		}
		return false, nil
	}
	h.relID = int64(c.nextSeqLocked())
	h.acquired = now
	if renewNow {
		h.next = now
	} else {
		// valid counts from the acquire's send time; so does the first
		// renewal, or a slow reply could leave none before the deadline.
		h.next = valid.Add(m.lease/3 - validity(m.lease))
	}
	m.addHoldLocked(h)
	c.wd.addLocked(h)
	c.mu.Unlock()
	if c.hook != nil {
		c.emit(h.event(EventAcquired, now.Sub(a.start), nil))
	}
	return true, nil
}

// abandon releases a grant that will not be used (it came too late, or the
// Client closed), without waiting long for it: the lease ends it otherwise.
func (a *attempt) abandon(ctx context.Context) {
	m := a.m
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.lease)
	defer cancel()
	_, _ = m.c.release(ctx, &m.k, a.ownerArg, 0, "0", "")
}

// unlock is the single implementation of Unlock and UnlockContext.
func (m *DistMutex) unlock(ctx context.Context, plain bool) error {
	c := m.c
	c.mu.Lock()
	h := m.holdLocked(m.gid())
	if h == nil || h.ending {
		// (ending: a NonReentrant mutex whose final release another
		// goroutine is already sending.)
		c.mu.Unlock()
		if plain {
			panic("remutex: unlock of unlocked mutex")
		}
		return m.wrap(ErrNotHeld)
	}
	want := h.count - 1
	if h.lostErr == nil && !time.Now().Before(h.valid) {
		// Past its validity deadline the hold may be gone on the server: it
		// is lost, whether or not the watchdog has looked yet.
		lost := c.loseLocked(h, errExpired)
		defer c.announce(lost)
	}
	if lost := h.lostErr; lost != nil {
		h.count = want
		if want == 0 {
			m.dropHoldLocked(h)
		}
		c.mu.Unlock()
		if want == 0 {
			// The lock may still be ours on the server (lost by the local
			// deadline during a partition): free it for the others.
			m.cleanup(ctx, h)
		}
		return m.wrap(lost)
	}
	valid := h.valid
	h.ending = want == 0
	c.mu.Unlock()

	sent := time.Now()
	res, err := c.release(ctx, &m.k, h.ownerArg, want, m.keepArg, h.relID)
	if err != nil && transient(err) {
		res, err = m.retryRelease(ctx, h, want, valid, err)
	}
	if err == nil && want > 0 && m.renew && res != releaseNotHeld {
		c.mu.Lock()
		h.extendLocked(sent.Add(validity(m.lease)))
		c.mu.Unlock()
	}

	c.mu.Lock()
	var news []notice
	if err == nil && res == releaseNotHeld {
		news = c.loseLocked(h, errHoldGone) // the loss itself, found by this call
	} else if err == nil && want == 0 && c.hook != nil {
		news = []notice{{ev: h.event(EventReleased, time.Since(h.acquired), nil)}}
	}
	lost := h.lostErr
	h.count = want
	if want == 0 {
		m.dropHoldLocked(h)
		if err == nil && res != releaseHandoff {
			m.wakeHeadLocked()
		}
	}
	c.mu.Unlock()
	c.announce(news)
	switch {
	case err == nil && res == releaseNotHeld:
		if plain {
			return nil
		}
		return m.wrap(lost)
	case err != nil:
		return m.wrap(err)
	}
	return nil
}

// retryRelease retries a release that met a transient error while the hold
// can still be valid; past that the lease ends it on the server anyway.
func (m *DistMutex) retryRelease(ctx context.Context, h *hold, want int, valid time.Time, err error) (int64, error) {
	ctx, cancel := context.WithDeadline(ctx, valid)
	defer cancel()
	var bo backoff
	for transient(err) && ctx.Err() == nil {
		m.c.log.Warn("remutex: retrying after transient error", "lock", m.name, "op", "release", "err", err)
		t := time.NewTimer(bo.next())
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		var res int64
		if res, err = m.c.release(ctx, &m.k, h.ownerArg, want, m.keepArg, h.relID); err == nil {
			return res, nil
		}
	}
	return 0, err
}

// cleanup deletes a lost hold's field if it is still there, best effort.
func (m *DistMutex) cleanup(ctx context.Context, h *hold) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = m.c.release(ctx, &m.k, h.ownerArg, 0, "0", h.relID)
}

// backoff is capped exponential backoff with jitter: by default from 10ms to
// 1s, for transient errors.
type backoff struct{ d, first, limit time.Duration }

func (b *backoff) next() time.Duration {
	if b.first == 0 {
		b.first, b.limit = 10*time.Millisecond, time.Second
	}
	switch {
	case b.d == 0:
		b.d = b.first
	case b.d < b.limit:
		b.d = min(2*b.d, b.limit)
	}
	return b.d/2 + jitter(b.d/2)
}

// warnHandler discards records below Warn.
type warnHandler struct{ slog.Handler }

func (h warnHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

// noCopy lets go vet report copies (see sync.noCopy).
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// wait blocks until the attempt holds the lock, ctx ends, or a permanent
// error. r is the reply of the attempt that found the lock busy.
//
// The waiter registers on the lock's channel and then looks again, which
// closes the race with a release in between. In normal mode it then waits for
// a release message, the holder's remaining lease, or ctx. Once it has waited
// starveAfter, or at once when others are queued, it joins the lock's queue in
// Redis: the final release then hands the lock to the queue's live head and
// publishes a grant naming that entry, and the waiter completes its Lock from
// the message alone. While queued it refreshes its entry every third of the
// entry's time to live; the refresh also notices a grant whose message was
// missed.
func (a *attempt) wait(ctx context.Context, r scriptReply, plain bool) (bool, error) {
	m := a.m
	c := m.c
	w := &waiter{ev: make(chan struct{}, 1)}
	c.mu.Lock()
	st := c.stateLocked(m)
	st.waiters = append(st.waiters, w)
	c.mu.Unlock()
	c.subAcquire(m.k.channel)
	defer c.subRelease(m.k.channel)

	var (
		start     = time.Now()
		queueNow  = r.code == replyQueued
		refreshed time.Time // send time of the last call that kept our entry alive
		err       error
		bo        backoff
		poll      = backoff{first: 2 * time.Millisecond, limit: 100 * time.Millisecond}
		timer     = time.NewTimer(time.Hour)
		// A quorum's contenders that split the servers between them retry
		// after a random delay, as Redlock prescribes: woken together by
		// each other's give-backs, they could otherwise keep splitting them.
		holdOff time.Time
		splitBo = backoff{first: time.Millisecond, limit: 50 * time.Millisecond}
	)
	defer timer.Stop()
	if r.split {
		holdOff = time.Now().Add(splitBo.next())
	}
	for {
		// Until the subscription is confirmed a release message could be
		// missed: look again at a polling pace, and as soon as it is.
		ready := c.subReady(m.k.channel)
		select {
		case <-ready:
			ready = nil
		default:
		}
		queue := c.queueing() && (w.entry != "" || queueNow || time.Since(start) >= starveAfter)
		var d time.Duration
		switch {
		case err != nil:
			d = bo.next()
		case w.entry != "":
			d = m.queueTTL() / 3
		case queue:
			d = 0
		default:
			d = max(time.Duration(r.val)*time.Millisecond, time.Millisecond)
			if c.queueing() {
				// Look again when it is time to join the queue. A quorum
				// has no queue: it waits for a release message or the
				// holder's lease.
				d = min(d, starveAfter-time.Since(start))
			}
		}
		if d > 0 && (ready != nil || c.subPolling()) {
			// Not subscribed (yet): a release message could be missed.
			d = min(d, poll.next())
		}
		if d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ready:
			case <-w.ev:
				c.mu.Lock()
				granted, fence := w.granted, w.fence
				w.granted = false
				if granted {
					w.entry = "" // the grant consumed it
				}
				c.mu.Unlock()
				if granted && c.ackReplicas > 0 {
					// Confirm the grant with an acknowledged call before
					// holding it: the release that granted it waited for no
					// replica.
					queueNow = true
				} else if granted {
					valid := refreshed.Add(validity(m.claimLease()))
					if held, err := a.finish(ctx, w, fence, valid, true); held || err != nil {
						return held, err
					}
					continue // came too late and was released: queue again
				}
			case <-ctx.Done():
				return a.giveUp(ctx, w, ctx.Err())
			case <-c.closing:
				return a.giveUp(ctx, w, ErrClosed)
			}
			queue = c.queueing() && (w.entry != "" || queueNow || time.Since(start) >= starveAfter)
		}
		if d := time.Until(holdOff); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return a.giveUp(ctx, w, ctx.Err())
			case <-c.closing:
				return a.giveUp(ctx, w, ErrClosed)
			}
		}

		var sent time.Time
		if !queue {
			r, sent, err = a.acquire(ctx)
		} else {
			sent = time.Now()
			c.mu.Lock()
			if w.entry == "" {
				w.entry = strconv.FormatInt(m.claimLease().Milliseconds(), 10) + ":" +
					m.fenceArg.(string) + ":" + strconv.FormatUint(c.nextSeqLocked(), 10) + ":" + a.owner
			}
			entry := w.entry
			c.mu.Unlock()
			r, err = c.enqueue(ctx, &m.k, a.owner, entry, m.queueTTL(), m.leaseArg, m.fenceArg)
			if err == nil && r.code == replyQueued {
				refreshed = sent
			}
		}
		if err != nil {
			if !transient(err) {
				return a.giveUp(ctx, w, err)
			}
			c.report(m.wrap(err))
			c.log.Warn("remutex: retrying after transient error", "lock", m.name, "op", "wait", "err", err)
			continue
		}
		bo = backoff{}
		if r.split {
			holdOff = time.Now().Add(splitBo.next())
		} else {
			splitBo = backoff{first: time.Millisecond, limit: 50 * time.Millisecond}
		}
		switch r.code {
		case replyGranted:
			c.mu.Lock()
			w.entry = "" // an enqueue grant removed the entry
			c.mu.Unlock()
			if held, err := a.finish(ctx, w, r.val, sent.Add(validity(m.lease)), false); held || err != nil {
				return held, err
			}
			r = scriptReply{} // came too late and was released: look again
		case replyQueued:
			queueNow = true
		}
	}
}

// finish completes a grant and, if it holds, stops waiting.
func (a *attempt) finish(ctx context.Context, w *waiter, fence int64, valid time.Time, renewNow bool) (bool, error) {
	held, err := a.complete(ctx, fence, valid, renewNow)
	if held || err != nil {
		// Holding, w passes no wake-up on: the lock is not free, and whoever
		// is woken could only look and wait again. This hold's Unlock wakes
		// the next waiter.
		a.leaveLocal(w, !held)
	}
	return held, err
}

// leaveLocal removes w from the local queue; with passOn, a wake-up it
// received and did not use goes to the next waiter.
func (a *attempt) leaveLocal(w *waiter, passOn bool) {
	c := a.m.c
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stateLocked(a.m)
	head := len(st.waiters) > 0 && st.waiters[0] == w
	st.removeWaiterLocked(w)
	if passOn && (head || len(w.ev) > 0) {
		st.wakeHeadLocked()
	}
}

// giveUp ends a wait that will not hold the lock, leaving nothing behind: the
// queue entry is removed in Redis, together with a grant it may have received.
func (a *attempt) giveUp(ctx context.Context, w *waiter, cause error) (bool, error) {
	m := a.m
	c := m.c
	c.mu.Lock()
	entry := w.entry
	w.entry = ""
	c.mu.Unlock()
	a.leaveLocal(w, true)
	if entry != "" {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(m.queueTTL(), time.Second))
		err := c.leave(lctx, &m.k, a.owner, entry)
		cancel()
		if err != nil {
			// The entry dies by its liveness deadline, a grant by its claim lease.
			c.log.Warn("remutex: leaving the queue failed", "lock", m.name, "err", err)
		}
	}
	return false, m.wrap(cause)
}
