package remutex_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// exampleRedis starts a throwaway in-memory Redis (miniredis) so that the
// examples run anywhere. In a program, use the address of your Redis.
func exampleRedis() (addr string, stop func()) {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	return mr.Addr(), mr.Close
}

func ExampleNewClient() {
	addr, stop := exampleRedis()
	defer stop()

	// The redis client belongs to the caller: remutex never closes it.
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()

	// One Client per process (per Redis deployment). Close stops its
	// watchdog and pub/sub goroutines; it runs before rdb.Close.
	locks := remutex.NewClient(rdb, remutex.WithKeyPrefix("shop:"))
	defer locks.Close()

	m := locks.NewMutex("stock:item-42")
	m.Lock()
	fmt.Println("locked", m.Name())
	fmt.Println("lock key exists:", rdb.Exists(context.Background(), "shop:{stock:item-42}").Val() == 1)
	m.Unlock()
	fmt.Println("lock key exists:", rdb.Exists(context.Background(), "shop:{stock:item-42}").Val() == 1)
	// Output:
	// locked stock:item-42
	// lock key exists: true
	// lock key exists: false
}

// Two Clients, standing for two processes, increment a counter in Redis with
// a read-modify-write. The DistMutex makes the increments exclusive, exactly
// as a sync.Mutex would within one process.
func ExampleDistMutex_Lock() {
	addr, stop := exampleRedis()
	defer stop()
	ctx := context.Background()

	var wg sync.WaitGroup
	for range 2 { // two processes
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		locks := remutex.NewClient(rdb)
		defer locks.Close()
		m := locks.NewMutex("counter")

		for range 5 { // five goroutines each
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 10 {
					m.Lock()
					n, _ := rdb.Get(ctx, "counter").Int() // 0 while missing
					rdb.Set(ctx, "counter", n+1, 0)
					m.Unlock()
				}
			}()
		}
	}
	wg.Wait()

	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	fmt.Println("counter:", rdb.Get(ctx, "counter").Val())
	// Output:
	// counter: 100
}

// A goroutine that holds a lock may lock it again: the hold count rises, and
// the lock is released when it falls back to zero.
func ExampleDistMutex_HoldCount() {
	addr, stop := exampleRedis()
	defer stop()

	rdbA := redis.NewClient(&redis.Options{Addr: addr})
	defer rdbA.Close()
	a := remutex.NewClient(rdbA)
	defer a.Close()
	rdbB := redis.NewClient(&redis.Options{Addr: addr})
	defer rdbB.Close()
	b := remutex.NewClient(rdbB)
	defer b.Close()

	m := a.NewMutex("account:7")
	other := b.NewMutex("account:7") // the same lock, seen from another process

	transfer := func() {
		m.Lock() // already held by the caller: only the count rises
		defer m.Unlock()
		fmt.Println("in transfer, hold count", m.HoldCount())
	}

	m.Lock()
	fmt.Println("hold count", m.HoldCount())
	transfer()
	fmt.Println("hold count", m.HoldCount())
	fmt.Println("other process gets it:", other.TryLock())
	m.Unlock()
	fmt.Println("hold count", m.HoldCount())
	fmt.Println("other process gets it:", other.TryLock())
	other.Unlock()
	// Output:
	// hold count 1
	// in transfer, hold count 2
	// hold count 1
	// other process gets it: false
	// hold count 0
	// other process gets it: true
}

