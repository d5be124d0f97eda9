package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/remutex/remutex"
)

// Every library sits behind the same two small interfaces. A client is one
// owner process: its own connection pool, its own pub/sub or tracking
// connection. A mutex is a handle on one lock name for one goroutine at a
// time (some libraries keep the hold's token in the handle).
type client interface {
	mutex(name string) mutex
	close()
}

type mutex interface {
	// lock waits until the lock is held or ctx ends.
	lock(ctx context.Context) error
	// unlock releases a hold taken by lock or tryLock.
	unlock(ctx context.Context) error
	// tryLock makes one attempt; (false, nil) means held by another owner.
	tryLock(ctx context.Context) (bool, error)
	// lost reports whether a hold is known to be lost (lease expired,
	// renewal failed).
	lost() bool
}

// extender is a mutex whose library has no watchdog: the user must extend
// the lease while holding the lock.
type extender interface {
	extend(ctx context.Context) error
}

// config is what a scenario asks of a client.
type config struct {
	addr    string
	wire    *wire
	lease   time.Duration // 0: the library's default
	slow    bool          // the server runs under callgrind: long timeouts
	scripts *scriptLog    // names and orders the script calls (go-redis clients), or nil
	// ctxTimeout: the go-redis client has ContextTimeoutEnabled (a remutex
	// Unlock then sends its release on its own goroutine).
	ctxTimeout bool
}

// variant is one library with one configuration.
type variant struct {
	name     string // as it appears in the results
	lib      string // library name
	remutex  bool   // the library under test
	watchdog bool   // renews held locks by itself
	held     bool   // runs the held and scale scenarios (polling does not matter there)
	setup    string // the options, in words
	connect  func(cfg config) (client, error)
	stalls   *atomic.Int64 // rueidislock: Lock calls that stalled and were retried
}

func variants() []variant {
	stalls := [3]*atomic.Int64{new(atomic.Int64), new(atomic.Int64), new(atomic.Int64)}
	return []variant{
		{
			name: "remutex", lib: "remutex", remutex: true, watchdog: true, held: true,
			setup:   "defaults (lease 30s, push hand-off, first in, first out)",
			connect: connectRemutex,
		},
		{
			name: "redsync", lib: "redsync", held: true, setup: "defaults (1 pool, expiry 8s, 32 tries, retry delay rand(50..250ms)); Lock retried on ErrFailed",
			connect: func(cfg config) (client, error) { return connectRedsync(cfg) },
		},
		{
			name: "redsync-1ms", lib: "redsync", setup: "WithRetryDelay(1ms), WithTries(MaxInt32)",
			connect: func(cfg config) (client, error) {
				return connectRedsync(cfg, redsync.WithRetryDelay(time.Millisecond), redsync.WithTries(math.MaxInt32))
			},
		},
		{
			name: "redislock-100ms", lib: "redislock", held: true, setup: "LinearBackoff(100ms) as in its examples (default is no retry), ttl 30s",
			connect: func(cfg config) (client, error) { return connectRedislock(cfg, 100*time.Millisecond) },
		},
		{
			name: "redislock-1ms", lib: "redislock", setup: "LinearBackoff(1ms), ttl 30s",
			connect: func(cfg config) (client, error) { return connectRedislock(cfg, time.Millisecond) },
		},
		{
			name: "rueidislock", lib: "rueidislock", watchdog: true, held: true,
			setup: "defaults (KeyMajority 2: 3 keys, validity 5s, wake-up by client-side-caching invalidation)",
			connect: func(cfg config) (client, error) {
				return connectRueidislock(cfg, rueidislock.LockerOption{}, stalls[0])
			},
			stalls: stalls[0],
		},
		{
			name: "rueidislock-1key", lib: "rueidislock", watchdog: true, held: true,
			setup: "KeyMajority 1 (one key, as on a single Redis), NoLoopTracking",
			connect: func(cfg config) (client, error) {
				return connectRueidislock(cfg, rueidislock.LockerOption{KeyMajority: 1, NoLoopTracking: true}, stalls[1])
			},
			stalls: stalls[1],
		},
		{
			name: "rueidislock-1ms", lib: "rueidislock", watchdog: true,
			setup: "KeyMajority 1, client-side caching off: polls every TryNextAfter = 1ms",
			connect: func(cfg config) (client, error) {
				return connectRueidislock(cfg, rueidislock.LockerOption{
					KeyMajority: 1, TryNextAfter: time.Millisecond,
					ClientOption: rueidis.ClientOption{DisableCache: true},
				}, stalls[2])
			},
			stalls: stalls[2],
		},
	}
}

