package remutex

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The scripts are the only code that changes a lock's keys. Each one is told
// absolute counts (the count the goroutine has and the count it wants), so a
// call that go-redis sends twice, because the reply to the first was lost,
// changes nothing the second time. See scripts/*.lua for their contracts.

var (
	//go:embed scripts/common.lua
	luaCommon string
	//go:embed scripts/acquire.lua
	luaAcquire string
	//go:embed scripts/enqueue.lua
	luaEnqueue string
	//go:embed scripts/release.lua
	luaRelease string
	//go:embed scripts/leave.lua
	luaLeave string
	//go:embed scripts/renew.lua
	luaRenew string
)

var (
	acquireScript = newLuaScript(luaCommon + luaAcquire)
	enqueueScript = newLuaScript(luaCommon + luaEnqueue)
	releaseScript = newLuaScript(luaCommon + luaRelease)
	leaveScript   = newLuaScript(luaCommon + luaLeave)
	renewScript   = newLuaScript(luaRenew)
)

// luaScript is a go-redis Script with its SHA boxed once, so that calls do
// not allocate to pass it.
type luaScript struct {
	*redis.Script
	sha interface{}
}

func newLuaScript(src string) luaScript {
	s := redis.NewScript(src)
	return luaScript{Script: s, sha: s.Hash()}
}

// Script reply codes.
const (
	replyLost    = -1 // acquire: a nested acquire found the hold gone
	replyBusy    = 0  // acquire: held by another owner
	replyGranted = 1  // acquire, enqueue: the lock is ours
	replyQueued  = 2  // acquire: waiters are queued; enqueue: still queued

	releaseNotHeld = 0
	releaseHandoff = 2 // release: freed and handed to the queue's head
)

// markerTTL is how long the marker of a final release lives: long enough to
// cover go-redis resending the release after a reconnect.
const markerTTL = "10000"

// keyCount is the number of keys every lock script receives, as a string so
// that ClusterClient finds the first key (and boxing it costs nothing).
const keyCount = "5"

// eval runs s on the lock's five keys with EVALSHA, and with EVAL when the
// server does not have the script (first use, SCRIPT FLUSH, a restart).
func (c *Client) eval(ctx context.Context, s luaScript, k *lockKeys, args ...interface{}) (interface{}, error) {
	cmdArgs := make([]interface{}, 0, 3+len(k.args)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", s.sha, keyCount)
	cmdArgs = append(cmdArgs, k.args...)
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	_ = c.rdb.Process(ctx, cmd)
	v, err := cmd.Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		v, err = s.Eval(ctx, c.rdb, k.keys[:], args...).Result()
	}
	if err != nil {
		return nil, scriptError(err)
	}
	return v, nil
}

// pub returns the publish command for scripts, deciding it on first use on
// a cluster (sharded pub/sub on Redis 7).
func (c *Client) pub(ctx context.Context) interface{} {
	if c.cluster {
		c.sharded(ctx)
	}
	return c.publish
}

// pair decodes the {code, value} reply of acquire and enqueue.
func pair(v interface{}) (code, val int64, err error) {
	a, ok := v.([]interface{})
	if !ok || len(a) != 2 {
		return 0, 0, fmt.Errorf("remutex: unexpected script reply %v", v)
	}
	code, err1 := toInt64(a[0])
	val, err2 := toInt64(a[1])
	return code, val, errors.Join(err1, err2)
}

func toInt64(v interface{}) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("remutex: unexpected script reply %v", v)
}

// acquireArgs are the results of one acquire-type script call.
type scriptReply struct {
	code int64
	val  int64 // fence when granted; holder's PTTL in ms when busy or queued
}

