package remutex_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

func ExampleDistOnce_Do() {
	addr, stop := exampleRedis()
	defer stop()
	ctx := context.Background()

	// Three processes start at once (three Clients, each on its own
	// connection pool), and each must migrate the database before it serves.
	var wg sync.WaitGroup
	var mu sync.Mutex
	runs := 0
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			defer rdb.Close()
			locks := remutex.NewClient(rdb)
			defer locks.Close()
			err := locks.NewOnce("migrate:v42").Do(ctx, func(ctx context.Context) error {
				mu.Lock()
				runs++ // the migration: ctx ends if this run's lease is lost
				mu.Unlock()
				return nil
			})
			if err != nil {
				fmt.Println("not migrated:", err)
			}
		}()
	}
	wg.Wait()
	fmt.Println("migrations run:", runs)

	// Later, anywhere: the once is done, and f does not run.
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := remutex.NewClient(rdb)
	defer locks.Close()
	once := locks.NewOnce("migrate:v42")
	done, _ := once.Done(ctx)
	fmt.Println("done:", done)
	fmt.Println(once.Do(ctx, func(context.Context) error { return errors.New("not run") }))

	// A failed run is not done: its waiters get an *OnceError, and the next
	// Do runs f again.
	other := locks.NewOnce("migrate:v43")
	fmt.Println(other.Do(ctx, func(context.Context) error { return errors.New("column exists") }))
	fmt.Println(other.Do(ctx, func(context.Context) error { return nil }))
	// Output:
	// migrations run: 1
	// done: true
	// <nil>
	// column exists
	// <nil>
}
