package remutex

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/remutex/remutex/internal/wire"
)

// Inspection and forced release: what an operator needs to see who holds a
// lock and to free one whose holder froze. They read and change locks
// through the same keys and scripts as DistMutex, DistRWMutex and
// DistSemaphore, so that users and the remutex command need not know the
// layout.

var inspectScript = loadScript("inspect")

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
	// run: its Holders run it, its Waiters wait for it), or "" when nothing of any
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
	infos, err := c.be.inspect(ctx, t, true)
	if err != nil {
		return LockInfo{Name: name, Key: t.keys[0][0]}, adminError("inspect", name, err)
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
	released, err = c.be.forceUnlock(ctx, t, owners)
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

// adminKind is one kind of lock as Inspect and ForceUnlock see it. Another
// kind of lock is one more entry in adminKinds (and, for a structure
// inspect.lua does not read yet, one more letter there and in readRole).
type adminKind struct {
	name  string                             // LockInfo.Kind
	keys  func(prefix, name string) []string // its keys, in the order of roles
	roles string                             // what inspect.lua reads at each key
	side  func(h Holder) *kind               // the side of the lock whose release script ends h
}

// adminKinds are the kinds of lock, in the order Inspect reports them.
var adminKinds = [...]adminKind{
	{name: "mutex", keys: wire.LockKeys, roles: "hfq", side: func(Holder) *kind { return mutexKind }},
	{name: "rwmutex", keys: wire.RWKeys, roles: "hfqr", side: func(h Holder) *kind {
		if h.Read {
			return readKind
		}
		return writeKind
	}},
	{name: "semaphore", keys: wire.SemKeys, roles: "pfqs", side: func(Holder) *kind { return semKind }},
	// A DistOnce's lock (its runner and waiters; its records are read by
	// Client.InspectOnce).
	{name: "once", keys: wire.OnceLockKeys, roles: "hfq", side: func(Holder) *kind { return onceKind }},
}

// adminRoles is inspect.lua's ARGV[1]: the roles of every kind's keys.
var adminRoles = func() interface{} {
	var b strings.Builder
	for _, k := range adminKinds {
		b.WriteString(k.roles)
	}
	return b.String()
}()

// adminTarget is every kind of lock called name: what Inspect reads and
// ForceUnlock releases.
type adminTarget struct {
	name    string
	keys    [len(adminKinds)][]string // each kind's keys; keys[0][0] is P{name}
	keyArgs []interface{}             // all of them, boxed, for one call of inspect.lua
	// spec is the lock whose release script ends hold h of info, a lock of
	// kind (an index in adminKinds).
	spec func(kind int, info *LockInfo, h Holder) *lockSpec
}

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
	t := &adminTarget{name: name, spec: func(kind int, info *LockInfo, h Holder) *lockSpec {
		s := c.newSpec(name, mutexConfig{lease: DefaultLease}, adminKinds[kind].side(h))
		if info.Size > 0 {
			// As NewSemaphore sets it (sem_release.lua reads the size from
			// its key, not from this).
			s.size = strconv.FormatInt(info.Size, 10)
		}
		return &s
	}}
	for i, k := range adminKinds {
		t.keys[i] = k.keys(c.prefix, name)
		for _, key := range t.keys[i] {
			t.keyArgs = append(t.keyArgs, key)
		}
	}
	return t, nil
}

// homes are the keys of kind i whose channels (<key>:released:<client id>)
// its waiters' Clients listen on: those its holds live in.
func (t *adminTarget) homes(i int) []string {
	var homes []string
	for j, role := range adminKinds[i].roles {
		if role == 'h' || role == 'r' || role == 'p' {
			homes = append(homes, t.keys[i][j])
		}
	}
	return homes
}

// pickInfo returns the first kind of lock in infos (one per adminKinds)
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

func (n *node) inspect(ctx context.Context, t *adminTarget, subscribers bool) ([]LockInfo, error) {
	v, err := n.evalOn(ctx, t.keyArgs, inspectScript, adminRoles)
	if err != nil {
		return nil, err
	}
	infos, err := parseInspect(t, v)
	if err != nil || !subscribers {
		return infos, err
	}
	return infos, n.subscribers(ctx, t, infos)
}

// parseInspect decodes the reply of inspect.lua: one LockInfo per kind of
// lock, in the order of adminKinds.
func parseInspect(t *adminTarget, v interface{}) ([]LockInfo, error) {
	a, ok := v.([]interface{})
	if !ok || len(a) != len(t.keyArgs) {
		return nil, fmt.Errorf("remutex: unexpected inspect reply %v", v)
	}
	infos := make([]LockInfo, len(adminKinds))
	for i, k := range adminKinds {
		info := LockInfo{Name: t.name, Key: t.keys[i][0], Kind: k.name, Holders: []Holder{}, Waiters: []Waiter{}}
		for j := range k.roles {
			readRole(&info, k.roles[j], a[j])
		}
		a = a[len(k.roles):]
		settle(&info)
		infos[i] = info
	}
	return infos, nil
}

