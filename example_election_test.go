package remutex_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

func ExampleDistElection() {
	addr, stop := exampleRedis()
	defer stop()
	ctx := context.Background()

	// Two replicas of a service and a dashboard that watches who leads:
	// three Clients, each on its own connection pool, as three processes.
	var rdbs [3]*redis.Client
	var locks [3]*remutex.Client
	for i := range rdbs {
		rdbs[i] = redis.NewClient(&redis.Options{Addr: addr})
		defer rdbs[i].Close()
		locks[i] = remutex.NewClient(rdbs[i])
		defer locks[i].Close()
	}

	watching, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	changes := locks[2].NewElection("scheduler").Observe(watching)

	first := locks[0].NewElection("scheduler")
	if err := first.Campaign(ctx, "replica-a"); err != nil {
		fmt.Println(err)
		return
	}
	term := first.Term() // the term's fencing token, for the storage it writes to
	fmt.Println("observed:", (<-changes).Value)

	// The second replica waits until the first resigns.
	second := locks[1].NewElection("scheduler")
	won := make(chan error, 1)
	go func() { won <- second.Campaign(ctx, "replica-b") }()
	_ = first.Resign(ctx)
	fmt.Println("campaign:", <-won)
	l := <-changes
	fmt.Println("observed:", l.Value, "newer term:", l.Term > term)

	_ = second.Resign(ctx)
	_, err := second.Leader(ctx)
	fmt.Println(err)
	stopWatching()
	for range changes {
	}
	// Output:
	// observed: replica-a
	// campaign: <nil>
	// observed: replica-b newer term: true
	// remutex: leader "scheduler": no leader
}
