package remutex

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Inspection and forced release: what an operator needs to see who holds a
// lock and to free one whose holder froze. They read and change a lock
// through the same keys and scripts as DistMutex, so that users and the
// remutex command need not know the layout.

var inspectScript = loadScript("inspect")

// LockInfo is the state of one lock, as Inspect read it.
type LockInfo struct {
	Name string // the lock's name
	Key  string // its hash key, P{Name}; its other keys and channels begin with it

	// Holders are the owners of the lock, sorted by owner token: one while
	// it is held, none while it is free (more only where something outside
	// remutex wrote the hash).
	Holders []Holder
	// TTL is the remaining lease: 0 when the lock is free, negative if its
	// hash has no expiry (which remutex never leaves).
	TTL time.Duration
	// Fence is the last fencing token handed out (the counter P{Name}:fence),
	// 0 if the lock was never taken WithFencing.
	Fence int64
	// Waiters are the live entries of the lock's queue in Redis, in arrival
	// order; entries whose waiters stopped refreshing them are left out.
	Waiters []Waiter
	// Subscribers is the number of Clients listening for the lock's
	// messages: those waiting for it, and for a fraction of a second those
	// that waited last.
	Subscribers int
}

// Holder is one owner of a lock.
type Holder struct {
	Owner string // owner token: <client id>:<goroutine id> (see Event.Owner)
	Count int    // hold count
	Host  string // host of the holder's Client; "" if its id does not say
	PID   int    // process id of the holder's Client; 0 if its id does not say
}

// Waiter is one entry of a lock's queue.
type Waiter struct {
	Owner string    // the owner token it is to hold the lock under
	Host  string    // host of the waiter's Client; "" if its id does not say
	PID   int       // process id of the waiter's Client; 0 if its id does not say
	Since time.Time // when it joined the queue, by the Redis server's clock
}

// CheckName reports why NewMutex would refuse name: nil for a valid lock
// name, else an error that matches ErrInvalidName and says why.
func CheckName(name string) error {
	if err := checkName(name); err != nil {
		return &nameError{reason: err}
	}
	return nil
}

// Inspect returns the state of the lock called name under c's key prefix
// (any lock's, also one c never used), read in one script call, plus the
// PUBSUB calls that count Subscribers; it changes nothing.
//
// For a name NewMutex would refuse it returns an error matching
// ErrInvalidName and sends no command. For a key of another type under the
// name, or a fence counter that is not an integer, it returns a
// *WrongTypeError. Otherwise it fails with ctx's error, ErrClosed after
// Close, or the Redis error; errors are wrapped with the lock's name. When
// Redis refused or failed the call, the LockInfo holds Name and Key. On a
// Client made by NewQuorumClient it returns an error matching
// errors.ErrUnsupported: inspect each server through a NewClient of its own.
func (c *Client) Inspect(ctx context.Context, name string) (LockInfo, error) {
	s, err := c.adminSpec(ctx, name)
	if err != nil {
		return LockInfo{}, err
	}
	info, err := c.be.inspect(ctx, s, true)
	if err != nil {
		return LockInfo{Name: name, Key: s.hash()}, lockError(name, err)
	}
	return info, nil
}

// ForceUnlock releases the lock called name under c's key prefix, whoever
// holds it, through the release script of an Unlock: the lock's longest
// waiter is woken, or handed the lock, by a message, exactly as after an
// Unlock. Given owners (owner tokens, as Inspect reports them), it releases
// only their holds, so that a lock that changed hands since it was inspected
// stays with its new holder. It reports whether it released a hold: false
// with a nil error means nobody (or none of owners) held the lock.
//
// The holder is not told: its watchdog finds the hold gone at the next
// renewal, then its Lost channel closes and its Unlock reports ErrLockLost.
// Until then it may still be working, so use ForceUnlock for a holder that is
// frozen rather than dead (a dead holder's lock ends by itself within its
// lease), and fencing where a holder that resumes must not write. The fence
// counter is kept, so tokens keep rising.
//
// Its errors are Inspect's; after an error some of the holds may have been
// released. On a Client made by NewQuorumClient it returns an error matching
// errors.ErrUnsupported: release the lock through a NewClient per server.
func (c *Client) ForceUnlock(ctx context.Context, name string, owners ...string) (released bool, err error) {
	s, err := c.adminSpec(ctx, name)
	if err != nil {
		return false, err
	}
	released, err = c.be.forceUnlock(ctx, s, owners)
	if err != nil {
		return released, lockError(name, err)
	}
	return released, nil
}

// adminSpec checks an Inspect or ForceUnlock call and returns the keys and
// script arguments of lock name.
func (c *Client) adminSpec(ctx context.Context, name string) (*lockSpec, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, lockError(name, err)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, lockError(name, ErrClosed)
	}
	s := c.newSpec(name, mutexConfig{lease: DefaultLease}, kindMutex)
	return &s, nil
}

func (n *node) inspect(ctx context.Context, s *lockSpec, subscribers bool) (LockInfo, error) {
	v, err := n.eval(ctx, s, inspectScript)
	if err != nil {
		return LockInfo{}, err
	}
	info, err := parseInspect(s, v)
	if err != nil || !subscribers {
		return info, err
	}
	info.Subscribers, err = n.subscribers(ctx, s)
	return info, err
}

