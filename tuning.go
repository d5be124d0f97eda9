package remutex

import "time"

// The engine's tuning: bounds and times that are not options. The
// benchmarks and the fault suites chose them; the transport's own (pub/sub
// liveness, batching, a quorum's grace) stand beside the code they tune.

// The wait path.
const (
	// maxQueueTTL is the TTL every waiter's call gives the lock's queue
	// (queue_keep in enqueue.lua), so that a queue whose waiters all died
	// is gone within it; a waiter calls again every third of that (of its
	// lease, if shorter). A grant carries a claim lease of the same length
	// until the watchdog extends it.
	maxQueueTTL = 750 * time.Millisecond
)

// warnEvery is the least time between two log lines of a lock's retried
// errors: a Redis that is down (or a wrong address) would otherwise log a
// line per retry and lock, beside the redis client's own.
const warnEvery = 10 * time.Second

// rollbackTimeout bounds a rollback: past it the lease ends the hold.
const rollbackTimeout = time.Second

// maxEarly bounds the messages kept for waiters not registered yet; they
// are kept no longer than an entry lives without a refresh.
const maxEarly = 64

// maxEnded bounds the lost holds of a Client's goroutines that wait for
// their Unlocks (a hold of a fixed lease that is never unlocked, say). Past
// it the oldest is forgotten: its goroutine's Unlock then panics as an
// unlock of an unlocked mutex would.
const maxEnded = 1024
