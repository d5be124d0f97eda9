// Command cond runs producers and consumers on a bounded buffer kept in Redis,
// coordinated by two sync.Conds over one remutex.DistMutex: sync.NewCond(m)
// works because *DistMutex is a sync.Locker.
//
// The buffer is a Redis list of at most -capacity items. A producer takes the
// lock, waits on notFull while the list is full, pushes an item and signals
// notEmpty; a consumer waits on notEmpty while it is empty, pops an item and
// signals notFull. Cond.Wait unlocks the DistMutex while it waits (so the lock
// is free in Redis, for every process) and locks it again before it returns.
//
// Two rules come with it:
//
//   - Hold count 1. DistMutex is reentrant: a goroutine that locked it twice
//     has a hold count of 2, and Cond.Wait's one Unlock only lowers that to 1.
//     The lock stays held while the goroutine waits, so no other goroutine can
//     take it to change the condition and Signal: both wait forever. The
//     example's wait helper checks HoldCount before Wait and refuses.
//   - One process. Signal and Broadcast wake goroutines of this process only.
//     The lock excludes every process, but a goroutine of another process
//     waiting on its own Cond hears nothing: with several processes, wake
//     waiters another way too (a pub/sub message, or a timed re-check).
//
// It runs on an embedded miniredis unless REDIS_ADDR names a Redis server:
//
//	go run ./examples/cond
//	go run ./examples/cond -producers 4 -items 50 -consumers 3 -capacity 2
//
// It exits with status 1 if an item was lost or consumed twice, or the buffer
// overflowed.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// config is one run.
type config struct {
	producers int           // producer goroutines
	items     int           // items each producer makes
	consumers int           // consumer goroutines
	capacity  int           // the most items the buffer holds
	work      time.Duration // a consumer's time per item, outside the lock
}

func main() {
	var cfg config
	flag.IntVar(&cfg.producers, "producers", 2, "producer goroutines")
	flag.IntVar(&cfg.items, "items", 20, "items per producer")
	flag.IntVar(&cfg.consumers, "consumers", 3, "consumer goroutines")
	flag.IntVar(&cfg.capacity, "capacity", 4, "the most items the buffer in Redis holds")
	flag.DurationVar(&cfg.work, "work", 5*time.Millisecond, "a consumer's time per item, outside the lock")
	flag.Parse()
	if cfg.producers < 1 || cfg.items < 1 || cfg.consumers < 1 || cfg.capacity < 1 || cfg.work < 0 {
		fmt.Fprintln(os.Stderr, "cond: need -producers, -items, -consumers and -capacity ≥ 1, -work ≥ 0")
		os.Exit(2)
	}
	res, err := run(context.Background(), os.Stdout, cfg, os.Getenv("REDIS_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cond:", err)
		os.Exit(1)
	}
	if !res.ok(cfg) {
		os.Exit(1)
	}
}

// result is what a run did.
type result struct {
	produced, consumed int
	duplicates         int   // items consumed more than once
	maxLen             int64 // the longest the buffer got
	fullWaits          int64 // producer waits for room
	emptyWaits         int64 // consumer waits for items
	freeWhileWaiting   bool  // another Client took the lock while all consumers waited
	refused            error // the Wait at hold count 2, refused
}

func (r result) ok(cfg config) bool {
	n := cfg.producers * cfg.items
	return r.produced == n && r.consumed == n && r.duplicates == 0 && r.maxLen <= int64(cfg.capacity) &&
		r.freeWhileWaiting && r.refused != nil
}

// errHoldCount is wait's refusal to Wait at a hold count above 1.
var errHoldCount = errors.New("Cond.Wait at a hold count above 1 keeps the lock: nobody could Signal")

// wait is c.Wait for a Cond over m, checking first that the calling
// goroutine's hold count is 1: only then does Wait's Unlock free the lock.
func wait(c *sync.Cond, m *remutex.DistMutex) error {
	if n := m.HoldCount(); n != 1 {
		return fmt.Errorf("%w (hold count %d)", errHoldCount, n)
	}
	c.Wait()
	return nil
}

