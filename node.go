package remutex

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The scripts are the only code that changes a lock's keys, and the protocol
// itself: see scripts/*.lua. Each one is told absolute counts (the count a
// goroutine has and the count it wants), so a call sent twice, because the
// reply to the first was lost, changes nothing the second time.
// scriptFiles are the scripts and the parts they include.
//
//go:embed scripts/*.lua
var scriptFiles embed.FS

var (
	renewScript = loadScript("renew")
	raiseScript = loadScript("raise")

	// The uncontended cycle of a DistMutex and of a DistRWMutex's readers (see quick).
	quickLock, quickUnlock   = loadScript("quick_lock"), loadScript("quick_unlock")
	quickRLock, quickRUnlock = loadScript("quick_rlock"), loadScript("quick_runlock")

	// The scripts of each kind of lock: a DistMutex, and the write and read
	// sides of a DistRWMutex.
	mutexScripts = &scriptSet{loadScript("acquire"), loadScript("release"), loadScript("leave")}
	writeScripts = &scriptSet{loadScript("wlock"), loadScript("wunlock"), loadScript("rwleave")}
	readScripts  = &scriptSet{loadScript("rlock"), loadScript("runlock"), writeScripts.leave}
)

// scriptSet is what a lock's holds and waiters run: acquire (or queue),
// release, and leave the queue.
type scriptSet struct {
	acquire, release, leave *luaScript
}

// luaScript is a script with its SHA and source boxed once, so that calls do
// not allocate to pass them.
type luaScript struct {
	src, sha interface{}
	hash     string
}

// loadScript returns scripts/<name>.lua with its includes pasted in: a line
// "--#include <file>" is replaced by that file of scripts/ (the slow-path
// helpers of queue.lua and rw.lua come after a script's fast path, so that
// an uncontended call never builds them).
func loadScript(name string) *luaScript {
	return newLuaScript(include(readScript(name + ".lua")))
}

func readScript(file string) string {
	b, err := scriptFiles.ReadFile("scripts/" + file)
	if err != nil {
		panic("remutex: " + err.Error()) // embedded: cannot happen
	}
	return string(b)
}

func include(src string) string {
	var out strings.Builder
	for _, line := range strings.SplitAfter(src, "\n") {
		if file, ok := strings.CutPrefix(line, "--#include "); ok {
			out.WriteString(include(readScript(strings.TrimSpace(file))))
			continue
		}
		out.WriteString(line)
	}
	return out.String()
}

func newLuaScript(src string) *luaScript {
	h := redis.NewScript(src).Hash()
	return &luaScript{src: src, sha: h, hash: h}
}

// Reply codes of acquire.lua and release.lua.
const (
	replyLost    = -1 // acquire: a nested acquire found the hold gone
	replyBusy    = 0  // acquire: held by another owner
	replyGranted = 1  // acquire: the lock is ours
	replyQueued  = 2  // acquire: held by another; the caller waits in the queue
	replyGone    = 3  // acquire: the caller's queue entry, known queued, is gone

	releaseNotHeld = 0
	releaseDone    = 1
	releaseHandoff = 2 // freed and handed to the queue's head
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
	waitID     interface{} // "" never queues (TryLock)
	quick      bool        // an attempt's first call: quick_lock.lua may do, if the lock is calm
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
	// inspect and forceUnlock serve Client.Inspect and Client.ForceUnlock.
	inspect(ctx context.Context, s *lockSpec, subscribers bool) (LockInfo, error)
	forceUnlock(ctx context.Context, s *lockSpec, owners []string) (bool, error)
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
	close()
}

// lockSpec is what the scripts need of one lock (a DistMutex, or one side
// of a DistRWMutex), boxed once.
type lockSpec struct {
	name     string
	sc       *scriptSet
	keys     []string      // hash, fence, queue, queue:alive (DistRWMutex: and readers)
	keyArgs  []interface{} // keys, boxed
	home     string        // the key its holds live in: what the Client's state and channel are named by
	channel  string        // where this Client hears of the lock: <home>:released:<client id>
	queueArg interface{}   // "<entry ttl ms> <claim ms> <home>:released:" for the slow paths (queue.lua)
	lease    time.Duration
	claim    time.Duration // lease of a queue grant until the watchdog extends it
	ttl      time.Duration // liveness of a queue entry
	leaseArg interface{}
	keepArg  interface{} // nested calls: the lease, or "0" (keep the TTL) WithoutRenewal
	renewArg interface{} // the watchdog's lease argument (renew.lua)
	claimMs  string
	flag     string // the kind of its queue entries (see the scripts)
	fence    fenceMode
	read     bool   // the read side of a DistRWMutex
	unheld   string // the panic of an unlock that holds nothing
	quick    *quick // the uncontended cycle; nil for a DistRWMutex's write side
}