func (c *Client) acquire(ctx context.Context, k *lockKeys, owner interface{}, have, want int, lease interface{}, fencing interface{}) (scriptReply, error) {
	if have == 0 && c.ackReplicas > 0 {
		return c.acked(ctx, acquireScript, k, owner, owner, have, want, lease, fencing, c.pub(ctx), k.channelArg)
	}
	v, err := c.eval(ctx, acquireScript, k, owner, have, want, lease, fencing, c.pub(ctx), k.channelArg)
	if err != nil {
		return scriptReply{}, err
	}
	code, val, err := pair(v)
	return scriptReply{code, val}, err
}

func (c *Client) enqueue(ctx context.Context, k *lockKeys, owner, entry string, ttl time.Duration, lease, fencing interface{}) (scriptReply, error) {
	if c.ackReplicas > 0 {
		return c.acked(ctx, enqueueScript, k, owner, owner, entry, ttl.Milliseconds(), lease, fencing, c.pub(ctx), k.channelArg)
	}
	v, err := c.eval(ctx, enqueueScript, k, owner, entry, ttl.Milliseconds(), lease, fencing, c.pub(ctx), k.channelArg)
	if err != nil {
		return scriptReply{}, err
	}
	code, val, err := pair(v)
	return scriptReply{code, val}, err
}

// acked runs an acquire-type script followed by WAIT on the same connection
// (one round trip). A grant that fewer than the required replicas
// acknowledged is rolled back and reported as ErrTooFewReplicas: a failover
// could otherwise promote a replica that never saw it.
func (c *Client) acked(ctx context.Context, s luaScript, k *lockKeys, owner interface{}, args ...interface{}) (scriptReply, error) {
	node, err := c.nodeFor(ctx, k.hash())
	if err != nil {
		return scriptReply{}, err
	}
	var cmd *redis.Cmd
	var acks *redis.IntCmd
	run := func(eval bool) {
		pipe := node.Pipeline()
		if eval {
			cmd = s.Eval(ctx, pipe, k.keys[:], args...)
		} else {
			cmd = s.EvalSha(ctx, pipe, k.keys[:], args...)
		}
		acks = redis.NewIntCmd(ctx, "wait", c.ackReplicas, c.ackTimeout.Milliseconds())
		_ = pipe.Process(ctx, acks)
		_, _ = pipe.Exec(ctx)
	}
	run(false)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		run(true)
	}
	v, err := cmd.Result()
	if err != nil {
		return scriptReply{}, scriptError(err)
	}
	code, val, err := pair(v)
	if err != nil || code != replyGranted {
		return scriptReply{code, val}, err
	}
	if n, err := acks.Result(); err != nil || n < int64(c.ackReplicas) {
		_, _ = c.release(context.WithoutCancel(ctx), k, owner, 0, "0", 0)
		if err != nil {
			return scriptReply{}, err
		}
		return scriptReply{}, fmt.Errorf("%w: %d of %d within %v", ErrTooFewReplicas, n, c.ackReplicas, c.ackTimeout)
	}
	return scriptReply{code, val}, nil
}

// nodeFor returns the client to pipeline WAIT with a write to key: on a
// cluster, the master serving key's slot, so both share a connection.
func (c *Client) nodeFor(ctx context.Context, key string) (redis.Cmdable, error) {
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, key)
	}
	return c.rdb, nil
}

// release sets the owner's count to want (0 ends the hold). relID marks a
// final release so that a resent one still reports success.
func (c *Client) release(ctx context.Context, k *lockKeys, owner interface{}, want int, lease, relID interface{}) (int64, error) {
	v, err := c.eval(ctx, releaseScript, k, owner, want, lease, relID, markerTTL, c.pub(ctx), k.channelArg)
	if err != nil {
		return 0, err
	}
	return toInt64(v)
}

// leave removes a queued waiter's entry, releasing a grant it did not take.
func (c *Client) leave(ctx context.Context, k *lockKeys, owner, entry string) error {
	_, err := c.eval(ctx, leaveScript, k, owner, entry, c.pub(ctx), k.channelArg)
	return err
}