// buffer is the shared state in Redis, and the Conds over its lock.
type buffer struct {
	rdb      *redis.Client
	m        *remutex.DistMutex
	notFull  *sync.Cond
	notEmpty *sync.Cond
	list     string // the items
	consumed string // counter of items taken
	capacity int64
	total    int64 // items that will be produced in all

	waiting    atomic.Int64 // consumers in Wait right now
	fullWaits  atomic.Int64
	emptyWaits atomic.Int64
	maxLen     atomic.Int64
}

// produce pushes one item, waiting for room.
func (b *buffer) produce(ctx context.Context, item string) error {
	b.m.Lock()
	defer b.m.Unlock()
	for {
		n, err := b.rdb.LLen(ctx, b.list).Result()
		if err != nil {
			return err
		}
		if n < b.capacity {
			break
		}
		b.fullWaits.Add(1)
		if err := wait(b.notFull, b.m); err != nil {
			return err
		}
	}
	n, err := b.rdb.RPush(ctx, b.list, item).Result()
	if err != nil {
		return err
	}
	for old := b.maxLen.Load(); n > old && !b.maxLen.CompareAndSwap(old, n); old = b.maxLen.Load() {
	}
	b.notEmpty.Signal()
	return nil
}

// consume pops one item, waiting for one. It returns "" once every item was
// consumed.
func (b *buffer) consume(ctx context.Context) (string, error) {
	b.m.Lock()
	defer b.m.Unlock()
	for {
		done, err := b.rdb.Get(ctx, b.consumed).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return "", err
		}
		if done == b.total {
			b.notEmpty.Broadcast() // the other consumers are done too
			return "", nil
		}
		item, err := b.rdb.LPop(ctx, b.list).Result()
		if err == nil {
			if err := b.rdb.Incr(ctx, b.consumed).Err(); err != nil {
				return "", err
			}
			b.notFull.Signal()
			return item, nil
		}
		if !errors.Is(err, redis.Nil) {
			return "", err
		}
		b.emptyWaits.Add(1)
		b.waiting.Add(1)
		err = wait(b.notEmpty, b.m)
		b.waiting.Add(-1)
		if err != nil {
			return "", err
		}
	}
}

// run runs the producers and consumers on the Redis at addr (an embedded
// miniredis if empty) and prints what happened to out.
func run(ctx context.Context, out io.Writer, cfg config, addr string) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	where := addr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return result{}, err
		}
		defer mr.Close()
		addr, where = mr.Addr(), "embedded miniredis (set REDIS_ADDR to use a Redis server)"
	}
	fmt.Fprintf(out, "cond:      a buffer of %d in Redis, %d producers × %d items, %d consumers (%v per item), sync.NewCond over one DistMutex\n",
		cfg.capacity, cfg.producers, cfg.items, cfg.consumers, cfg.work)
	fmt.Fprintf(out, "redis:     %s\n", where)

	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := remutex.NewClient(rdb)
	defer locks.Close() // before rdb.Close: deferred calls run last in, first out
	b := newBuffer(rdb, locks, cfg)
	defer rdb.Del(context.WithoutCancel(ctx), b.list, b.consumed)

	var res result
	c := &crew{b: b, seen: map[string]int{}, cancel: cancel}
	// Consumers first: they find the buffer empty and wait.
	for range cfg.consumers {
		c.start(func() { c.consume(ctx, cfg.work) })
	}
	res.freeWhileWaiting = freeWhileWaiting(ctx, rdb, b, cfg.consumers)
	if res.freeWhileWaiting {
		fmt.Fprintf(out, "waiting:   all %d consumers in Cond.Wait on the empty buffer; another Client took the lock meanwhile: Wait released it\n", cfg.consumers)
	} else {
		fmt.Fprintln(out, "waiting:   FAIL: another Client could not take the lock while the consumers waited")
	}

	start := time.Now()
	for p := range cfg.producers {
		c.start(func() { c.produce(ctx, p+1, cfg.items) })
	}
	c.wg.Wait()
	if c.err != nil {
		return result{}, c.err
	}
	c.tally(&res, cfg)
	fmt.Fprintf(out, "buffer:    produced %d, consumed %d distinct items (%d twice) in %v; the buffer held at most %d\n",
		res.produced, len(c.seen), res.duplicates, time.Since(start).Round(time.Millisecond), res.maxLen)
	fmt.Fprintf(out, "waits:     producers waited %d times for room (notFull), consumers %d times for items (notEmpty)\n",
		res.fullWaits, res.emptyWaits)

	res.refused = waitTwiceHeld(b)
	fmt.Fprintf(out, "rule:      a goroutine holding the lock twice called wait: %v\n", res.refused)
	if res.ok(cfg) {
		fmt.Fprintln(out, "verdict:   ok: every item consumed exactly once, the buffer never overflowed")
	} else {
		fmt.Fprintln(out, "verdict:   FAIL")
	}
	return res, nil
}

