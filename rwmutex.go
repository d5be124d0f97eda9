package remutex

import (
	"context"
	"sync"
)

// DistRWMutex is a reader/writer lock shared by every process that uses the
// same name on the same Redis: any number of goroutines anywhere may hold it
// for reading at once, or one for writing. Create it with
// Client.NewRWMutex; it must not be copied after first use. A DistRWMutex and
// a DistMutex of the same name are independent locks.
//
// Like sync.RWMutex it prefers writers: once a writer waits (in any Client),
// an RLock of a goroutine that holds no read lock waits until that writer has
// held the lock and released it, and TryRLock says false. Writers, and the
// readers behind them, are served in arrival order from a queue in Redis;
// the readers that queued behind a writer all enter together when it leaves.
// Waiters are woken by a message, never by polling.
//
// Holds belong to goroutines, as with DistMutex. A goroutine that holds the
// read lock may RLock again (it only counts, and never waits behind a writer,
// unlike sync.RWMutex, where that can deadlock). A goroutine that holds the
// write lock may Lock again (it counts) and RLock (it counts as a read hold
// too); when it Unlocks its last write hold while it still holds reads, it
// keeps a read hold (the lock is downgraded atomically) and the readers that
// waited enter. A goroutine that holds only a read lock and asks for the
// write lock would wait for itself: Lock panics with ErrUpgrade,
// LockContext and TryLockContext return it, TryLock says false. With
// NonReentrant, holds belong to the DistRWMutex value, exactly as with
// sync.RWMutex: any goroutine may Unlock or RUnlock, a nested RLock takes
// another read hold, and an upgrade waits forever.
//
// Every hold, read or write, has a lease that the Client's watchdog renews in
// its batched round trips; a reader whose process dies stops blocking
// writers within its lease. Lost and Fence describe the calling goroutine's
// hold (its write hold if it has one). The keys are P{name}:rw,
// P{name}:rw:readers (holder → deadline), P{name}:rw:fence, P{name}:rw:waiting
// for the Client's prefix P: one cluster slot.
type DistRWMutex struct {
	_    noCopy
	w, r DistMutex // the write and read sides, each a lock of the protocol
}

// NewRWMutex returns the read/write lock called name, configured by the same
// options as NewMutex, with the same defaults; it panics where NewMutex
// would. It sends no command.
func (c *Client) NewRWMutex(name string, opts ...MutexOption) *DistRWMutex {
	cfg := c.configure("NewRWMutex", name, opts)
	rw := &DistRWMutex{}
	rw.w.init(c, name, cfg, writeKind)
	rw.r.init(c, name, cfg, readKind)
	rw.w.pair, rw.r.pair = &rw.r, &rw.w
	return rw
}

// Lock locks rw for writing, waiting until no other goroutine anywhere holds
// it; see DistMutex.Lock for errors and panics, and DistRWMutex for
// ErrUpgrade.
func (rw *DistRWMutex) Lock() { rw.w.Lock() }

// Unlock releases a write hold, like DistMutex.Unlock; without one it panics
// with "remutex: Unlock of unlocked DistRWMutex".
func (rw *DistRWMutex) Unlock() { rw.w.Unlock() }

// TryLock tries once to lock rw for writing, like DistMutex.TryLock. It also
// says false while a writer waits, and for a goroutine that holds only a read
// lock.
func (rw *DistRWMutex) TryLock() bool { return rw.w.TryLock() }

// LockContext locks rw for writing like Lock, but gives up when ctx is done,
// as DistMutex.LockContext does; it returns ErrUpgrade (wrapped) at once to
// a goroutine that holds only a read lock.
func (rw *DistRWMutex) LockContext(ctx context.Context) error { return rw.w.LockContext(ctx) }

// TryLockContext is TryLock governed by ctx, like DistMutex.TryLockContext;
// it returns ErrUpgrade (wrapped) to a goroutine that holds only a read lock.
func (rw *DistRWMutex) TryLockContext(ctx context.Context) (bool, error) {
	return rw.w.TryLockContext(ctx)
}

// UnlockContext releases a write hold like Unlock, returning errors as
// DistMutex.UnlockContext does.
func (rw *DistRWMutex) UnlockContext(ctx context.Context) error { return rw.w.UnlockContext(ctx) }

