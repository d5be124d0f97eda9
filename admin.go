package remutex

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/remutex/remutex/internal/transport"
	"github.com/remutex/remutex/internal/wire"
)

// Inspection and forced release: what an operator needs to see who holds a
// lock and to free one whose holder froze. They read and change locks
// through the same keys and scripts as DistMutex, DistRWMutex and
// DistSemaphore, so that users and the remutex command need not know the
// layout.

// LockInfo is the state of the lock under one name, as Inspect read it.
type LockInfo struct {
	Name string // the lock's name
	// Key is the key its holds live in: a DistMutex's hash P{Name}, a
	// DistRWMutex's writer hash P{Name}:rw (its readers are P{Name}:rw:readers),
	// a DistSemaphore's holders hash P{Name}:sem. The lock's other keys and
	// its channels begin with it. With Kind "" it is the DistMutex's.
	Key string
	// Kind is the kind of lock: "mutex" (a DistMutex), "rwmutex" (a
	// DistRWMutex), "semaphore" (a DistSemaphore), "once" (a DistOnce's
	// run: its Holders run it, its Waiters wait for it), "election" (a
	// DistElection's term: its Holders lead, its Waiters are the
	// candidates), or "" when nothing of any
	// kind is under the name: no holder, no waiter, no fence counter, no
	// semaphore size, no listening Client.
	Kind string

	// Holders are the holds of the lock, sorted by owner token, a write hold
	// before a read hold of the same owner. A DistMutex has one while it is
	// held (more only where something outside remutex wrote the hash); a
	// DistRWMutex has one writer, or any number of readers, or a writer and
	// its own read hold (RLock under its write hold); a DistSemaphore has
	// one per acquisition that still holds permits (Holder.Count of them).
	// None while it is free.
	Holders []Holder
	// TTL is the remaining lease: the longest of the holders' (when the lock
	// frees itself if nobody renews it), 0 when the lock is free, negative if
	// a hold has no expiry (which remutex never leaves).
	TTL time.Duration
	// Fence is the last fencing token handed out (the counter P{Name}:fence,
	// P{Name}:rw:fence or P{Name}:sem:fence), 0 if the lock was never taken
	// WithFencing (a DistRWMutex: never for writing; its readers are told
	// the latest write's token).
	Fence int64
	// Size is a DistSemaphore's size, the permits it has (as stored in
	// P{Name}:sem:size when it was first acquired, kept without expiry): 0
	// for the other kinds, and for a semaphore whose size key was deleted.
	// The permits held are the sum of the Holders' Count.
	Size int64
	// Readers is the number of read holds (the Holders with Read set): 0 but
	// for a DistRWMutex.
	Readers int
	// Waiters are the live entries of the lock's queue in Redis, in arrival
	// order; entries whose waiters stopped refreshing them are left out.
	Waiters []Waiter
	// WritersWaiting is the number of Waiters that wait to write a
	// DistRWMutex (while one does, readers that hold nothing queue behind
	// it); 0 for a DistMutex and a DistSemaphore, whose waiters have no
	// mode.
	WritersWaiting int
	// Subscribers is the number of Clients listening for the lock's
	// messages: those waiting for it, and for a fraction of a second those
	// that waited last. A Client that waits to read a DistRWMutex and also
	// to write it counts twice (it listens on a channel for each).
	Subscribers int

	// Others are the locks of the other kinds under the same name, when more
	// than one kind has state there (a DistMutex, a DistRWMutex and a
	// DistSemaphore of one name are independent locks), in the order mutex,
	// rwmutex, semaphore; nil otherwise. The LockInfo itself is the first
	// kind in that order that has state. Their own Others are nil.
	Others []LockInfo
}

// Holder is one hold of a lock: of a DistSemaphore, one acquisition.
type Holder struct {
	// Owner is the owner token: <client id>:<goroutine id>.<n>, one per
	// acquisition (see Event.Owner).
	Owner string
	// Count is the hold count; 1 for a read hold, whose nested holds only
	// its own process counts; for a DistSemaphore's holder, the permits it
	// holds.
	Count int
	// Read reports a read hold of a DistRWMutex; false for a DistMutex's
	// hold and a DistRWMutex's write hold.
	Read bool
	// Kept reports a hold that its owner released while its minimum hold
	// (WithMinHold) had time left: nobody holds the lock, but it stays taken
	// for TTL more. ForceUnlock releases it.
	Kept bool
	// TTL is the hold's remaining lease: a read hold's and a semaphore
	// holder's own (each has a deadline of its own; a lone one's is the
	// expiry of the key it lives in), else that of the hash it lives in;
	// negative if that key has no expiry.
	TTL  time.Duration
	Host string // host of the holder's Client; "" if its id does not say
	PID  int    // process id of the holder's Client; 0 if its id does not say
}