// readRole adds to info what inspect.lua read at one key of role r (see
// there).
func readRole(info *LockInfo, r byte, v interface{}) {
	switch r {
	case 'h':
		hp, _ := v.([]interface{})
		if len(hp) != 2 {
			return
		}
		fields, _ := hp[0].([]interface{})
		pttl, _ := hp[1].(int64)
		for i := 0; i+1 < len(fields); i += 2 {
			count, _ := strconv.Atoi(fmt.Sprint(fields[i+1]))
			info.Holders = append(info.Holders, newHolder(fmt.Sprint(fields[i]), count, false, pttl))
		}
	case 'r':
		readers, _ := v.([]interface{})
		for i := 0; i+1 < len(readers); i += 2 {
			ms, _ := readers[i+1].(int64)
			info.Holders = append(info.Holders, newHolder(fmt.Sprint(readers[i]), 1, true, ms))
		}
	case 'p':
		holders, _ := v.([]interface{})
		for i := 0; i+2 < len(holders); i += 3 {
			permits, _ := holders[i+1].(int64)
			ms, _ := holders[i+2].(int64)
			info.Holders = append(info.Holders, newHolder(fmt.Sprint(holders[i]), int(permits), false, ms))
		}
	case 'f':
		if f := fmt.Sprint(v); f != "" {
			info.Fence, _ = strconv.ParseInt(f, 10, 64)
		}
	case 's':
		if f := fmt.Sprint(v); f != "" {
			info.Size, _ = strconv.ParseInt(f, 10, 64)
		}
	case 'q':
		queue, _ := v.([]interface{})
		for _, e := range queue {
			w, flag, ok := parseWaiter(fmt.Sprint(e))
			if !ok {
				continue
			}
			info.Waiters = append(info.Waiters, w)
			if flag == "w" || flag == "W" {
				info.WritersWaiting++
			}
		}
	}
}

func newHolder(owner string, count int, read bool, ttlMs int64) Holder {
	owner, kept := strings.CutPrefix(owner, keptPrefix)
	host, pid := wire.OwnerOrigin(owner)
	return Holder{Owner: owner, Count: count, Read: read, Kept: kept, TTL: time.Duration(max(ttlMs, -1)) * time.Millisecond, Host: host, PID: pid}
}

// keptPrefix begins the field that keeps a released lock taken for the
// rest of its minimum hold (WithMinHold; see release.lua).
const keptPrefix = "kept:"

// field is the hash field of a hold: its owner token, or the kept field.
func (h Holder) field() string {
	if h.Kept {
		return keptPrefix + h.Owner
	}
	return h.Owner
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

// settle orders info's holders and sums up its holds.
func settle(info *LockInfo) {
	slices.SortFunc(info.Holders, func(x, y Holder) int {
		if c := strings.Compare(x.Owner, y.Owner); c != 0 {
			return c
		}
		if x.Read == y.Read {
			return 0
		}
		if x.Read {
			return 1
		}
		return -1
	})
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

// forceUnlock releases each hold that inspect finds, of every kind of lock
// (only those of owners, if any are given), with the release script of its
// kind and side, as its own final unlock would (a semaphore's: a release of
// all its permits).
func (n *node) forceUnlock(ctx context.Context, t *adminTarget, owners []string) (bool, error) {
	infos, err := n.inspect(ctx, t, false)
	if err != nil {
		return false, err
	}
	released := false
	for kind, info := range infos {
		for _, h := range info.Holders {
			if len(owners) > 0 && !slices.Contains(owners, h.Owner) {
				continue
			}
			res, err := n.release(ctx, t.spec(kind, &info, h), h.field(), 0, "0")
			if err != nil {
				return released, err
			}
			released = released || res != releaseNotHeld
		}
	}
	return released, nil
}

// errQuorumAdmin is Inspect and ForceUnlock on a quorum: each server has
// its own view of a lock, which no single LockInfo describes.
var errQuorumAdmin = fmt.Errorf("remutex: %w on a quorum Client (NewQuorumClient): use a NewClient per server", errors.ErrUnsupported)

func (q *quorum) inspect(context.Context, *adminTarget, bool) ([]LockInfo, error) {
	return nil, errQuorumAdmin
}

func (q *quorum) forceUnlock(context.Context, *adminTarget, []string) (bool, error) {
	return false, errQuorumAdmin
}