func (s *lockSpec) hash() string { return s.home }

// Key names of lock name under prefix: they all begin with P{name}, so that
// they share one cluster slot.
func lockKeys(prefix, name string) []string { return keysFrom(prefix + "{" + name + "}") }

// rwKeys are the keys of the read/write lock called name, apart from the
// mutex's: P{name}:rw and its fence, queue, queue:alive and readers.
func rwKeys(prefix, name string) []string {
	base := prefix + "{" + name + "}:rw"
	return append(keysFrom(base), base+":readers")
}

func keysFrom(base string) []string {
	return []string{base, base + ":fence", base + ":queue", base + ":queue:alive"}
}

// keyCounts are the boxed key counts of script calls, which is what
// ClusterClient looks at to route them.
var keyCounts = func() (a [maxBatch + 1]interface{}) {
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return a
}()

// hashTag returns the part of key Redis Cluster hashes: the text between the
// first '{' and the next '}', or "" when that is empty or missing.
func hashTag(key string) string {
	_, rest, ok := strings.Cut(key, "{")
	if !ok {
		return ""
	}
	tag, _, ok := strings.Cut(rest, "}")
	if !ok {
		return ""
	}
	return tag
}

// keySlot is Redis Cluster's slot of key: CRC16 of its hash tag mod 16384.
func keySlot(key string) int {
	if tag := hashTag(key); tag != "" {
		key = tag
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// replicaAck is WithReplicaAck: writes wait for this many replicas.
type replicaAck struct {
	replicas int
	timeout  time.Duration
}

// node is one Redis deployment: a Client's only one, or one of a quorum's
// independent servers. It owns the one path by which scripts reach Redis.
type node struct {
	rdb       redis.UniversalClient
	log       *slog.Logger
	cluster   bool // rdb is a *redis.ClusterClient
	ack       replicaAck
	starve    string      // starvation threshold in µs; -1 (never), in a quorum
	nodeArg   interface{} // "<starve µs> <publish command>" for the slow paths (queue.lua)
	shardOnce sync.Once   // decides shardPub with the first lock operation
	shardPub  bool        // release messages use sharded pub/sub
	batch     batcher     // coalesces the lock script calls of concurrent callers
	subscriber
}

func newNode(c *Client, rdb redis.UniversalClient, starve time.Duration) *node {
	n := &node{rdb: rdb, log: c.log, ack: c.ack, starve: "-1"}
	if starve != never {
		n.starve = strconv.FormatInt(starve.Microseconds(), 10)
	}
	n.nodeArg = n.starve + " publish"
	_, n.cluster = rdb.(*redis.ClusterClient)
	n.subscriber.c, n.subscriber.n = c, n
	n.batch.n = n
	return n
}

// target is what a script call is sent through: the node's client, or on a
// cluster the master of a slot (for WAIT on the same connection).
type target interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
}

// call is one script invocation.
type call struct {
	s    *luaScript
	keys []interface{}
	args []interface{}
	cmd  *redis.Cmd
}

func (cl *call) build(ctx context.Context, eval bool) {
	a := make([]interface{}, 0, 3+len(cl.keys)+len(cl.args))
	if eval {
		a = append(a, "eval", cl.s.src)
	} else {
		a = append(a, "evalsha", cl.s.sha)
	}
	a = append(a, keyCounts[len(cl.keys)])
	a = append(a, cl.keys...)
	a = append(a, cl.args...)
	cl.cmd = redis.NewCmd(ctx, a...)
}

// send runs calls through t: alone with one round trip, or in one pipeline
// when asked, when there are several, or when wait asks for replica
// acknowledgement (WAIT must share the writes' connection; its reply is
// returned). A server that
// does not have a script (first use, SCRIPT FLUSH, a restart: a NOSCRIPT
// reply, matched by its error code) gets those calls again with EVAL, and
// only those: the others had their replies.
func (n *node) send(ctx context.Context, t target, calls []*call, wait, pipeline bool) (acks *redis.IntCmd) {
	for _, eval := range [2]bool{false, true} {
		if len(calls) == 1 && !wait && !pipeline {
			calls[0].build(ctx, eval)
			_ = t.Process(ctx, calls[0].cmd)
		} else {
			pipe := t.Pipeline()
			for _, cl := range calls {
				if eval && !isNoScript(cl) {
					continue // answered
				}
				cl.build(ctx, eval)
				_ = pipe.Process(ctx, cl.cmd)
			}
			if wait {
				acks = redis.NewIntCmd(ctx, "wait", n.ack.replicas, n.ack.timeout.Milliseconds())
				_ = pipe.Process(ctx, acks)
			}
			_, _ = pipe.Exec(ctx)
		}
		if !anyNoScript(calls) {
			break
		}
	}
	return acks
}

func anyNoScript(calls []*call) bool {
	for _, cl := range calls {
		if isNoScript(cl) {
			return true
		}
	}
	return false
}

// (HasErrorPrefix allocates even for nil: look first.)
func isNoScript(cl *call) bool {
	err := cl.cmd.Err()
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// eval runs one lock script on the lock's keys, in one round trip with the
// calls of other goroutines made at the same moment (see batcher).
func (n *node) eval(ctx context.Context, s *lockSpec, sc *luaScript, args ...interface{}) (interface{}, error) {
	return n.evalOn(ctx, s.keyArgs, sc, args...)
}

// evalOn is eval on some of the lock's keys, the hash first.
func (n *node) evalOn(ctx context.Context, keys []interface{}, sc *luaScript, args ...interface{}) (interface{}, error) {
	cl := &call{s: sc, keys: keys, args: args}
	if err := n.batch.do(ctx, cl); err != nil {
		return nil, err
	}
	v, err := cl.cmd.Result()
	if err != nil {
		n.reloadAfter(err)
		return nil, scriptError(err)
	}
	return v, nil
}

// tail is the two arguments every lock script ends with, read only by its
// slow path (see queue.lua): the node's, then the lock's.
func (n *node) tail(ctx context.Context, s *lockSpec) (nodeArg, queueArg interface{}) {
	if n.cluster {
		n.sharded(ctx)
	}
	return n.nodeArg, s.queueArg
}

func (n *node) acquire(ctx context.Context, s *lockSpec, r acquireReq) (reply, error) {
	if r.quick && n.ack.replicas == 0 && s.quick.calm() {
		switch granted, f, err := n.quickLock(ctx, s, r); {
		case err != nil:
			return reply{}, err
		case granted:
			return reply{code: replyGranted, val: f}, nil
		}
	}
	na, qa := n.tail(ctx, s)
	args := []interface{}{r.owner, r.have, r.want, r.lease, r.fence.arg(), r.waitID, na, qa}
	if r.have > 0 || n.ack.replicas == 0 {
		v, err := n.eval(ctx, s, s.sc.acquire, args...)
		if err != nil {
			return reply{}, err
		}
		rep, err := parseReply(v)
		if err == nil && (rep.code == replyBusy || rep.code == replyQueued) {
			s.quick.contended()
		}
		return rep, err
	}
	return n.ackedAcquire(ctx, s, r.owner, args)
}

// ackedAcquire runs acquire followed by WAIT on the same connection (one
// round trip). A grant that fewer than the required replicas acknowledged
// is rolled back and reported as ErrTooFewReplicas: a failover could
// otherwise promote a replica that never saw it.
func (n *node) ackedAcquire(ctx context.Context, s *lockSpec, owner interface{}, args []interface{}) (reply, error) {
	t, err := n.masterFor(ctx, s.hash())
	if err != nil {
		return reply{}, err
	}
	cl := &call{s: s.sc.acquire, keys: s.keyArgs, args: args}
	acks := n.send(ctx, t, []*call{cl}, true, true)
	v, err := cl.cmd.Result()
	if err != nil {
		n.reloadAfter(err)
		return reply{}, scriptError(err)
	}
	r, err := parseReply(v)
	if err != nil || r.code != replyGranted {
		return r, err
	}
	if err := n.ackErr(acks); err != nil {
		rollback(ctx, n, s, owner)
		return reply{}, err
	}
	return r, nil
}

// ackErr says why a WAIT reply falls short of WithReplicaAck, or nil.
func (n *node) ackErr(acks *redis.IntCmd) error {
	got, err := acks.Result()
	if err != nil {
		return err
	}
	if got < int64(n.ack.replicas) {
		return fmt.Errorf("%w: %d of %d within %v", ErrTooFewReplicas, got, n.ack.replicas, n.ack.timeout)
	}
	return nil
}

// masterFor returns what to pipeline WAIT with a write to key through: on a
// cluster, the master serving key's slot, so both share a connection.
func (n *node) masterFor(ctx context.Context, key string) (target, error) {
	if cc, ok := n.rdb.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, key)
	}
	return n.rdb, nil
}

