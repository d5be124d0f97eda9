package transport

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/remutex/remutex/internal/wire"
)

// Spec is what the scripts need of one lock (a DistMutex, or one side of a
// DistRWMutex), boxed once by the engine: its keys, its scripts, the boxed
// arguments its calls carry, and its uncontended cycle.
type Spec struct {
	Name    string        // the lock's name, for messages
	Scripts Scripts       // its kind's scripts
	Keys    []string      // hash, fence, queue (DistRWMutex: and readers), then its kind's own
	KeyArgs []interface{} // Keys, boxed
	Home    string        // the key its holds live in
	Lease   time.Duration // its lease: how long a call that undoes another may still be sent (see postCtx)
	ClaimMs string        // a queue grant's lease in ms, as its queue entries carry it
	Flag    string        // the flag of its queue entries (see wire.Entry)
	Permits bool          // its calls carry a size and its entries a request (a DistSemaphore)
	Records bool          // its final release writes a record (DistOnce): acknowledged as a grant is
	Size    interface{}   // a DistSemaphore's size (its scripts' argument); nil for a lock
	// Sized is set once a DistSemaphore's size was found to agree with
	// Redis's (see quick_sem.lua); nil for a lock.
	Sized *atomic.Bool
	Quick *Quick // the uncontended cycle; nil for a DistRWMutex's write side
}

// Reply is the result of one acquire call.
type Reply struct {
	Code  int64
	Val   int64 // fence when granted; holder's PTTL in ms when busy or queued
	Split bool  // quorum, busy: some servers granted it, too few (contenders split them)
}

// FenceMode says what an acquisition asks of the fence counter.
type FenceMode uint8

// The fence modes.
const (
	FenceOff   FenceMode = iota
	FenceOn              // a new token per hold; a resend gets the current one
	FenceFresh           // a new token per call (quorum: a field may be a failed try's)
)

var fenceArgs = [...]interface{}{"0", "1", "2"}

func (f FenceMode) arg() interface{} { return fenceArgs[f] }

// AcquireReq is one acquire call: the arguments of acquire.lua that vary.
type AcquireReq struct {
	Owner      interface{}
	Have, Want int
	Lease      interface{} // ms; "0" keeps the TTL (nested, WithoutRenewal)
	Fence      FenceMode
	Entry      string     // the queue entry argument, if given whole; see entryArg
	Place      QueuePlace // else what it is built from
	Quick      bool       // an attempt's first call: quick_lock.lua may do, if the lock is calm
	Try        bool       // a TryLock's: a refused connection answers it at once
}

// QueuePlace is where an acquisition stands in the lock's queue: a call
// that may queue it builds its entry from it (see EntryString), and an
// uncontended Lock's quick_lock.lua, which needs none, builds nothing.
type QueuePlace struct {
	Wait    uint64 // the wait id; 0: never queued (TryLock)
	At      int64  // the entry's send time (see EntryString)
	Arrival int64  // unix ms, on this process's clock
	Owner   string
	Known   bool   // queued already: a call that finds it gone must not add it again
	Prev    string // known: the entry the latest answered call left queued, which this one replaces
	Permits int    // a semaphore's request
}

// entryArg is acquire.lua's queue entry argument for r (see enqueue.lua):
// "" never queues (TryLock), "<entry>" queues it if it is not there,
// "+<entry>" and "+<previous entry>|<entry>" once it is known queued:
// the call finds it (or the previous one, which it replaces in place)
// or answers that it is gone.
func (r *AcquireReq) entryArg(s *Spec) string {
	p := &r.Place
	if r.Entry != "" || p.Wait == 0 {
		return r.Entry
	}
	e := EntryString(s, p.Wait, p.At, p.Arrival, p.Permits, p.Owner)
	switch {
	case !p.Known:
		return e
	case p.Prev == "" || p.Prev == e:
		return "+" + e
	}
	return "+" + p.Prev + "|" + e
}

// EntryString is the queue entry of a wait (see wire.Entry) of lock s.
func EntryString(s *Spec, wait uint64, at, arrival int64, permits int, owner string) string {
	return wire.Entry{ClaimMs: s.ClaimMs, Flag: s.Flag, Wait: wait, At: at, Arrival: arrival,
		Permits: permits, WithPermits: s.Permits, Owner: owner}.String()
}