// --- remutex

type remutexClient struct {
	rdb   *redis.Client
	c     *remutex.Client
	lease time.Duration
}

func connectRemutex(cfg config) (client, error) {
	rdb := goRedis(cfg)
	c := remutex.NewClient(rdb, remutex.WithLogger(slog.New(slog.DiscardHandler)))
	return &remutexClient{rdb: rdb, c: c, lease: cfg.lease}, nil
}

func (r *remutexClient) mutex(name string) mutex {
	var opts []remutex.MutexOption
	if r.lease > 0 {
		opts = append(opts, remutex.WithLease(r.lease))
	}
	return &remutexMutex{m: r.c.NewMutex(name, opts...)}
}

func (r *remutexClient) close() {
	_ = r.c.Close()
	_ = r.rdb.Close()
}

type remutexMutex struct{ m *remutex.DistMutex }

func (m *remutexMutex) lock(ctx context.Context) error   { return m.m.LockContext(ctx) }
func (m *remutexMutex) unlock(ctx context.Context) error { return m.m.UnlockContext(ctx) }
func (m *remutexMutex) tryLock(ctx context.Context) (bool, error) {
	return m.m.TryLockContext(ctx)
}

// lost must be called by the goroutine that holds the lock: holds belong to
// goroutines.
func (m *remutexMutex) lost() bool {
	if m.m.HoldCount() == 0 {
		return true
	}
	select {
	case <-m.m.Lost():
		return true
	default:
		return false
	}
}

// --- redsync (go-redis v9 pool)

type redsyncClient struct {
	rdb  *redis.Client
	rs   *redsync.Redsync
	opts []redsync.Option
}

func connectRedsync(cfg config, opts ...redsync.Option) (*redsyncClient, error) {
	rdb := goRedis(cfg)
	if cfg.lease > 0 {
		opts = append(opts, redsync.WithExpiry(cfg.lease))
	}
	return &redsyncClient{rdb: rdb, rs: redsync.New(goredis.NewPool(rdb)), opts: opts}, nil
}

func (r *redsyncClient) mutex(name string) mutex {
	return &redsyncMutex{m: r.rs.NewMutex(name, r.opts...)}
}

func (r *redsyncClient) close() { _ = r.rdb.Close() }

type redsyncMutex struct {
	m      *redsync.Mutex
	isLost bool
}

// lock retries until held: redsync's Lock gives up after its tries.
func (m *redsyncMutex) lock(ctx context.Context) error {
	for {
		err := m.m.LockContext(ctx)
		if err == nil {
			m.isLost = false
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var taken *redsync.ErrTaken
		if !errors.Is(err, redsync.ErrFailed) && !errors.As(err, &taken) {
			return err
		}
	}
}

func (m *redsyncMutex) unlock(ctx context.Context) error {
	ok, err := m.m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock failed")
	}
	return err
}

func (m *redsyncMutex) tryLock(ctx context.Context) (bool, error) {
	err := m.m.TryLockContext(ctx)
	var taken *redsync.ErrTaken
	switch {
	case err == nil:
		m.isLost = false
		return true, nil
	case errors.Is(err, redsync.ErrFailed), errors.As(err, &taken):
		return false, nil
	}
	return false, err
}

func (m *redsyncMutex) extend(ctx context.Context) error {
	ok, err := m.m.ExtendContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: extend failed")
	}
	if err != nil {
		m.isLost = true
	}
	return err
}

func (m *redsyncMutex) lost() bool { return m.isLost }

// --- bsm/redislock

type redislockClient struct {
	rdb   *redis.Client
	c     *redislock.Client
	retry time.Duration
	ttl   time.Duration
}

func connectRedislock(cfg config, retry time.Duration) (*redislockClient, error) {
	rdb := goRedis(cfg)
	ttl := 30 * time.Second
	if cfg.lease > 0 {
		ttl = cfg.lease
	}
	return &redislockClient{rdb: rdb, c: redislock.New(rdb), retry: retry, ttl: ttl}, nil
}