// LockContext gives up when its context ends, leaving nothing behind, and
// returns the context's error wrapped with the lock's name.
func ExampleDistMutex_LockContext() {
	addr, stop := exampleRedis()
	defer stop()

	rdbA := redis.NewClient(&redis.Options{Addr: addr})
	defer rdbA.Close()
	a := remutex.NewClient(rdbA)
	defer a.Close()
	rdbB := redis.NewClient(&redis.Options{Addr: addr})
	defer rdbB.Close()
	b := remutex.NewClient(rdbB)
	defer b.Close()

	holder := a.NewMutex("report:daily")
	holder.Lock()

	m := b.NewMutex("report:daily")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := m.LockContext(ctx)
	fmt.Println("timed out:", errors.Is(err, context.DeadlineExceeded))
	// The error names the lock and the operation; when a call was still out
	// at the deadline it also says what it was waiting for.
	var le *remutex.LockError
	if errors.As(err, &le) {
		fmt.Println("lock:", le.Lock, "op:", le.Op)
	}

	holder.Unlock()
	if err := m.LockContext(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("locked after the holder let go")
	if err := m.UnlockContext(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// timed out: true
	// lock: report:daily op: lock
	// locked after the holder let go
}

// Lost tells a holder that its hold ended before it unlocked, here because
// the lock's key was deleted behind its back. Work that must not run without
// the lock watches the channel (and, where a paused holder could still do
// harm, uses fencing; see WithFencing).
func ExampleDistMutex_Lost() {
	addr, stop := exampleRedis()
	defer stop()
	ctx := context.Background()

	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := remutex.NewClient(rdb)
	defer locks.Close()

	// A short lease, so that the watchdog's next renewal (every lease/3)
	// notices the loss soon.
	m := locks.NewMutex("job:reindex", remutex.WithLease(300*time.Millisecond))
	m.Lock()
	lost := m.Lost()
	select {
	case <-lost:
		fmt.Println("lost")
	default:
		fmt.Println("held")
	}

	rdb.Del(ctx, "remutex:{job:reindex}") // an operator "cleans up"

	select {
	case <-lost:
		fmt.Println("lost")
	case <-time.After(10 * time.Second):
		fmt.Println("still held?")
	}
	err := m.UnlockContext(ctx)
	fmt.Println("unlock reports the loss:", errors.Is(err, remutex.ErrLockLost))
	// Output:
	// held
	// lost
	// unlock reports the loss: true
}

// With WithFencing every acquisition carries a token that is larger than any
// token handed out before, whichever process took the lock. The storage the
// lock protects remembers the largest token it has seen and refuses writes
// with a smaller one: a holder paused past its lease cannot overwrite the
// work of the holder that followed it.
func ExampleDistMutex_Fence() {
	addr, stop := exampleRedis()
	defer stop()

	rdbA := redis.NewClient(&redis.Options{Addr: addr})
	defer rdbA.Close()
	a := remutex.NewClient(rdbA)
	defer a.Close()
	rdbB := redis.NewClient(&redis.Options{Addr: addr})
	defer rdbB.Close()
	b := remutex.NewClient(rdbB)
	defer b.Close()

	ma := a.NewMutex("ledger", remutex.WithFencing())
	mb := b.NewMutex("ledger", remutex.WithFencing())

	ma.Lock()
	first := ma.Fence()
	ma.Lock() // nested: same hold, same token
	fmt.Println("nested keeps the token:", ma.Fence() == first)
	ma.Unlock()
	ma.Unlock()

	mb.Lock()
	second := mb.Fence()
	mb.Unlock()

	fmt.Println("first > 0:", first > 0)
	fmt.Println("second > first:", second > first)

	// The check at the storage: accept a write only with a token at least as
	// large as the largest seen (here a map stands for the storage).
	var highest int64
	store := map[string]string{}
	write := func(token int64, k, v string) error {
		if token < highest {
			return errors.New("stale fencing token")
		}
		highest = token
		store[k] = v
		return nil
	}
	fmt.Println("new holder writes:", write(second, "balance", "90") == nil)
	fmt.Println("old holder writes:", write(first, "balance", "100") == nil)
	fmt.Println("balance:", store["balance"])
	// Output:
	// nested keeps the token: true
	// first > 0: true
	// second > first: true
	// new holder writes: true
	// old holder writes: false
	// balance: 90
}