// parseInspect decodes the reply of inspect.lua.
func parseInspect(s *lockSpec, v interface{}) (LockInfo, error) {
	info := LockInfo{Name: s.name, Key: s.hash(), Holders: []Holder{}, Waiters: []Waiter{}}
	a, ok := v.([]interface{})
	if !ok || len(a) != 4 {
		return info, fmt.Errorf("remutex: unexpected inspect reply %v", v)
	}
	fields, _ := a[0].([]interface{})
	for i := 0; i+1 < len(fields); i += 2 {
		owner := fmt.Sprint(fields[i])
		count, _ := strconv.Atoi(fmt.Sprint(fields[i+1]))
		host, pid := ownerOrigin(owner)
		info.Holders = append(info.Holders, Holder{Owner: owner, Count: count, Host: host, PID: pid})
	}
	slices.SortFunc(info.Holders, func(x, y Holder) int { return strings.Compare(x.Owner, y.Owner) })
	if len(info.Holders) > 0 {
		pttl, _ := a[1].(int64)
		info.TTL = time.Duration(max(pttl, -1)) * time.Millisecond
	}
	if f := fmt.Sprint(a[2]); f != "" {
		info.Fence, _ = strconv.ParseInt(f, 10, 64)
	}
	queue, _ := a[3].([]interface{})
	for i := 0; i+1 < len(queue); i += 2 {
		// Entry: <claim ms>:<fencing>:<wait id>:<owner> (see queue.lua).
		parts := strings.SplitN(fmt.Sprint(queue[i]), ":", 4)
		if len(parts) != 4 {
			continue
		}
		arrived, _ := strconv.ParseFloat(fmt.Sprint(queue[i+1]), 64)
		host, pid := ownerOrigin(parts[3])
		info.Waiters = append(info.Waiters, Waiter{Owner: parts[3], Host: host, PID: pid, Since: time.UnixMicro(int64(arrived))})
	}
	return info, nil
}

// ownerOrigin returns the host and pid in the Client id of an owner token
// (<32 hex>.<host>.<pid>:<goroutine>, see clientID), or "" and 0.
func ownerOrigin(owner string) (host string, pid int) {
	id, _, _ := strings.Cut(owner, ":")
	first, last := strings.IndexByte(id, '.'), strings.LastIndexByte(id, '.')
	if first < 0 || last <= first {
		return "", 0
	}
	pid, err := strconv.Atoi(id[last+1:])
	if err != nil {
		return "", 0
	}
	return id[first+1 : last], pid
}

// subscribers counts the Clients subscribed to the lock's channels
// (P{N}:released:<client id>, one per Client). On a Redis 7 cluster they are
// shard channels of the master serving the lock's slot; with classic pub/sub
// on a cluster a Client's connection may be on any node, so all are asked.
func (n *node) subscribers(ctx context.Context, s *lockSpec) (int, error) {
	pattern := globEscape(s.hash()+releasedInfix) + "*"
	cc, ok := n.rdb.(*redis.ClusterClient)
	if !ok {
		return countSubscribers(ctx, n.rdb, pattern, false)
	}
	if n.sharded(ctx) {
		master, err := cc.MasterForKey(ctx, s.hash())
		if err != nil {
			return 0, err
		}
		return countSubscribers(ctx, master, pattern, true)
	}
	var total atomic.Int64
	err := cc.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
		k, err := countSubscribers(ctx, shard, pattern, false)
		total.Add(int64(k))
		return err
	})
	return int(total.Load()), err
}

// countSubscribers adds up the subscribers of the channels that match
// pattern on one server (or, for a *redis.Client of a single deployment, on
// its server).
func countSubscribers(ctx context.Context, r redis.Cmdable, pattern string, sharded bool) (int, error) {
	var chans []string
	var err error
	if sharded {
		chans, err = r.PubSubShardChannels(ctx, pattern).Result()
	} else {
		chans, err = r.PubSubChannels(ctx, pattern).Result()
	}
	if err != nil || len(chans) == 0 {
		return 0, err
	}
	var subs map[string]int64
	if sharded {
		subs, err = r.PubSubShardNumSub(ctx, chans...).Result()
	} else {
		subs, err = r.PubSubNumSub(ctx, chans...).Result()
	}
	total := 0
	for _, k := range subs {
		total += int(k)
	}
	return total, err
}

// globEscape quotes the characters that Redis glob patterns treat
// specially, so that s matches itself only.
func globEscape(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// forceUnlock releases, with release.lua, each holder of the lock that
// inspect finds (only those in owners, if any are given).
func (n *node) forceUnlock(ctx context.Context, s *lockSpec, owners []string) (bool, error) {
	info, err := n.inspect(ctx, s, false)
	if err != nil {
		return false, err
	}
	released := false
	for _, h := range info.Holders {
		if len(owners) > 0 && !slices.Contains(owners, h.Owner) {
			continue
		}
		res, err := n.release(ctx, s, h.Owner, 0, "0")
		if err != nil {
			return released, err
		}
		released = released || res != releaseNotHeld
	}
	return released, nil
}

// errQuorumAdmin is Inspect and ForceUnlock on a quorum: each server has
// its own view of a lock, which no single LockInfo describes.
var errQuorumAdmin = fmt.Errorf("remutex: %w on a quorum Client (NewQuorumClient): use a NewClient per server", errors.ErrUnsupported)

func (q *quorum) inspect(context.Context, *lockSpec, bool) (LockInfo, error) {
	return LockInfo{}, errQuorumAdmin
}

func (q *quorum) forceUnlock(context.Context, *lockSpec, []string) (bool, error) {
	return false, errQuorumAdmin
}
