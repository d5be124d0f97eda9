package remutex

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/transport"
	"github.com/remutex/remutex/internal/wire"
)

// DefaultKeyPrefix is the key prefix of a Client without WithKeyPrefix.
const DefaultKeyPrefix = "remutex:"

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
	id      string    // <random 128 bits, hex>.<host>.<pid>: the owner-token prefix of every hold
	epoch   time.Time // its creation, on the monotonic clock: queue entries carry send times from it
	prefix  string
	log     *slog.Logger
	onError func(error)
	hook    func(Event)
	ack     replicaAck // WithReplicaAck; zero: none
	be      backend    // where the locks live: a node or a quorum

	closing  chan struct{} // closed by Close
	stopping chan struct{} // closed by Shutdown and Close: no new holds

	mu       sync.Mutex
	closed   bool
	draining bool                  // Shutdown began: acquisitions stop (stopping is closed)
	drained  chan struct{}         // Shutdown's: closed when the last live hold ends
	attempts int                   // acquisitions under way (see acquire)
	settled  chan struct{}         // after stopLocked: closed when attempts is 0
	ended    []*hold               // lost holds that await Unlocks (see endLocked)
	locks    map[string]*lockState // by hash key; see state.go
	sweepAt  int                   // registry size at which sweepLocked looks again
	seq      uint64                // wait ids and NonReentrant owner tokens

	wd watchdog

	observers observers // DistElection.Observe's, by channel

	// contended are the times until which locks count as contended (see
	// quick), shared by every DistMutex of the Client and indexed by a hash
	// of the lock's name: two names that share a slot only send the full
	// scripts more often.
	contended [256]atomic.Int64
}

// Option configures a Client.
type Option func(*Client)

// WithKeyPrefix sets the prefix of every key and channel of the Client's
// locks. Default: "remutex:". Clients that must exclude each other need the
// same prefix. A prefix containing '{' or '}' panics in NewClient: it would
// change which part of a key Redis Cluster hashes, putting every lock in one
// slot or breaking the slot the keys of a lock share.
func WithKeyPrefix(prefix string) Option {
	return func(c *Client) {
		if strings.ContainsAny(prefix, "{}") {
			panic(fmt.Sprintf("remutex: WithKeyPrefix(%q): a prefix must not contain '{' or '}' (the lock name is the key's cluster hash tag)", prefix))
		}
		c.prefix = prefix
	}
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
// leases), after Lost has closed and outside remutex's own locks, and must
// not block. Default: none (errors are only logged).
func WithErrorHandler(f func(error)) Option {
	return func(c *Client) { c.onError = f }
}

// WithReplicaAck makes every acquisition and renewal wait until at least n
// replicas acknowledged its write (Redis WAIT, pipelined with the write: no
// extra round trip), for at most timeout. An acquisition that fewer replicas
// acknowledged is rolled back and fails with ErrTooFewReplicas (Lock retries
// it); a renewal that fewer acknowledged counts as failed, so a hold that
// cannot keep n replicas up to date is lost when its validity ends. A lock
// handed to a waiter by a release is confirmed by an acknowledged call of
// that waiter before its Lock returns. With it, a lock survives the
// promotion of an acknowledging replica after the primary fails; without
// it, a failover can lose a just-acquired lock and let a second holder in.
// timeout must be shorter than the redis client's ReadTimeout. Default: no
// acknowledgement (n = 0). n < 1 or timeout <= 0 panics in NewClient.
func WithReplicaAck(n int, timeout time.Duration) Option {
	return func(c *Client) {
		if n < 1 || timeout <= 0 {
			panic(fmt.Sprintf("remutex: WithReplicaAck(%d, %v): need n >= 1 and timeout > 0", n, timeout))
		}
		c.ack = replicaAck{replicas: n, timeout: timeout}
	}
}

// NewClient returns a Client that keeps its locks in rdb, which may be a
// *redis.Client, a *redis.ClusterClient, or a failover client. It sends no
// command until a mutex is used. It adds a hook to rdb that only watches
// for refused dials (see TryLock); the hook passes every command untouched
// and stays inert after Close. It panics if rdb is nil or an option is
// invalid.
func NewClient(rdb redis.UniversalClient, opts ...Option) *Client {
	if isNil(rdb) {
		panic("remutex: NewClient: nil redis client")
	}
	c := newClient("NewClient", opts)
	c.be = transport.NewNode(c.transportConfig(), rdb)
	return c
}

// replicaAck is WithReplicaAck: writes wait for this many replicas.
type replicaAck struct {
	replicas int
	timeout  time.Duration
}

// transportConfig is what c's backend is built from: its settings and the
// engine's hooks (deliver.go, scriptError).
func (c *Client) transportConfig() transport.Config {
	return transport.Config{Log: c.log, Replicas: c.ack.replicas, AckTimeout: c.ack.timeout,
		Listener: (*listener)(c), ScriptError: scriptError}
}

// newClient applies opts to a new Client without a backend.
func newClient(fn string, opts []Option) *Client {
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		panic("remutex: " + fn + ": crypto/rand: " + err.Error())
	}
	c := &Client{
		epoch:    time.Now(),
		id:       wire.ClientID(base64.RawURLEncoding.EncodeToString(id[:]), hostname(), os.Getpid()),
		prefix:   DefaultKeyPrefix,
		closing:  make(chan struct{}),
		stopping: make(chan struct{}),
		locks:    make(map[string]*lockState),
	}
	for _, o := range opts {
		if o == nil {
			panic("remutex: " + fn + ": nil option")
		}
		o(c)
	}
	if c.log == nil {
		c.log = slog.New(warnHandler{slog.Default().Handler()})
	}
	c.wd.c = c
	return c
}