// RLock locks rw for reading: at once while no writer holds it or waits for
// it, else after the writers ahead. A goroutine that holds a read or write
// hold only counts (one round trip, never waiting). Errors and panics are
// those of DistMutex.Lock.
func (rw *DistRWMutex) RLock() { rw.r.Lock() }

// RUnlock releases a read hold (the final one of the goroutine ends it, and
// the last reader's lets a waiting writer in); without one it panics with
// "remutex: RUnlock of unlocked DistRWMutex". Errors are handled as by
// DistMutex.Unlock.
func (rw *DistRWMutex) RUnlock() { rw.r.Unlock() }

// TryRLock tries once to lock rw for reading, like DistMutex.TryLock: false
// while a writer holds it or waits for it.
func (rw *DistRWMutex) TryRLock() bool { return rw.r.TryLock() }

// RLockContext locks rw for reading like RLock, but gives up when ctx is
// done, as DistMutex.LockContext does.
func (rw *DistRWMutex) RLockContext(ctx context.Context) error { return rw.r.LockContext(ctx) }

// TryRLockContext is TryRLock governed by ctx, like
// DistMutex.TryLockContext.
func (rw *DistRWMutex) TryRLockContext(ctx context.Context) (bool, error) {
	return rw.r.TryLockContext(ctx)
}

// RUnlockContext releases a read hold like RUnlock, returning errors as
// DistMutex.UnlockContext does.
func (rw *DistRWMutex) RUnlockContext(ctx context.Context) error { return rw.r.UnlockContext(ctx) }

// RLocker returns a sync.Locker whose Lock and Unlock call rw.RLock and
// rw.RUnlock, like sync.RWMutex.RLocker.
func (rw *DistRWMutex) RLocker() sync.Locker { return (*rlocker)(rw) }

type rlocker DistRWMutex

func (r *rlocker) Lock()   { (*DistRWMutex)(r).RLock() }
func (r *rlocker) Unlock() { (*DistRWMutex)(r).RUnlock() }

// Name returns the lock's name.
func (rw *DistRWMutex) Name() string { return rw.w.Name() }

// Lost returns a channel that is closed when the calling goroutine's hold of
// rw (its write hold if it has one, else its read hold; NonReentrant: the
// value's write hold, else its latest read hold) is lost. It is already
// closed if the goroutine holds nothing.
func (rw *DistRWMutex) Lost() <-chan struct{} {
	return rw.w.client().lostOf(rw.holdLocked)
}

// Fence returns the fencing token of the calling goroutine's hold under
// WithFencing: a write hold's own token; for a read hold, the token of the
// latest write before it was taken, so that readers can tell which write
// generation they read. 0 without WithFencing or without a hold.
func (rw *DistRWMutex) Fence() int64 {
	// A lost hold keeps its token, as DistMutex.Fence says.
	gid := rw.w.gid()
	return rw.w.client().fenceOf(rw.holdLocked,
		func() *hold { return rw.w.holdLocked(gid) }, func() *hold { return rw.r.holdLocked(gid) })
}

func (rw *DistRWMutex) holdLocked() *hold {
	gid := rw.w.gid()
	if h := rw.w.liveLocked(gid); h != nil {
		return h
	}
	return rw.r.liveLocked(gid)
}

// upgradeLocked reports a write lock asked for by goroutine gid, which holds
// only a read lock of the same DistRWMutex (reentrant): it would wait for
// itself.
func (m *DistMutex) upgradeLocked(gid int64) bool {
	return m.pair != nil && !m.spec.read && m.reentrant && m.pair.liveLocked(gid) != nil
}

// pinnedOwnerLocked gives a read attempt of a goroutine that holds the write
// lock (reentrant) an owner token of its own that names the write hold's:
// <write token>/r<n>. The scripts let a reader whose token names a writer
// of the lock read under that write hold. It reports whether it did.
func (m *DistMutex) pinnedOwnerLocked(a *attempt, gid int64) bool {
	if m.pair == nil || !m.spec.read || !m.reentrant {
		return false
	}
	h := m.pair.liveLocked(gid)
	if h == nil {
		return false
	}
	a.pin, a.pinned = ownerString(h.owner), true
	a.owner = a.freshOwnerLocked()
	return true
}
