package remutex_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// Do runs work under the lock and hands it the hold's context, which any
// goroutine may use: here two workers stop when the hold is lost (the
// lock's key deleted behind its back). Do unlocks when the function returns
// and reports the loss.
func ExampleDistMutex_Do() {
	addr, stop := exampleRedis()
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := remutex.NewClient(rdb)
	defer locks.Close()

	m := locks.NewMutex("job:reindex", remutex.WithLease(300*time.Millisecond))
	err := m.Do(context.Background(), func(ctx context.Context) error {
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() { // holds nothing itself: ctx, not m.Lost, tells it of the loss
				defer wg.Done()
				<-ctx.Done()
			}()
		}
		rdb.Del(ctx, "remutex:{job:reindex}") // an operator "cleans up"
		wg.Wait()
		return context.Cause(ctx)
	})
	fmt.Println("the hold was lost while the work ran:", errors.Is(err, remutex.ErrLockLost))
	// Output:
	// the hold was lost while the work ran: true
}

// HoldContext is the hold's context for code that locks and unlocks itself:
// it ends when the hold is released (or lost).
func ExampleDistMutex_HoldContext() {
	addr, stop := exampleRedis()
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := remutex.NewClient(rdb)
	defer locks.Close()

	m := locks.NewMutex("report:daily")
	m.Lock()
	ctx := m.HoldContext(context.Background())
	done := make(chan error)
	go func() { <-ctx.Done(); done <- context.Cause(ctx) }()
	m.Unlock()
	fmt.Println("released:", errors.Is(<-done, remutex.ErrReleased))
	// Output:
	// released: true
}

// Shutdown lets the holders finish: acquisitions stop at once, the holder
// works on and unlocks as usual, and the Client closes once no hold is left.
func ExampleClient_Shutdown() {
	addr, stop := exampleRedis()
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := remutex.NewClient(rdb)

	m := locks.NewMutex("report:daily")
	locked, unlocked := make(chan struct{}), make(chan error)
	go func() { // a worker in the middle of its critical section
		m.Lock()
		close(locked)
		time.Sleep(50 * time.Millisecond) // the work
		unlocked <- m.UnlockContext(context.Background())
	}()
	<-locked

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Println("Shutdown:", locks.Shutdown(ctx))
	fmt.Println("the worker's unlock:", <-unlocked)
	err := locks.NewMutex("report:daily").LockContext(ctx)
	fmt.Println("a Lock after it:", errors.Is(err, remutex.ErrClosed))
	// Output:
	// Shutdown: <nil>
	// the worker's unlock: <nil>
	// a Lock after it: true
}

// Check finds at startup what would otherwise surface at the first Lock:
// here a server whose maxmemory-policy may evict lock keys.
func ExampleClient_Check() {
	addr, stop := exampleRedis()
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := remutex.NewClient(rdb)
	defer locks.Close()

	err := locks.Check(context.Background())
	fmt.Println("check:", err)
	// Output:
	// check: <nil>
}