// Backend is where a Client's locks live: one Redis deployment (NewNode)
// or a quorum of independent ones (NewQuorum). The engine talks to it
// alone, and never asks which one it has.
type Backend interface {
	// Acquire runs acquire.lua. A grant that replicas did not acknowledge
	// (WithReplicaAck) has been rolled back and is ErrTooFewReplicas.
	Acquire(ctx context.Context, s *Spec, r AcquireReq) (Reply, error)
	// Release runs release.lua (or its uncontended or contended pipeline,
	// see quick.go): wire.NotHeld, wire.Done or wire.Handoff.
	Release(ctx context.Context, s *Spec, owner interface{}, want int, lease interface{}) (int64, error)
	// Leave runs leave.lua for a waiter that gives up.
	Leave(ctx context.Context, s *Spec, owner interface{}, entry string) error
	// Renew renews holds: per item 1 renewed, 0 not ours, -1 failed.
	Renew(ctx context.Context, items []RenewItem) []int64
	// Grants reports whether the queue hands the lock to waiters (a single
	// deployment); a quorum only wakes them.
	Grants() bool
	// FreshOwners reports whether every try needs an owner token of its own
	// (a quorum gives back late grants in the background).
	FreshOwners() bool
	// Acked reports whether grants must be confirmed by an acknowledged call.
	Acked() bool
	// Exact reports whether what it keeps is one deployment's, exact. A
	// quorum's is a majority's, which can neither bound a count nor keep a
	// record: the kinds that need that refuse it.
	Exact() bool
	// Script runs sc on s's keys, and Get reads keys (a GET each) in one
	// round trip: a value, or false for a missing key; a reply error as
	// it came. Only an exact backend serves them.
	Script(ctx context.Context, s *Spec, sc *Script, args ...interface{}) (interface{}, error)
	Get(ctx context.Context, keys ...interface{}) ([]interface{}, error)
	// Inspect returns one record per kind of lock of t (see AdminKinds),
	// and ForceUnlock releases their holds (of owners only, if given).
	Inspect(ctx context.Context, t *AdminTarget, subscribers bool) ([]LockRecord, error)
	ForceUnlock(ctx context.Context, t *AdminTarget, owners []string) (bool, error)
	// Check serves Client.Check (only: just the servers, for Client.Servers)
	// for a Client of id, whose keys and channels begin with prefix.
	Check(ctx context.Context, prefix, id string, only bool) *CheckReport
	// Close stops it; calls still out at deadline are ended (see
	// batcher.close).
	Close(deadline time.Time)
	// Refusal is closed at the next refused dial (nil: not watched), and
	// Refused is the latest one's error (see dialWatch).
	Refusal() <-chan struct{}
	Refused() error
	Subscriptions
}

// Subscriptions are the waiters' interest in a lock's channel.
type Subscriptions interface {
	// Watch registers interest in channel; without create only where a
	// subscription exists already. It reports whether it registered.
	Watch(channel string, create bool) bool
	Unwatch(channel string)
	// Ready is closed once messages on channel are delivered.
	Ready(channel string) <-chan struct{}
	// Polling reports that SUBSCRIBE was denied: waiters poll.
	Polling() bool
}

// ParseReply decodes the reply of an acquire script (see
// wire.ParseAcquire).
func ParseReply(v interface{}) (Reply, error) {
	code, val, err := wire.ParseAcquire(v)
	return Reply{Code: code, Val: val}, err
}

// PostRelease posts the release of what a call may have granted owner that
// nobody will use: a call cut off by its caller's context, a grant that came
// too late, an acquisition that too few replicas acknowledged, a quorum's
// failed try. It returns at once; the release follows that call to Redis
// (see PostCtx) within the lease, past which the grant has ended anyway.
// keep is the final release's lease argument: a hold that was used keeps
// its minimum hold however its release reaches Redis; a grant nobody used
// has none ("0").
func PostRelease(ctx context.Context, b Backend, s *Spec, owner, keep interface{}) {
	_, _ = b.Release(PostCtx(ctx, s.Lease), s, owner, 0, keep)
}