func (n *node) release(ctx context.Context, s *lockSpec, owner interface{}, want int, lease interface{}) (int64, error) {
	if want == 0 && s.quick.calm() {
		v, err := n.evalOn(ctx, s.quick.unlockKeys, s.quick.unlock, owner)
		if err != nil {
			return 0, err
		}
		if res, err := toInt64(v); err != nil || res >= 0 {
			return res, err
		}
		s.quick.contended() // somebody waits: release.lua hands the lock on
	}
	na, qa := n.tail(ctx, s)
	v, err := n.eval(ctx, s, s.sc.release, owner, want, lease, na, qa)
	if err != nil {
		return 0, err
	}
	res, err := toInt64(v)
	if res == releaseHandoff {
		s.quick.contended()
	}
	return res, err
}

func (n *node) leave(ctx context.Context, s *lockSpec, owner interface{}, entry string) error {
	na, qa := n.tail(ctx, s)
	_, err := n.eval(ctx, s, s.sc.leave, owner, entry, na, qa)
	return err
}

func (n *node) grants() bool      { return true }
func (n *node) freshOwners() bool { return false }
func (n *node) acked() bool       { return n.ack.replicas > 0 }

// rollback releases a hold nobody will use (an acquisition that failed, a
// grant that came too late, a lost hold's leftover field), best effort and
// briefly: its lease ends it otherwise.
func rollback(ctx context.Context, b backend, s *lockSpec, owner interface{}) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_, err := b.release(ctx, s, owner, 0, "0")
	return err
}

