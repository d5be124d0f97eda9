package remutex

import (
	"context"
	"time"

	"github.com/remutex/remutex/internal/wire"
)

// Reply codes of the acquire and release scripts (see internal/wire).
const (
	replyLost    = wire.Lost
	replyBusy    = wire.Busy
	replyGranted = wire.Granted
	replyQueued  = wire.Queued
	replyGone    = wire.Gone

	releaseNotHeld = wire.NotHeld
	releaseDone    = wire.Done
	releaseHandoff = wire.Handoff
)

// reply is the result of one acquire call.
type reply struct {
	code  int64
	val   int64 // fence when granted; holder's PTTL in ms when busy or queued
	split bool  // quorum, busy: some servers granted it, too few (contenders split them)
}

// fenceMode says what an acquisition asks of the fence counter.
type fenceMode uint8

const (
	fenceOff   fenceMode = iota
	fenceOn              // a new token per hold; a resend gets the current one
	fenceFresh           // a new token per call (quorum: a field may be a failed try's)
)

var fenceArgs = [...]interface{}{"0", "1", "2"}

func (f fenceMode) arg() interface{} { return fenceArgs[f] }

// acquireReq is one acquire call: the arguments of acquire.lua that vary.
type acquireReq struct {
	owner      interface{}
	have, want int
	lease      interface{} // ms; "0" keeps the TTL (nested, WithoutRenewal)
	fence      fenceMode
	entry      string     // the queue entry argument, if given whole; see entryArg
	place      queuePlace // else what it is built from
	quick      bool       // an attempt's first call: quick_lock.lua may do, if the lock is calm
	try        bool       // a TryLock's: a refused connection answers it at once
}

// queuePlace is where an acquisition stands in the lock's queue: a call
// that may queue it builds its entry from it (see entryString), and an
// uncontended Lock's quick_lock.lua, which needs none, builds nothing.
type queuePlace struct {
	wait    uint64 // the wait id; 0: never queued (TryLock)
	at      int64  // the entry's send time (see entryString)
	arrival int64  // unix ms, on this process's clock
	owner   string
	known   bool   // queued already: a call that finds it gone must not add it again
	prev    string // known: the entry the latest answered call left queued, which this one replaces
	permits int    // a semaphore's request
}

// entryArg is acquire.lua's queue entry argument for r (see enqueue.lua):
// "" never queues (TryLock), "<entry>" queues it if it is not there,
// "+<entry>" and "+<previous entry>|<entry>" once it is known queued:
// the call finds it (or the previous one, which it replaces in place)
// or answers that it is gone.
func (r *acquireReq) entryArg(s *lockSpec) string {
	p := &r.place
	if r.entry != "" || p.wait == 0 {
		return r.entry
	}
	e := entryString(s, p.wait, p.at, p.arrival, p.permits, p.owner)
	switch {
	case !p.known:
		return e
	case p.prev == "" || p.prev == e:
		return "+" + e
	}
	return "+" + p.prev + "|" + e
}

// entryString is the queue entry of a wait (see wire.Entry) of lock s.
func entryString(s *lockSpec, wait uint64, at, arrival int64, permits int, owner string) string {
	return wire.Entry{ClaimMs: s.claimMs, Flag: s.flag, Wait: wait, At: at, Arrival: arrival,
		Permits: permits, WithPermits: s.permits, Owner: owner}.String()
}

// backend is where a Client's locks live: one Redis deployment (node) or a
// quorum of independent ones. DistMutex talks to it alone, and never asks
// which one it has.
type backend interface {
	// acquire runs acquire.lua. A grant that replicas did not acknowledge
	// (WithReplicaAck) has been rolled back and is ErrTooFewReplicas.
	acquire(ctx context.Context, s *lockSpec, r acquireReq) (reply, error)
	// release runs release.lua: releaseNotHeld, releaseDone or releaseHandoff.
	release(ctx context.Context, s *lockSpec, owner interface{}, want int, lease interface{}) (int64, error)
	// leave runs leave.lua for a waiter that gives up.
	leave(ctx context.Context, s *lockSpec, owner interface{}, entry string) error
	// renew renews holds: per item 1 renewed, 0 not ours, -1 failed.
	renew(ctx context.Context, items []renewItem) []int64
	// grants reports whether the queue hands the lock to waiters (a single
	// deployment); a quorum only wakes them.
	grants() bool
	// freshOwners reports whether every try needs an owner token of its own
	// (a quorum gives back late grants in the background).
	freshOwners() bool
	// acked reports whether grants must be confirmed by an acknowledged call.
	acked() bool
	// exact reports whether what it keeps is one deployment's, exact. A
	// quorum's is a majority's, which can neither bound a count nor keep a
	// record: the kinds that need that refuse it (kind.oneDeployment).
	exact() bool
	// script runs sc on s's keys, and get reads keys (a GET each) in one
	// round trip: a value, or false for a missing key; a reply error as
	// it came. Only an exact backend serves them.
	script(ctx context.Context, s *lockSpec, sc *luaScript, args ...interface{}) (interface{}, error)
	get(ctx context.Context, keys ...interface{}) ([]interface{}, error)
	// inspect and forceUnlock serve Client.Inspect and Client.ForceUnlock.
	inspect(ctx context.Context, t *adminTarget, subscribers bool) ([]LockInfo, error)
	forceUnlock(ctx context.Context, t *adminTarget, owners []string) (bool, error)
	// check serves Client.Check (only: just the servers, for Client.Servers).
	check(ctx context.Context, c *Client, only bool) *checkReport
	// close stops it; calls still out at deadline are ended (see
	// batcher.close).
	close(deadline time.Time)
	// refusal is closed at the next refused dial (nil: not watched), and
	// refused is the latest one's error (see dialWatch).
	refusal() <-chan struct{}
	refused() error
	subscriptions
}

// subscriptions are the waiters' interest in a lock's channel.
type subscriptions interface {
	// watch registers interest in channel; without create only where a
	// subscription exists already. It reports whether it registered.
	watch(channel string, create bool) bool
	unwatch(channel string)
	// ready is closed once messages on channel are delivered.
	ready(channel string) <-chan struct{}
	// polling reports that SUBSCRIBE was denied: waiters poll.
	polling() bool
}

// parseReply decodes the reply of an acquire script (see
// wire.ParseAcquire).
func parseReply(v interface{}) (reply, error) {
	code, val, err := wire.ParseAcquire(v)
	return reply{code: code, val: val}, err
}

// rollback releases a hold nobody will use (a lost hold's field that may be
// left on the server, a leftover in the way of a new acquisition), best
// effort and briefly, within ctx: its lease ends it otherwise. keep is the
// final release's lease argument: how long the key stays taken by nobody
// (WithMinHold, see releaseArg), "0" none.
func rollback(ctx context.Context, b backend, s *lockSpec, owner, keep interface{}) error {
	ctx, cancel := context.WithTimeout(ctx, rollbackTimeout)
	defer cancel()
	_, err := b.release(ctx, s, owner, 0, keep)
	return err
}

// postRelease posts the release of what a call may have granted owner that
// nobody will use: a call cut off by its caller's context, a grant that came
// too late, an acquisition that too few replicas acknowledged, a quorum's
// failed try. It returns at once; the release follows that call to Redis
// (see postCtx) within the lease, past which the grant has ended anyway.
// keep is as for rollback: a hold that was used keeps its minimum hold
// however its release reaches Redis; a grant nobody used has none.
func postRelease(ctx context.Context, b backend, s *lockSpec, owner, keep interface{}) {
	_, _ = b.release(postCtx(ctx, s.lease), s, owner, 0, keep)
}
