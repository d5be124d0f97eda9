// Package remutex is a distributed mutex on Redis that goes where a
// sync.Mutex stood: DistMutex implements sync.Locker and TryLock, excludes
// goroutines in every process that uses the same lock name on the same Redis,
// and is reentrant per goroutine. DistRWMutex does the same for
// sync.RWMutex: many readers or one writer, with writer preference.
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
// A hold belongs to the goroutine that took it: its owner token is
// <client id>:<goroutine id>.<n>, where the Client's id is 128 random bits
// in base64url followed by the host and process id of the Client's process
// ("<22 characters>.<host>.<pid>"), so that Client.Inspect can tell an
// operator where a holder runs, and n numbers the acquisition: no two
// acquisitions share a token, so that a call of an earlier one, however
// late or often it reaches Redis, finds nothing of a later one to change
// (a NonReentrant hold's token is <client id>:n<n>). A goroutine that locks a lock it holds
// raises its hold count (one round trip) and must unlock as many times.
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
// Waiters never poll. The call that finds the lock busy also puts the caller
// at the end of a queue kept in Redis next to the lock (a list, in arrival
// order, whose TTL every waiter's call renews), and the waiter sleeps until a
// message, the holder's remaining lease, or its next refresh. A release
// publishes only when someone waits, and then one message, to the Client of
// the queue's head alone: on a single server (standalone, Sentinel, Cluster)
// it hands the lock to the head directly, newcomers queue behind, and the
// waiter holds the lock from the message alone. So the queue is first in,
// first out across every process, no waiter is starved, and a hand-off
// costs Redis one script call and one message. A head whose Client no
// longer listens (PUBSUB NUMSUB counts nobody: its process died) is dropped
// by that same call, and the next one served; a grant, once published, is
// never given back (the message may reach a listener the count does not
// see: on a replica, or on another node of a Cluster on classic pub/sub,
// Redis 6.2's, where every head counts as listening). On a quorum the release only
// wakes the head, which takes the lock with its next call on a majority.
//
// # Protocol
//
// A lock named N under prefix P is the hash P{N} (owner token → hold count)
// with a lease (PEXPIRE), the fence counter P{N}:fence, and the queue, the
// list P{N}:waiting (entries <claim ms>:<flag>:<wait id>-<at>.<arrival ms>:<owner
// token>, the arrival on the waiter's clock, for Inspect); its Client hears
// of it on P{N}:released:<client id> (SPUBLISH on a Redis 7 cluster). All share one cluster slot. The scripts of
// internal/scripts (embedded) change them: for a DistMutex acquire.lua (take,
// raise or queue), release.lua, leave.lua (a waiter that gives up) and the
// watchdog's renew.lua. Their uncontended paths come first and touch only
// what they need: acquire is EXISTS + HSET + PEXPIRE (+ INCR with fencing),
// release is HDEL + EXISTS.
//
// Redis pays about as much for each argument of a script call, and for a
// table it returns, as for a command the script runs, and some 13k
// instructions for the call itself. So for a lock that the Client has not
// seen contended in the last second, a DistMutex sends those paths alone:
// quick_lock.lua (KEYS hash and queue, plus the fence counter WithFencing;
// ARGV owner and lease; it answers the fence token, or -1 for anything but
// a free lock), and for the final release no script at all, but HDEL of the
// owner's field and EXISTS of the queue in one pipeline: the one change to
// a lock that is not a script's. It is safe without one: HDEL of the
// owner's own field is idempotent and harmless after a loss, and a waiter
// that queues after it finds the lock free, while one that queued before
// is seen by the EXISTS, after which wake.lua passes the lock on. A
// DistRWMutex's readers send quick_rlock.lua and ZREM + EXISTS alike. A
// quick call that finds more than it can do hands over to the full script,
// in a second call; a lock seen contended (a busy reply, a waiter, a
// hand-off) is sent the full scripts at once, but for a DistMutex's final
// release: HDEL of the owner's field and wake.lua in one pipeline, which
// leaves what release.lua would, and has Redis write the waiter's message
// before the releaser's reply. A lone reader needs no clock:
// its deadline is written as 0, which means the readers key's own expiry,
// and given its value when another reader joins. When several goroutines
// of a Client release at once, their EXISTS are sent as one (on a single
// server), and asked again one by one only if somebody waits.
//
// Every call is safe to apply twice (go-redis resends a call whose reply was
// lost): scripts set absolute hold counts, and an acquire that finds its own
// field answers as granted. A final release that finds nothing is taken as
// done when it was sent inside the hold's validity: then the lock was still
// the caller's when its critical section ended, unless something outside
// the library deleted it, which the watchdog reports when it notices first.
// A grant from the queue carries a short claim lease (the entry's time to
// live); the watchdog extends it to the full lease only if the hold lasts
// long enough to need it, so a waiter that gave up without a word while its
// Client still listens blocks the lock for a claim window, not a lease, and
// a short hold costs no extra call. Every call of a waiter that finds its
// entry queued rewrites it with the call's send time, and the grant message
// names the entry as it stood: the grant is valid for its claim lease from
// that send time, which came before the grant however late the message
// arrives. A grant past it is neither taken nor given back: the wait's next
// call takes the lock if the grant is still its own in Redis, or queues
// again. A grant names
// the wait (wait id and owner token) it answers, so a goroutine that waits
// again never takes an earlier wait's grant for a new one, and a waiter that
// gave a grant back goes on under an owner token of its own, which that
// give-back cannot touch, however late it reaches Redis.
//
// # Read/write locks
//
// DistRWMutex is the same protocol with two sides. Its write side keeps the
// writer in the hash P{N}:rw, exactly like a mutex; its read side keeps one
// member per read hold in the sorted set P{N}:rw:readers, scored with the
// hold's deadline on the server's clock (now + lease, moved on by each
// renewal; 0 for a lone reader, whose deadline is the key's expiry), so that
// a reader that dies stops blocking writers after its lease even while
// other readers keep the key alive. Both sides share the fence counter and
// the queue (P{N}:rw:fence and P{N}:rw:waiting), whose entries say whether
// they wait to read or to write. The scripts wlock, rlock, wunlock, runlock
// and rwleave decide, with rw.lua's shared slow path: a reader enters while no writer holds the lock
// and nobody queues (writer preference: it queues behind any waiting
// writer); a writer enters when nobody holds either side. On a single server
// the queue always hands off: a release that ends what the head waits for
// grants it at once, to one writer, or to all the readers at the head
// together, one message to each waiter's Client. A writer that reads under
// its own write hold adds a read member with its own owner token, and keeps
// it when it unlocks the write: that is the downgrade, atomic in wunlock.
// The watchdog renews read holds in the same batched calls as the others.
//
// # Semaphores
//
// DistSemaphore is golang.org/x/sync/semaphore's Weighted across processes,
// on the same protocol: each Acquire is a holding of its own in the hash
// P{N}:sem, owner token → "<permits>:<deadline>" (the deadline on the
// server's clock; "<permits>" alone for a lone holder, whose deadline is
// the key's expiry), renewed by the watchdog, so that the permits of a process that
// dies come back when their lease ends. The scripts sem_acquire,
// sem_release, sem_leave (with sem.lua's shared slow path) and quick_sem
// count the holdings against the size, kept in P{N}:sem:size, and hand
// freed permits to the heads of the queue P{N}:sem:waiting, first in, first
// out: a request that does not fit blocks those behind it. Permits belong
// to the DistSemaphore value, not to goroutines.
//
// # Once
//
// DistOnce is sync.Once across processes, on a mutex of its own (P{N}:once,
// with its fence counter and queue): Do takes it (NonReentrant: every
// value is a holder of its own) and reads the records; the one that finds
// no outcome runs f under the renewed hold, and its final release,
// once_release.lua, records the outcome in the same call: P{N}:once:done
// (kept without expiry) for a success, P{N}:once:err (kept briefly, for the
// run's waiters) for a failure, and tells the waiters queued as for a mutex
// the outcome, one message per Client, removing their entries: each returns
// with it, without a call. A waiter that does not hear it finds its entry
// gone at its next call, and takes the lock to read the outcome. Do reads
// the records with two GETs; once.lua deletes them (Reset) and names a
// record key of another type.
//
// # Deadlines, losses and shutdown
//
// Every context form returns at its context's end, and TryLock within
// TryLockTimeout, whatever the redis client's options (ContextTimeoutEnabled
// or not, retries) and whatever Redis does: a call with a context that can
// end is sent by a goroutine of the Client, the caller stops waiting for it
// at the context's end, and what the call may have done (queued the caller,
// granted it the lock) is undone by a call that follows it to Redis in the
// background.
//
// A hold that is lost ends for its goroutine: HoldCount is 0, the next Lock
// takes the lock anew, and the lost hold's Unlocks (owed after those of any
// hold taken since: a goroutine's Unlocks pair with its Locks last in, first
// out) report ErrLockLost. Lost answers for the calling goroutine; a hold's
// context (HoldContext, Do) may be handed to any goroutine.
//
// Client.Close loses the holds still held and ends every wait: the context
// forms return ErrClosed, and Lock, which cannot return without the lock,
// blocks for good. Client.Shutdown first lets the holds finish. Client.Check
// checks the connection, the scripts, an ACL user's permissions and the
// server's eviction policy up front.
//
// # Operations
//
// Client.Inspect reads a lock of any kind as an operator needs it (holders
// with the host and pid of their process, their mode and remaining lease,
// fence, waiters, listening Clients), and Client.ForceUnlock releases a
// frozen holder's hold through the script of its own unlock, so that its
// waiters are woken as after an Unlock. The remutex command (cmd/remutex)
// uses them for its status and unlock --force.
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