// rollbackTimeout bounds a rollback: past it the lease ends the hold.
const rollbackTimeout = time.Second

// parseReply decodes the {code, value} reply of acquire.
func parseReply(v interface{}) (reply, error) {
	a, ok := v.([]interface{})
	if !ok || len(a) != 2 {
		return reply{}, fmt.Errorf("remutex: unexpected script reply %v", v)
	}
	code, err1 := toInt64(a[0])
	val, err2 := toInt64(a[1])
	return reply{code: code, val: val}, errors.Join(err1, err2)
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

// renewItem is one hold to renew: its lock's hash key, owner token and lease.
type renewItem struct {
	key          string
	owner, lease interface{}
}

// maxBatch bounds the keys of one renewal script call, so that the server is
// never busy for long in one script.
const maxBatch = 500

// renewBatch is one renew.lua call and the items it carries.
type renewBatch struct {
	idx  []int
	call *call
}

// renew renews items: one script call per cluster slot (one in all on a
// single server) and maxBatch keys, all in one pipeline per server. Results
// per item: 1 renewed, 0 not ours, -1 failed.
func (n *node) renew(ctx context.Context, items []renewItem) []int64 {
	res := make([]int64, len(items))
	for i := range res {
		res[i] = -1
	}
	// With WithReplicaAck each server gets its own pipeline, whose WAIT shares
	// the connection of the writes it waits for. Without it everything goes
	// in one (go-redis splits a cluster pipeline by node).
	byTarget := map[target][]renewBatch{}
	for _, b := range n.renewBatches(items) {
		t := target(n.rdb)
		if n.acked() {
			var err error
			if t, err = n.masterFor(ctx, items[b.idx[0]].key); err != nil {
				n.log.Warn("remutex: renewal failed", "locks", len(b.idx), "err", err)
				continue
			}
		}
		byTarget[t] = append(byTarget[t], b)
	}
	for t, bs := range byTarget {
		calls := make([]*call, len(bs))
		for i, b := range bs {
			calls[i] = b.call
		}
		acks := n.send(ctx, t, calls, n.acked(), true)
		for _, b := range bs {
			n.collect(b, acks, res)
		}
	}
	return res
}

// renewBatches groups items by cluster slot, maxBatch to a call.
func (n *node) renewBatches(items []renewItem) []renewBatch {
	groups := map[int][]int{}
	for i, it := range items {
		slot := 0
		if n.cluster {
			slot = keySlot(it.key)
		}
		groups[slot] = append(groups[slot], i)
	}
	var out []renewBatch
	for _, g := range groups {
		for len(g) > 0 {
			k := min(len(g), maxBatch)
			cl := &call{s: renewScript, keys: make([]interface{}, k), args: make([]interface{}, 0, 2*k)}
			for j, i := range g[:k] {
				cl.keys[j] = items[i].key
				cl.args = append(cl.args, items[i].owner, items[i].lease)
			}
			out = append(out, renewBatch{idx: g[:k], call: cl})
			g = g[k:]
		}
	}
	return out
}

// collect copies the per-key results of one renewal call into res.
func (n *node) collect(b renewBatch, acks *redis.IntCmd, res []int64) {
	vals, err := b.call.cmd.Slice()
	if err == nil && acks != nil {
		err = n.ackErr(acks)
	}
	if err != nil {
		n.reloadAfter(err)
		if !errors.Is(err, context.Canceled) {
			n.log.Warn("remutex: renewal failed", "locks", len(b.idx), "err", err)
		}
		return
	}
	for j, i := range b.idx {
		if j < len(vals) {
			if v, ok := vals[j].(int64); ok {
				res[i] = v
			}
		}
	}
}

// Hash returns the script's SHA1, as SCRIPT EXISTS knows it.
func (s *luaScript) Hash() string { return s.hash }