// newBuffer returns an empty buffer of a run of its own, under a lock of its
// own.
func newBuffer(rdb *redis.Client, locks *remutex.Client, cfg config) *buffer {
	var id [6]byte
	_, _ = rand.Read(id[:])
	run := "cond:" + hex.EncodeToString(id[:])
	b := &buffer{
		rdb: rdb, m: locks.NewMutex(run),
		list: run + ":items", consumed: run + ":consumed",
		capacity: int64(cfg.capacity), total: int64(cfg.producers * cfg.items),
	}
	b.notFull, b.notEmpty = sync.NewCond(b.m), sync.NewCond(b.m)
	return b
}

// crew is the producer and consumer goroutines, and what they saw.
type crew struct {
	b      *buffer
	cancel context.CancelFunc // stops the others after a failure
	wg     sync.WaitGroup
	mu     sync.Mutex
	seen   map[string]int // item -> times consumed
	err    error          // the first failure
}

// start runs f in a goroutine of the crew.
func (c *crew) start(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
}

// fail records the first failure and stops the others.
func (c *crew) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		c.cancel()
	}
}

// consume is a consumer: it takes items until every item was consumed,
// handling each for work without the lock.
func (c *crew) consume(ctx context.Context, work time.Duration) {
	for {
		item, err := c.b.consume(ctx)
		if err != nil {
			c.fail(err)
			return
		}
		if item == "" {
			return
		}
		c.mu.Lock()
		c.seen[item]++
		c.mu.Unlock()
		time.Sleep(work) // handle the item, without the lock
	}
}

// produce is producer p: it makes items, "p<p>-1" and on.
func (c *crew) produce(ctx context.Context, p, items int) {
	for i := range items {
		if err := c.b.produce(ctx, fmt.Sprintf("p%d-%d", p, i+1)); err != nil {
			c.fail(err)
			return
		}
	}
}

// tally adds up what the crew saw, once it is done.
func (c *crew) tally(res *result, cfg config) {
	res.produced = cfg.producers * cfg.items
	for _, n := range c.seen {
		res.consumed += n
		if n > 1 {
			res.duplicates++
		}
	}
	res.maxLen, res.fullWaits, res.emptyWaits = c.b.maxLen.Load(), c.b.fullWaits.Load(), c.b.emptyWaits.Load()
}

// freeWhileWaiting reports whether, while all consumers wait, another
// process (a Client of its own) can take the lock: it is free in Redis.
func freeWhileWaiting(ctx context.Context, rdb *redis.Client, b *buffer, consumers int) bool {
	other := remutex.NewClient(rdb)
	defer other.Close()
	deadline := time.Now().Add(10 * time.Second)
	for b.waiting.Load() < int64(consumers) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	om := other.NewMutex(b.m.Name())
	octx, ocancel := context.WithTimeout(ctx, 5*time.Second)
	defer ocancel()
	if err := om.LockContext(octx); err != nil {
		return false
	}
	free := b.waiting.Load() == int64(consumers)
	_ = om.UnlockContext(ctx)
	return free
}

// waitTwiceHeld shows the hold-count rule: a goroutine that holds the lock
// twice must not Wait. The wait helper refuses instead of waiting forever.
func waitTwiceHeld(b *buffer) error {
	b.m.Lock()
	defer b.m.Unlock()
	b.m.Lock() // nested, as a helper that locks again would
	defer b.m.Unlock()
	return wait(b.notEmpty, b.m)
}