// Waiter is one entry of a lock's queue.
type Waiter struct {
	Owner string // the owner token it is to hold the lock under
	Read  bool   // it waits to read a DistRWMutex; false: to write it, or for a DistMutex or DistSemaphore
	// Permits is the number of permits a DistSemaphore's waiter asks for
	// (the queue's head gets them once that many are free, and those behind
	// it wait until it has); 0 for a lock's waiter.
	Permits int
	Host    string    // host of the waiter's Client; "" if its id does not say
	PID     int       // process id of the waiter's Client; 0 if its id does not say
	Since   time.Time // when its Lock (Acquire) began, by its own process's clock
}

// CheckName reports why NewMutex would refuse name: nil for a valid lock
// name, else an error that matches ErrInvalidName and says why.
func CheckName(name string) error {
	if err := checkName(name); err != nil {
		return &nameError{reason: err}
	}
	return nil
}

// Inspect returns the state of the lock called name under c's key prefix,
// of any kind (a DistMutex's, a DistRWMutex's or a DistSemaphore's; also
// one c never used), read in one script call, plus the PUBSUB calls that
// count Subscribers; it changes nothing. LockInfo.Kind says which kind it
// found; where locks of several kinds have state under the name, the others
// are in LockInfo.Others. A semaphore's holders whose lease ran out are
// left out, as are queue entries whose waiters stopped refreshing them.
//
// For a name NewMutex would refuse it returns an error matching
// ErrInvalidName and sends no command. For a key of another type under the
// name (at any kind's keys), a fence counter that is not an integer, a
// semaphore size that is not a non-negative integer, or a field of a
// semaphore's holders hash that is not a holding (Type "foreign-field"), it
// returns a *WrongTypeError. Otherwise it fails with ctx's error, ErrClosed
// after Close, or the Redis error; errors are *LockErrors with Op
// "inspect" (ForceUnlock's: "forceunlock") and the lock's name.
// When Redis refused or failed the call, the LockInfo holds Name and Key
// (the DistMutex's). On a Client made by NewQuorumClient it returns an
// error matching errors.ErrUnsupported: inspect each server through a
// NewClient of its own.
func (c *Client) Inspect(ctx context.Context, name string) (LockInfo, error) {
	t, err := c.checkAdmin(ctx, "inspect", name)
	if err != nil {
		return LockInfo{}, err
	}
	recs, err := c.be.Inspect(ctx, t, true)
	if err != nil {
		return LockInfo{Name: name, Key: t.Keys[0][0]}, adminError("inspect", name, err)
	}
	infos := make([]LockInfo, len(recs))
	for i := range recs {
		infos[i] = lockInfo(t, i, &recs[i])
	}
	return pickInfo(infos), nil
}

// ForceUnlock releases the holds of the lock called name under c's key
// prefix, whoever holds them, of every kind it finds there, each through
// the script of its own unlock: a DistMutex's hold and a DistRWMutex's
// write hold as Unlock releases them, a DistRWMutex's read holds as RUnlock
// does, a DistSemaphore's acquisitions as a Release of all their permits
// does. So the lock's waiters are woken, or handed the lock, by a message,
// exactly as after those calls: the longest waiter of a DistMutex; the
// readers at the head of a DistRWMutex's queue together, or its first
// waiting writer once no reader is left; the waiters at the head of a
// DistSemaphore's queue whose requests fit in the permits now free, in
// arrival order. Given owners (owner tokens, as Inspect reports them), it
// releases only their holds (every hold of each), so that a lock that
// changed hands since it was inspected stays with its new holders. It
// reports whether it released a hold: false with a nil error means nobody
// (or none of owners) held the lock.
//
// The holders are not told: each one's watchdog finds its hold gone at the
// next renewal, then its Lost channel closes and its Unlock (RUnlock,
// Release) reports ErrLockLost. Until then it may still be working, so use
// ForceUnlock for a holder that is frozen rather than dead (a dead holder's
// lock ends by itself within its lease), and fencing where a holder that
// resumes must not write. The fence counters are kept, so tokens keep
// rising; so is a semaphore's size.
//
// Its errors are Inspect's; after an error some of the holds may have been
// released. On a Client made by NewQuorumClient it returns an error matching
// errors.ErrUnsupported: release the lock through a NewClient per server.
func (c *Client) ForceUnlock(ctx context.Context, name string, owners ...string) (released bool, err error) {
	t, err := c.checkAdmin(ctx, "forceunlock", name)
	if err != nil {
		return false, err
	}
	released, err = c.be.ForceUnlock(ctx, t, owners)
	if err != nil {
		return released, adminError("forceunlock", name, err)
	}
	return released, nil
}

// adminError is the error of the admin call op ("inspect" or
// "forceunlock") on the lock called name.
func adminError(op, name string, err error) error {
	return &LockError{Lock: name, Op: op, Err: err}
}

