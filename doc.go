// Package remutex is a distributed mutex on Redis that goes where a
// sync.Mutex stood: DistMutex implements sync.Locker and TryLock, excludes
// goroutines in every process that uses the same lock name on the same Redis,
// and is reentrant per goroutine.
//
// # Guarantees
//
// While a hold's lease is valid no other goroutine, in this process or any
// other, holds the lock. The lease (WithLease, default 30s) is renewed by the
// Client's watchdog every lease/3 for as long as the lock is held, so a lock
// is never lost merely because its critical section is long; a crashed holder
// stops renewing and the lock frees itself within one lease.
//
// A lease can still end while a goroutine believes it holds the lock: Redis
// unreachable for longer than the lease, the key deleted, a failover that lost
// the write. remutex tells the holder: Lost returns a channel that closes
// then, the error handler and logger hear of it, and Unlock reports
// ErrLockLost. The local deadline used for this counts from the send time of
// the last successful renewal minus a drift margin, so the holder learns of
// the loss before the key can expire on the server.
//
// # Fencing
//
// No lease lock can stop a holder that is paused (a long GC, SIGSTOP, a VM
// migration) from waking up after its lease ended and writing as if it still
// held the lock. Where that matters, use WithFencing: every acquisition gets a
// token from a counter in Redis that strictly increases, and the storage the
// lock protects rejects writes carrying a token lower than the highest it has
// seen. Fence returns the token of the calling goroutine's hold.
//
// # Ownership and reentrancy
//
// A hold belongs to the goroutine that took it: its owner token is the
// Client's random id and the goroutine id. A goroutine that locks a lock it
// holds raises its hold count (one round trip) and must unlock as many times.
// Unlock from a goroutine that holds nothing panics like sync.Mutex's.
//
// Differences from sync.Mutex:
//
//   - Reentrant per goroutine by default; NonReentrant restores sync.Mutex
//     behaviour (a second Lock blocks, any goroutine may Unlock).
//   - A zero DistMutex is not usable: create it with Client.NewMutex.
//   - Lock may return a lock that is later lost (see Lost); Lock panics on
//     permanent errors such as a key of another type under the lock's name.
//   - sync.NewCond(m) works, but Cond.Wait at a hold count above 1 releases
//     only one level: the lock stays held by the waiting goroutine, so a
//     goroutine that takes the lock to change the condition and Signal blocks
//     in Lock while the waiter waits for the Signal: both wait forever. Keep
//     the count at 1 around Wait, or Signal without taking the lock.
//
// # Waiting
//
// A waiter is woken by a message on the lock's channel when the lock is
// released; it never polls, except as a fallback (the holder's remaining
// lease; SUBSCRIBE denied by ACL). Waiters of one Client queue in arrival
// order. A waiter that has waited a few milliseconds joins a queue kept in
// Redis next to the lock; while that queue is not empty the final release
// hands the lock to its live head directly, and newcomers queue instead of
// barging, so no waiter in any process is starved.
//
// # Example
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	locks := remutex.NewClient(rdb)
//	defer locks.Close()
//
//	m := locks.NewMutex("stock:item-42")
//	m.Lock()
//	defer m.Unlock()
//	// ... read, check and write the stock ...
package remutex
