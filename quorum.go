package remutex

import (
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/transport"
)

// NewQuorumClient returns a Client whose locks live on a majority of
// independent Redis servers (the Redlock algorithm), for deployments where no
// single Redis, however replicated, may decide alone. The servers must not
// replicate each other. Its DistMutex API is the same as NewClient's:
//
//   - An acquisition succeeds when a majority of the servers granted it within
//     the lease's validity (lease minus the time the acquisition took, minus a
//     drift margin); otherwise what it got is released again.
//   - Reentrancy and renewal work per server; a hold is lost when fewer than a
//     majority renew it, or its validity passes without a majority renewal.
//   - Waiters are queued on every server and woken by a message from each
//     server that releases, but the lock is never handed to them: it is
//     always taken by a call that wins a majority (newcomers may win it), so
//     waits under heavy contention are not bounded as on a single
//     deployment.
//   - Fencing (WithFencing): each server keeps its own counter. The token of
//     an acquisition is the highest its majority granted, and before Lock
//     returns that value is written back (raised, never lowered) to a
//     majority of the counters. Any later majority shares a server with it, so
//     tokens strictly increase as long as no server loses its counter; a
//     server restarted without persistence reseeds from its clock, which keeps
//     them rising unless clocks jump back. This costs one more round trip.
//   - Like every lease lock, and Redlock in particular, it assumes bounded
//     clock drift between the servers and the client: a server whose clock
//     jumps forward expires leases early.
//
// Owner tokens are new for every try (<client id>:<goroutine id>.<n>, as
// every acquisition's on a single deployment): a try that lost gives back
// what it got late, in the background, and must never touch a later try's
// field. It panics with fewer than three servers or
// a nil one. The redis clients stay the caller's to close.
func NewQuorumClient(rdbs []redis.UniversalClient, opts ...Option) *Client {
	if len(rdbs) < 3 {
		panic(fmt.Sprintf("remutex: NewQuorumClient: need at least 3 independent servers, got %d", len(rdbs)))
	}
	for i, rdb := range rdbs {
		if isNil(rdb) {
			panic(fmt.Sprintf("remutex: NewQuorumClient: redis client %d is nil", i))
		}
	}
	c := newClient("NewQuorumClient", opts)
	c.be = transport.NewQuorum(c.transportConfig(), rdbs)
	return c
}
