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

// Inspect and ForceUnlock see a read/write lock too: here the write lock of
// a process that froze, released so that readers can enter.
func ExampleClient_Inspect_rwMutex() {
	addr, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()

	worker := remutex.NewClient(rdb) // stands for a process that froze while writing
	defer worker.Close()
	worker.NewRWMutex("config:app").Lock()

	admin := remutex.NewClient(rdb)
	defer admin.Close()
	info, err := admin.Inspect(ctx, "config:app")
	if err != nil {
		panic(err)
	}
	fmt.Println("kind:", info.Kind, "holders:", len(info.Holders), "read hold:", info.Holders[0].Read)

	released, err := admin.ForceUnlock(ctx, "config:app")
	fmt.Println("released:", released, err)

	reader := admin.NewRWMutex("config:app")
	fmt.Println("a reader enters:", reader.TryRLock())
	info, _ = admin.Inspect(ctx, "config:app")
	fmt.Println("readers now:", info.Readers, "read hold:", info.Holders[0].Read)
	reader.RUnlock()
	// Output:
	// kind: rwmutex holders: 1 read hold: false
	// released: true <nil>
	// a reader enters: true
	// readers now: 1 read hold: true
}
