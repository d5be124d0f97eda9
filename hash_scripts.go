package remutex

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
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
	//go:embed scripts/raise.lua
	luaRaise string
)

var (
	acquireScript = newLuaScript(luaCommon + luaAcquire)
	enqueueScript = newLuaScript(luaCommon + luaEnqueue)
	releaseScript = newLuaScript(luaCommon + luaRelease)
	leaveScript   = newLuaScript(luaCommon + luaLeave)
	renewScript   = newLuaScript(luaRenew)
	raiseScript   = newLuaScript(luaRaise)
)

// node is one Redis deployment a Client keeps locks on: its only one, or one
// of the independent servers of a quorum Client. It owns the thin wrappers
// that call the scripts, and the node's pub/sub connections.
type node struct {
	c         *Client
	rdb       redis.UniversalClient
	cluster   bool        // rdb is a *redis.ClusterClient
	shardOnce sync.Once   // decides shardPub with the first lock operation
	shardPub  bool        // release messages use sharded pub/sub
	publish   interface{} // the publish command scripts use: "publish" or "spublish"
	sub       subscriber
}

func newNode(c *Client, rdb redis.UniversalClient) *node {
	n := &node{c: c, rdb: rdb, publish: "publish"}
	_, n.cluster = rdb.(*redis.ClusterClient)
	n.sub.c, n.sub.n = c, n
	return n
}

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

// markerTTL is how long the markers of final releases live after the latest
// one: long enough to cover go-redis resending a release after a reconnect.
const markerTTL = "10000"

// keyCount is the number of keys every lock script receives, as a string so
// that ClusterClient finds the first key (and boxing it costs nothing).
const keyCount = "5"

// eval runs s on the lock's five keys with EVALSHA, and with EVAL when the
// server does not have the script (first use, SCRIPT FLUSH, a restart).
func (n *node) eval(ctx context.Context, s luaScript, k *lockKeys, args ...interface{}) (interface{}, error) {
	cmdArgs := make([]interface{}, 0, 3+len(k.args)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", s.sha, keyCount)
	cmdArgs = append(cmdArgs, k.args...)
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	_ = n.rdb.Process(ctx, cmd)
	v, err := cmd.Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		v, err = s.Eval(ctx, n.rdb, k.keys[:], args...).Result()
	}
	if err != nil {
		return nil, scriptError(err)
	}
	return v, nil
}

// pub returns the publish command for scripts, deciding it on first use on
// a cluster (sharded pub/sub on Redis 7).
func (n *node) pub(ctx context.Context) interface{} {
	if n.cluster {
		n.sharded(ctx)
	}
	return n.publish
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

// scriptReply is the result of one acquire-type script call.
type scriptReply struct {
	code  int64
	val   int64 // fence when granted; holder's PTTL in ms when busy or queued
	split bool  // quorum, busy: some servers granted it, too few (contenders split them)
}

func (n *node) acquire(ctx context.Context, k *lockKeys, owner interface{}, have, want int, lease interface{}, fencing interface{}) (scriptReply, error) {
	if have == 0 && n.c.ackReplicas > 0 {
		return n.acked(ctx, acquireScript, k, owner, owner, have, want, lease, fencing, n.pub(ctx), k.channelArg)
	}
	v, err := n.eval(ctx, acquireScript, k, owner, have, want, lease, fencing, n.pub(ctx), k.channelArg)
	if err != nil {
		return scriptReply{}, err
	}
	code, val, err := pair(v)
	return scriptReply{code: code, val: val}, err
}

func (n *node) enqueue(ctx context.Context, k *lockKeys, owner, entry string, ttl time.Duration, lease, fencing interface{}) (scriptReply, error) {
	if n.c.ackReplicas > 0 {
		return n.acked(ctx, enqueueScript, k, owner, owner, entry, ttl.Milliseconds(), lease, fencing, n.pub(ctx), k.channelArg)
	}
	v, err := n.eval(ctx, enqueueScript, k, owner, entry, ttl.Milliseconds(), lease, fencing, n.pub(ctx), k.channelArg)
	if err != nil {
		return scriptReply{}, err
	}
	code, val, err := pair(v)
	return scriptReply{code: code, val: val}, err
}

// acked runs an acquire-type script followed by WAIT on the same connection
// (one round trip). A grant that fewer than the required replicas
// acknowledged is rolled back and reported as ErrTooFewReplicas: a failover
// could otherwise promote a replica that never saw it.
func (n *node) acked(ctx context.Context, s luaScript, k *lockKeys, owner interface{}, args ...interface{}) (scriptReply, error) {
	target, err := n.nodeFor(ctx, k.hash())
	if err != nil {
		return scriptReply{}, err
	}
	var cmd *redis.Cmd
	var acks *redis.IntCmd
	run := func(eval bool) {
		pipe := target.Pipeline()
		if eval {
			cmd = s.Eval(ctx, pipe, k.keys[:], args...)
		} else {
			cmd = s.EvalSha(ctx, pipe, k.keys[:], args...)
		}
		acks = redis.NewIntCmd(ctx, "wait", n.c.ackReplicas, n.c.ackTimeout.Milliseconds())
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
		return scriptReply{code: code, val: val}, err
	}
	if got, err := acks.Result(); err != nil || got < int64(n.c.ackReplicas) {
		_, _ = n.release(context.WithoutCancel(ctx), k, owner, 0, "0", 0)
		if err != nil {
			return scriptReply{}, err
		}
		return scriptReply{}, fmt.Errorf("%w: %d of %d within %v", ErrTooFewReplicas, got, n.c.ackReplicas, n.c.ackTimeout)
	}
	return scriptReply{code: code, val: val}, nil
}

// nodeFor returns the client to pipeline WAIT with a write to key: on a
// cluster, the master serving key's slot, so both share a connection.
func (n *node) nodeFor(ctx context.Context, key string) (redis.Cmdable, error) {
	if cc, ok := n.rdb.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, key)
	}
	return n.rdb, nil
}

// release sets the owner's count to want (0 ends the hold). relID marks a
// final release so that a resent one still reports success.
func (n *node) release(ctx context.Context, k *lockKeys, owner interface{}, want int, lease, relID interface{}) (int64, error) {
	v, err := n.eval(ctx, releaseScript, k, owner, want, lease, relID, markerTTL, n.pub(ctx), k.channelArg)
	if err != nil {
		return 0, err
	}
	return toInt64(v)
}

// leave removes a queued waiter's entry, releasing a grant it did not take.
func (n *node) leave(ctx context.Context, k *lockKeys, owner, entry string) error {
	_, err := n.eval(ctx, leaveScript, k, owner, entry, n.pub(ctx), k.channelArg)
	return err
}
