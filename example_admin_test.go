package remutex_test

import (
	"context"
	"fmt"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// An operator's view of a lock: who holds it, from which process, and a
// forced release of a holder that froze.
func ExampleClient_Inspect() {
	addr, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()

	worker := remutex.NewClient(rdb) // stands for a process that froze while holding the lock
	defer worker.Close()
	m := worker.NewMutex("report:daily", remutex.WithFencing())
	m.Lock()

	admin := remutex.NewClient(rdb)
	defer admin.Close()
	info, err := admin.Inspect(ctx, "report:daily")
	if err != nil {
		panic(err)
	}
	h := info.Holders[0]
	fmt.Println("holders:", len(info.Holders), "hold count:", h.Count)
	fmt.Println("held by this process:", h.PID == os.Getpid())
	fmt.Println("fencing token is the holder's:", info.Fence == m.Fence())

	// Release only the holder seen, so that a new holder would be left alone.
	released, err := admin.ForceUnlock(ctx, "report:daily", h.Owner)
	fmt.Println("released:", released, err)
	info, _ = admin.Inspect(ctx, "report:daily")
	fmt.Println("holders now:", len(info.Holders))
	// Output:
	// holders: 1 hold count: 1
	// held by this process: true
	// fencing token is the holder's: true
	// released: true <nil>
	// holders now: 0
}