// hostname returns the host name for Client ids (see wire.HostPart), or
// "unknown".
func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return wire.HostPart(h)
}

func isNil(v interface{}) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// CloseTimeout bounds Close (see there).
const CloseTimeout = time.Second

// Close stops the Client at once: its watchdog and pub/sub goroutines are
// stopped and joined before Close returns. It returns within CloseTimeout
// (1s) whatever Redis does: the releases and leaves that the Client's
// waiters posted are sent until then, and calls still out are then ended;
// one blocked reading from a server that stopped answering ends by the
// redis client's ReadTimeout (go-redis reads obey contexts only with
// ContextTimeoutEnabled), which then adds to the bound. A call still out
// on its caller's goroutine (Lock, Unlock) is not waited for past half the
// bound: what it may get ends by its lease on the server. Holds
// still held become lost (their Lost channels and contexts end, Unlock
// reports ErrLockLost and never panics) and expire on the server within
// their lease: Close does not delete them, so no other holder enters while
// their goroutines may still be working. Waiting and later acquisitions
// end: LockContext and TryLockContext return ErrClosed, TryLock says false,
// and Lock, which cannot return without the lock, blocks for good (see
// Lock). Use Shutdown to let the holds end first. The redis client is not
// closed: it belongs to the caller. Close returns ErrClosed if called
// again.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed = true
	c.stopLocked()
	close(c.closing)
	lost := c.wd.loseAllLocked(ErrClosed)
	settled := c.settled
	c.mu.Unlock()
	// The acquisitions under way stop at once, each posting what leaves
	// the queue; the node sends those before it closes. One whose call is
	// still out on its caller's goroutine (Lock, Unlock) is not waited for
	// past half the bound: what it may have got ends by its lease.
	t := time.NewTimer(CloseTimeout / 2)
	select {
	case <-settled:
	case <-t.C:
	}
	t.Stop()
	c.wd.stop()
	c.be.Close(time.Now().Add(CloseTimeout / 2))
	c.announce(lost)
	return nil
}

// Shutdown closes the Client gracefully: it stops acquisitions at once
// (waiting ones too: LockContext and TryLockContext return ErrClosed,
// TryLock says false, Lock blocks for good), lets the goroutines that hold
// locks finish (their nested Locks still count, their Unlocks release as
// usual), and once no hold is left, or when ctx ends, closes the Client as
// Close does, which loses the holds still held. It returns nil, ctx's error
// if it ended first, or ErrClosed if the Client was closed already.
//
// A service that shuts down calls it with a deadline, after it stopped
// handing out work:
//
//	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
//	defer cancel()
//	_ = locks.Shutdown(ctx)
func (c *Client) Shutdown(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.stopLocked()
	drained := c.drained
	c.mu.Unlock()
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if cerr := c.Close(); cerr != nil && err == nil {
		err = cerr // closed by someone else meanwhile
	}
	return err
}

// stopLocked stops acquisitions, waking the waiters, and prepares drained.
func (c *Client) stopLocked() {
	if c.draining {
		return
	}
	c.draining = true
	close(c.stopping)
	c.drained = make(chan struct{})
	c.wd.drainedLocked()
	c.settled = make(chan struct{})
	c.attemptDoneLocked(0)
}

// attemptDoneLocked counts the end of n acquisitions under way (see
// acquire), and tells Close when none is left once acquisitions stopped.
func (c *Client) attemptDoneLocked(n int) {
	c.attempts -= n
	if c.draining && c.attempts == 0 && !isClosed(c.settled) {
		close(c.settled)
	}
}

// blockClosed is where Lock waits on a closed Client: it cannot return
// without the lock.
func (c *Client) blockClosed(m *DistMutex) {
	c.log.Warn("remutex: Lock on a closed Client blocks for good (use LockContext to get ErrClosed)", "lock", m.spec.name)
	select {}
}

// report hands err to the error handler, if there is one.
func (c *Client) report(err error) {
	if c.onError != nil {
		c.onError(err)
	}
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
