package remutex

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrEvictionPolicy reports a Redis server whose maxmemory-policy may evict
// lock keys (allkeys-* evicts any key, volatile-* any key with an expiry,
// which every lock key has): a lock evicted between two renewals lets a
// second holder in before the first learns of it. Set maxmemory-policy
// noeviction on servers that hold locks (Redis then refuses writes at
// maxmemory, which Lock reports as OOM). Client.Check returns it wrapped,
// with the server and its policy.
var ErrEvictionPolicy = errors.New("remutex: maxmemory-policy may evict lock keys")

var checkScript = loadScript("check")

// Check checks, before the first lock, what would otherwise surface at a
// running service's first Lock: that every Redis server of c answers and
// speaks the Redis protocol, and that the redis client is authenticated;
// that it loads the lock scripts (SCRIPT LOAD, where the user may run it:
// else the scripts are sent in full on first use, as always); that the
// redis client's user may run every command the locks use, on keys and
// channels under c's key prefix (a script that runs each of them once, on
// keys it removes again, and a SUBSCRIBE: see docs/deployments.md for the
// ACL a lock user needs); and that no server's maxmemory-policy may evict
// lock keys, where the user may read it (CONFIG GET; managed services often
// refuse it, which Check does not count as a problem).
//
// It returns nil, or the problems found joined with errors.Join, each
// naming its server: an unreachable server, ErrAuthRequired, a server that
// is not Redis, a command, key or channel the user may not use (the error
// names it), ErrEvictionPolicy. On a Cluster it asks every master, and runs
// the permission script on one of them. On a quorum Client it checks every
// server: a quorum works with a minority of them down, Check reports them
// all. It changes nothing but its own keys, and sends nothing to a lock.
func (c *Client) Check(ctx context.Context) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return c.be.check(ctx, c)
}

// check checks one deployment: see Client.Check.
func (n *node) check(ctx context.Context, c *Client) error {
	var errs []error
	for _, srv := range n.servers(ctx) {
		if err := srv.err; err != nil {
			errs = append(errs, err)
			continue
		}
		if err := checkServer(ctx, srv.rdb); err != nil {
			errs = append(errs, fmt.Errorf("remutex: server %s: %w", srv.rdb.Options().Addr, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...) // no use asking about permissions
	}
	if err := n.checkPermissions(ctx, c); err != nil {
		return err
	}
	return nil
}

// server is one Redis server of a node, or why it could not be had.
type server struct {
	rdb *redis.Client
	err error
}

// servers returns the servers a node's locks use: its one server, or every
// master of a Cluster.
func (n *node) servers(ctx context.Context) []server {
	switch r := n.rdb.(type) {
	case *redis.Client:
		return []server{{rdb: r}}
	case *redis.ClusterClient:
		var out []server
		ch := make(chan *redis.Client, 1024)
		err := r.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
			ch <- m
			return nil
		})
		close(ch)
		for m := range ch {
			out = append(out, server{rdb: m})
		}
		if err != nil || len(out) == 0 {
			out = append(out, server{err: fmt.Errorf("remutex: cluster: %w", checkErr(err))})
		}
		return out
	}
	return []server{{err: fmt.Errorf("remutex: Check: a %T is not supported", n.rdb)}}
}

// checkServer pings one server, loads the scripts, and reads its
// maxmemory-policy.
func checkServer(ctx context.Context, rdb *redis.Client) error {
	if err := rdb.Ping(ctx).Err(); err != nil {
		return checkErr(err)
	}
	for _, sc := range allScripts() {
		err := rdb.ScriptLoad(ctx, sc.src.(string)).Err()
		if err != nil && !redis.HasErrorPrefix(err, "NOPERM") {
			return fmt.Errorf("SCRIPT LOAD: %w", checkErr(err))
		}
	}
	policy, err := rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return nil // a managed server may refuse CONFIG: nothing to tell
	}
	if p := policy["maxmemory-policy"]; strings.HasPrefix(p, "allkeys-") || strings.HasPrefix(p, "volatile-") {
		return fmt.Errorf("%w: it is %s (set noeviction)", ErrEvictionPolicy, p)
	}
	return nil
}

// checkErr is a Redis error as the lock calls would report it.
func checkErr(err error) error {
	if err == nil {
		return errors.New("no server")
	}
	return scriptError(err)
}

// checkPermissions runs check.lua and a SUBSCRIBE on keys and a channel of
// c's prefix, naming what the user may not use.
func (n *node) checkPermissions(ctx context.Context, c *Client) error {
	base := c.prefix + "{remutex-check." + c.id + "}"
	channel := base + releasedInfix + c.id
	pub := "publish"
	if n.sharded(ctx) {
		pub = "spublish"
	}
	v, err := n.evalOn(ctx, []interface{}{base, base + ":z", base + ":s", base + ":l"}, checkScript, pub, channel)
	switch {
	case err != nil && redis.HasErrorPrefix(err, "NOPERM") && strings.Contains(err.Error(), "keys"):
		return fmt.Errorf("remutex: the user may not use keys under the key prefix %q (the ACL needs ~%s*): %w", c.prefix, c.prefix, err)
	case err != nil:
		return fmt.Errorf("remutex: the user may not run the lock scripts (EVALSHA, EVAL): %w", err)
	}
	var errs []error
	refused, _ := v.([]interface{})
	for _, r := range refused {
		errs = append(errs, fmt.Errorf("remutex: the lock scripts may not run %v (under the key prefix %q)", r, c.prefix))
	}
	if err := n.checkSubscribe(ctx, channel); err != nil {
		errs = append(errs, fmt.Errorf("remutex: SUBSCRIBE %s (waiters poll instead of hearing releases): %w", channel, err))
	}
	return errors.Join(errs...)
}

// checkSubscribe subscribes to channel on a connection of its own, and
// leaves it again.
func (n *node) checkSubscribe(ctx context.Context, channel string) error {
	var ps *redis.PubSub
	if cc, ok := n.rdb.(*redis.ClusterClient); ok && n.sharded(ctx) {
		ps = cc.SSubscribe(ctx, channel)
	} else {
		ps = n.rdb.Subscribe(ctx, channel)
	}
	defer ps.Close()
	_, err := ps.Receive(ctx)
	return err
}

// check checks every server of the quorum.
func (q *quorum) check(ctx context.Context, c *Client) error {
	var errs []error
	for i, nd := range q.nodes {
		if err := nd.check(ctx, c); err != nil {
			errs = append(errs, fmt.Errorf("remutex: quorum server %d of %d: %w", i+1, len(q.nodes), err))
		}
	}
	return errors.Join(errs...)
}