func (r *redislockClient) mutex(name string) mutex {
	return &redislockMutex{c: r, name: name, opts: &redislock.Options{RetryStrategy: redislock.LinearBackoff(r.retry)}}
}

func (r *redislockClient) close() { _ = r.rdb.Close() }

type redislockMutex struct {
	c      *redislockClient
	name   string
	opts   *redislock.Options
	l      *redislock.Lock
	isLost bool
}

// lock retries until held: Obtain gives up after the ttl when ctx has no
// deadline.
func (m *redislockMutex) lock(ctx context.Context) error {
	for {
		l, err := m.c.c.Obtain(ctx, m.name, m.c.ttl, m.opts)
		if err == nil {
			m.l, m.isLost = l, false
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, redislock.ErrNotObtained) && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
	}
}

func (m *redislockMutex) unlock(ctx context.Context) error {
	err := m.l.Release(ctx)
	m.l = nil
	return err
}

func (m *redislockMutex) tryLock(ctx context.Context) (bool, error) {
	l, err := m.c.c.Obtain(ctx, m.name, m.c.ttl, nil)
	switch {
	case err == nil:
		m.l, m.isLost = l, false
		return true, nil
	case errors.Is(err, redislock.ErrNotObtained):
		return false, nil
	}
	return false, err
}

func (m *redislockMutex) extend(ctx context.Context) error {
	err := m.l.Refresh(ctx, m.c.ttl, nil)
	if err != nil {
		m.isLost = true
	}
	return err
}

func (m *redislockMutex) lost() bool { return m.isLost }

// --- rueidislock

type rueidisClient struct {
	lk     rueidislock.Locker
	stalls *atomic.Int64
}

func connectRueidislock(cfg config, opt rueidislock.LockerOption, stalls *atomic.Int64) (*rueidisClient, error) {
	opt.ClientOption.InitAddress = []string{cfg.addr}
	opt.ClientOption.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return cfg.wire.conn(c), nil
	}
	if cfg.lease > 0 {
		opt.KeyValidity = cfg.lease
	}
	if cfg.slow {
		opt.ClientOption.ConnWriteTimeout = slowTimeout
		opt.ClientOption.Dialer.Timeout = slowTimeout
	}
	lk, err := rueidislock.NewLocker(opt)
	if err != nil {
		return nil, fmt.Errorf("rueidislock: %w", err)
	}
	return &rueidisClient{lk: lk, stalls: stalls}, nil
}

func (r *rueidisClient) mutex(name string) mutex {
	return &rueidisMutex{lk: r.lk, name: name, stalls: r.stalls}
}
func (r *rueidisClient) close() { r.lk.Close() }

type rueidisMutex struct {
	lk     rueidislock.Locker
	name   string
	held   context.Context
	cancel context.CancelFunc
	stalls *atomic.Int64
}

// rueidisStall is how long a WithContext call may wait before it is given up
// and retried. With client-side caching, an attempt that fails on a free key
// (its acquire timed out after TryNextAfter, as happens on a loaded machine)
// waits for an invalidation of that key that never comes.
const rueidisStall = 5 * time.Second

func (m *rueidisMutex) lock(ctx context.Context) error {
	for {
		// No deadline on the context: rueidislock would cut the lock's
		// validity to it, and the hold ends with the context.
		try, giveUp := context.WithCancel(ctx)
		stall := time.AfterFunc(rueidisStall, giveUp)
		held, cancel, err := m.lk.WithContext(try, m.name)
		stalled := !stall.Stop()
		if err == nil && held.Err() == nil {
			m.held, m.cancel = held, cancel
			return nil
		}
		if err == nil {
			cancel() // taken just as it was given up
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !stalled {
			return err
		}
		m.stalls.Add(1)
	}
}

func (m *rueidisMutex) unlock(context.Context) error {
	m.cancel()
	m.held, m.cancel = nil, nil
	return nil
}

func (m *rueidisMutex) tryLock(ctx context.Context) (bool, error) {
	held, cancel, err := m.lk.TryWithContext(ctx, m.name)
	switch {
	case err == nil:
		m.held, m.cancel = held, cancel
		return true, nil
	case errors.Is(err, rueidislock.ErrNotLocked):
		return false, nil
	}
	return false, err
}

func (m *rueidisMutex) lost() bool { return m.held == nil || m.held.Err() != nil }