// adminSides are, per kind of transport.AdminKinds, the side of the lock
// whose release script ends a hold (a read hold if read).
var adminSides = [len(transport.AdminKinds)]func(read bool) *kind{
	func(bool) *kind { return mutexKind },
	func(read bool) *kind {
		if read {
			return readKind
		}
		return writeKind
	},
	func(bool) *kind { return semKind },
	func(bool) *kind { return onceKind },
	func(bool) *kind { return electKind },
}

// adminTarget is every kind of lock called name: what Inspect reads and
// ForceUnlock releases.
type adminTarget = transport.AdminTarget

// checkAdmin checks an Inspect or ForceUnlock call (op, as LockError.Op
// names it) and returns what it is about: the keys of the locks called
// name, and how to release their holds.
func (c *Client) checkAdmin(ctx context.Context, op, name string) (*adminTarget, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, adminError(op, name, err)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, adminError(op, name, ErrClosed)
	}
	return transport.NewAdminTarget(c.prefix, name, func(kind int, size int64, read bool) *transport.Spec {
		s := c.newSpec(name, mutexConfig{lease: DefaultLease}, adminSides[kind](read))
		if size > 0 {
			// As NewSemaphore sets it (sem_release.lua reads the size from
			// its key, not from this).
			s.Size = strconv.FormatInt(size, 10)
		}
		return &s.Spec
	}), nil
}

// pickInfo returns the first kind of lock in infos (one per transport.AdminKinds)
// that has state, with the others that have some in Others; with none, a
// LockInfo of Kind "" for the DistMutex's key.
func pickInfo(infos []LockInfo) LockInfo {
	var found []LockInfo
	for _, info := range infos {
		if len(info.Holders) > 0 || len(info.Waiters) > 0 || info.Fence != 0 || info.Size != 0 || info.Subscribers > 0 {
			found = append(found, info)
		}
	}
	if len(found) == 0 {
		info := infos[0]
		info.Kind = ""
		return info
	}
	info := found[0]
	if len(found) > 1 {
		info.Others = found[1:]
	}
	return info
}

// lockInfo is the LockInfo of rec, kind i of t's locks.
func lockInfo(t *adminTarget, i int, rec *transport.LockRecord) LockInfo {
	info := LockInfo{Name: t.Name, Key: t.Keys[i][0], Kind: transport.AdminKinds[i].Name, Holders: []Holder{}, Waiters: []Waiter{},
		Fence: rec.Fence, Size: rec.Size, Subscribers: rec.Subscribers}
	for _, h := range rec.Holds {
		info.Holders = append(info.Holders, newHolder(h.Field, h.Count, h.Read, h.TTLMs))
	}
	for _, e := range rec.Queue {
		w, flag, ok := parseWaiter(e)
		if !ok {
			continue
		}
		info.Waiters = append(info.Waiters, w)
		if flag == "w" || flag == "W" {
			info.WritersWaiting++
		}
	}
	settle(&info)
	return info
}

// keptPrefix begins the field that keeps a released lock taken for the
// rest of its minimum hold (see transport.KeptPrefix).
const keptPrefix = transport.KeptPrefix

func newHolder(owner string, count int, read bool, ttlMs int64) Holder {
	owner, kept := strings.CutPrefix(owner, keptPrefix)
	host, pid := wire.OwnerOrigin(owner)
	return Holder{Owner: owner, Count: count, Read: read, Kept: kept, TTL: time.Duration(max(ttlMs, -1)) * time.Millisecond, Host: host, PID: pid}
}

// parseWaiter decodes a queue entry (see queue.lua),
// <claim ms>:<flag>:<wait id>.<arrival ms>:<owner>, a semaphore's with the
// permits it asks for after the arrival (<wait id>.<arrival ms>.<permits>,
// see sem.lua), with its flag (a waiting writer's is w or W).
func parseWaiter(entry string) (w Waiter, flag string, ok bool) {
	q, ok := wire.ParseQueued(entry)
	if !ok {
		return Waiter{}, "", false
	}
	w.Owner, w.Read, w.Since, w.Permits = q.Owner, q.Flag == "r" || q.Flag == "R", time.UnixMilli(q.Arrival), q.Permits
	w.Host, w.PID = wire.OwnerOrigin(q.Owner)
	return w, q.Flag, true
}

// settle sums up info's holds (in the order of sortHolds already).
func settle(info *LockInfo) {
	unexpiring := false
	for _, h := range info.Holders {
		if h.Read {
			info.Readers++
		}
		unexpiring = unexpiring || h.TTL < 0
		info.TTL = max(info.TTL, h.TTL)
	}
	if unexpiring {
		info.TTL = -time.Millisecond
	}
}
