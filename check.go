package remutex

import (
	"context"
	"errors"
	"strings"

	"github.com/remutex/remutex/internal/transport"
)

// ErrEvictionPolicy reports a Redis server whose maxmemory-policy may evict
// lock keys (allkeys-* evicts any key, volatile-* any key with an expiry,
// which every lock key has): a lock evicted between two renewals lets a
// second holder in before the first learns of it. Set maxmemory-policy
// noeviction on servers that hold locks (Redis then refuses writes at
// maxmemory, which Lock reports as OOM). Client.Check returns it wrapped,
// with the server and its policy.
var ErrEvictionPolicy = transport.ErrEvictionPolicy

// ErrDegraded matches the error of Client.Check when everything it found
// wrong leaves the locks working, in a lesser way: today, a user that may
// not SUBSCRIBE to (or PUBLISH on) the locks' channels, whose waiters poll
// instead of hearing releases (slower hand-offs, more calls; see
// docs/guarantees.md). The error wraps what is missing. When Check also
// found something that breaks the locks, its error does not match
// ErrDegraded.
var ErrDegraded = transport.ErrDegraded

// ServerInfo is a Redis server of a Client, as Servers found it.
type ServerInfo struct {
	Addr string // its address, as the redis client dials it
	// Name is "Redis", "Valkey", or another server's name as it gives it;
	// "" if the server did not tell (neither HELLO nor INFO answered).
	Name string
	// Version is the server's own version, e.g. "7.4.1" (a Valkey's, not
	// the Redis version it is compatible with); "" if it did not tell.
	Version string
}

// String reads "Valkey 8.0.1 at 127.0.0.1:6379".
func (s ServerInfo) String() string {
	name := strings.TrimSpace(s.Name + " " + s.Version)
	if name == "" {
		name = "a server of unknown version"
	}
	return name + " at " + s.Addr
}

// Check checks, before the first lock, what would otherwise surface at a
// running service's first Lock: that every Redis server of c answers and
// speaks the Redis protocol, and that the redis client is authenticated;
// that each server is one remutex supports (Redis 6.2 or later, Valkey 7.2
// or later: see Servers for what it found); that it loads the lock scripts
// (SCRIPT LOAD, where the user may run it: else the scripts are sent in
// full on first use, as always); that the redis client's user may run
// every command the locks use, on keys and channels under c's key prefix (a
// script that runs each of them once, on keys it removes again, and a
// SUBSCRIBE: see docs/deployments.md for the ACL a lock user needs); and
// that no server's maxmemory-policy may evict lock keys, where the user may
// read it (CONFIG GET; managed services often refuse it, which Check does
// not count as a problem).
//
// It returns nil when the locks will work as documented. Otherwise its
// error joins the problems found (errors.Join), each naming its server or
// what the user lacks, and says which kind it found:
//   - the locks will not work, or not safely: an unreachable server,
//     ErrAuthRequired, a server that is not Redis or is older than the oldest
//     supported, a command the lock scripts run or a key under the prefix
//     the user may not use (the error names it), ErrEvictionPolicy;
//   - the locks work, degraded: the error matches ErrDegraded (and only
//     then), e.g. a user without channel access, whose waiters poll.
//
// A service that should start whenever its locks work tests for it:
//
//	if err := locks.Check(ctx); errors.Is(err, remutex.ErrDegraded) {
//		log.Print(err) // works: e.g. waiters poll
//	} else if err != nil {
//		log.Fatal(err)
//	}
//
// Check returns within about 50 ms of ctx's end, whatever the go-redis
// options and whatever Redis does, with ctx's error wrapped with the server
// that did not answer; what it was sending then goes on in the background
// (Close waits for that call, bounded by the redis client's timeouts). It
// returns ErrClosed after Close. On a Cluster it asks every master, and
// runs the permission script on one of them; on a quorum Client it checks
// every server (a quorum works with a minority of them down: Check reports
// them all). It changes nothing but its own keys, and sends nothing to a
// lock.
func (c *Client) Check(ctx context.Context) error {
	if c.isClosed() {
		return ErrClosed
	}
	return c.be.Check(ctx, c.prefix, c.id, false).Err()
}

// Servers returns the Redis servers of c, with their names and versions:
// one for a Client on one server (or a failover client), one per master of
// a Cluster, each server of a quorum Client, in that order.
// It asks each with HELLO, which every user may run (INFO server where
// HELLO is refused). Like Check, it returns within about 50 ms of ctx's end
// (with ctx's error), ErrClosed after Close, and the servers it could not
// ask as errors naming them (the ServerInfo of those has only Addr).
func (c *Client) Servers(ctx context.Context) ([]ServerInfo, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	r := c.be.Check(ctx, c.prefix, c.id, true)
	var servers []ServerInfo
	for _, s := range r.Servers {
		servers = append(servers, ServerInfo(s))
	}
	return servers, errors.Join(r.Broken...)
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
