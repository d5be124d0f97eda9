package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/wire"
)

// keyCounts are the boxed key counts of script calls, which is what
// ClusterClient looks at to route them.
var keyCounts = func() (a [maxBatch + 1]interface{}) {
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return a
}()

// Config is what a backend is built from: the Client's settings and the
// engine's hooks, never the Client itself.
type Config struct {
	Log *slog.Logger
	// Replicas and AckTimeout are WithReplicaAck: writes wait for this many
	// replicas, this long (0 replicas: none).
	Replicas   int
	AckTimeout time.Duration
	// Listener hears the messages of the backend's subscriptions.
	Listener Listener
	// ScriptError turns the error of a call into the error the engine
	// reports (the root's typed errors of a script's refusal); nil leaves
	// it as it came.
	ScriptError func(error) error
}

// replicaAck is WithReplicaAck: writes wait for this many replicas.
type replicaAck struct {
	replicas int
	timeout  time.Duration
}

// node is one Redis deployment: a Client's only one, or one of a quorum's
// independent servers. It owns the one path by which scripts reach Redis.
type node struct {
	rdb      redis.UniversalClient
	log      *slog.Logger
	cluster  bool // rdb is a *redis.ClusterClient
	ack      replicaAck
	errs     func(error) error // Config.ScriptError
	handoff  bool              // the queue hands the lock to waiters (a quorum's servers only wake them)
	pubs     [3]interface{}    // the slow paths' publish commands, classic, sharded and relayed (pub.lua): in capitals without handoff; boxed once
	decided  atomic.Bool       // shardPub is decided (by the batcher's drainer alone)
	shardPub atomic.Bool       // release messages use sharded pub/sub
	batch    batcher           // coalesces the lock script calls of concurrent callers
	bounded  target            // rdb if it follows contexts: Unlock's calls go on their caller's goroutine (see boundedTarget)
	dials    *dialWatch        // refused dials, which answer a TryLock at once
	subscriber
}

// NewNode returns the backend of one Redis deployment, rdb.
func NewNode(cfg Config, rdb redis.UniversalClient) Backend { return newNode(cfg, rdb, true) }

// newNode returns a node of cfg on rdb; handoff says whether its queue hands
// the lock to waiters (a quorum's servers only wake them).
func newNode(cfg Config, rdb redis.UniversalClient, handoff bool) *node {
	n := &node{rdb: rdb, log: cfg.Log, ack: replicaAck{cfg.Replicas, cfg.AckTimeout}, errs: cfg.ScriptError, handoff: handoff, pubs: [3]interface{}{"PUBLISH", "SPUBLISH", "PUBLISH"}}
	if n.errs == nil {
		n.errs = func(err error) error { return err }
	}
	if handoff {
		// Lower case: the queue hands the lock on. "pUBLISH": on a cluster
		// that relays classic messages, which a Client may hear on any node.
		n.pubs = [3]interface{}{"publish", "spublish", "pUBLISH"}
	}
	_, n.cluster = rdb.(*redis.ClusterClient)
	n.subscriber.to, n.subscriber.n = cfg.Listener, n
	n.batch.n = n
	n.batch.stopped, n.batch.stop = context.WithCancel(context.Background())
	n.dials = watchDials(rdb)
	n.bounded = boundedTarget(rdb)
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		n.askSharded(cc)
	}
	return n
}

// target is what a script call is sent through: the node's client, or on a
// cluster the master of a slot (for WAIT on the same connection).
type target interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
}

// call is one script invocation.
// It is a script call, or (s nil) a plain command: args alone.
type call struct {
	s    *Script
	keys []interface{}
	args []interface{}
	cmd  *redis.Cmd
	look bool // EXISTS of one key, whose count alone matters (see batcher.round)
	// once: the redis client must not send it again after a failure (see
	// onceCmd); a release, whose reply must tell its own earlier copy from
	// a loss.
	once bool
	// try: a TryLock's call, answered at once if a connection is refused
	// meanwhile (see dialWatch).
	try bool
	// buf, when it has room, holds the command's arguments (see evalTry).
	buf []interface{}
}

// onceCmd is a command the redis client never sends again by itself (after a
// connection error or a timeout, as go-redis does up to MaxRetries times):
// a release that finds nothing of its hold then knows that no earlier copy
// of it was applied unless remutex sent one, and reports the hold lost
// exactly when it was (see DistMutex.settle). A pipeline that carries one is
// not resent either; its other calls are retried by their callers.
type onceCmd struct{ *redis.Cmd }

func (onceCmd) NoRetry() bool { return true }

// cmder is what cl is sent as.
func (cl *call) cmder() redis.Cmder {
	if cl.once {
		return onceCmd{cl.cmd}
	}
	return cl.cmd
}

func (cl *call) build(ctx context.Context, eval bool) {
	if cl.s == nil {
		cl.cmd = redis.NewCmd(ctx, cl.args...)
		return
	}
	a := cl.buf[:0]
	if need := 3 + len(cl.keys) + len(cl.args); cap(a) < need {
		a = make([]interface{}, 0, need)
	}
	if eval {
		a = append(a, "eval", cl.s.Src)
	} else {
		a = append(a, "evalsha", cl.s.SHA)
	}
	a = append(a, keyCounts[len(cl.keys)])
	a = append(a, cl.keys...)
	a = append(a, cl.args...)
	cl.cmd = redis.NewCmd(ctx, a...)
}

// send runs calls through t: alone with one round trip, or in one pipeline
// when asked, when there are several, or when wait asks for replica
// acknowledgement (WAIT must share the writes' connection; its reply is
// returned). A server that does not have a script (first use, SCRIPT
// FLUSH, a restart: a NOSCRIPT Reply, matched by its error code) gets the
// calls again from the first that it refused, in their order: those
// refused with EVAL, the others (applied once already) with EVALSHA. So
// the calls take effect in the order they were made, which a call that
// undoes another one relies on (see postCtx); applying a lock script twice
// is safe, as a resent call is. Each caller gets the reply of the last
// application, which tells what Redis now has (a call applied again after
// one refused before it may find the lock changed by that one), but for a
// release (once): its second application finds nothing of its hold, and
// its first reply says what it did.
func (n *node) send(ctx context.Context, t target, calls []*call, wait, pipeline bool) (acks *redis.IntCmd) {
	var evals []bool                 // per call: send it with EVAL
	var applied map[*call]*redis.Cmd // a release's reply of its first application
	defer func() {
		for cl, cmd := range applied {
			cl.cmd = cmd
		}
	}()
	for pass := 0; ; pass++ {
		if len(calls) == 1 && !wait && !pipeline {
			calls[0].build(ctx, evals != nil && evals[0])
			_ = t.Process(ctx, calls[0].cmder())
		} else {
			pipe := t.Pipeline()
			for i, cl := range calls {
				cl.build(ctx, evals != nil && evals[i])
				_ = pipe.Process(ctx, cl.cmder())
			}
			if wait {
				acks = redis.NewIntCmd(ctx, "wait", n.ack.replicas, n.ack.timeout.Milliseconds())
				_ = pipe.Process(ctx, acks)
			}
			_, _ = pipe.Exec(ctx)
		}
		first := firstNoScript(calls)
		if first < 0 || pass == 2 {
			return acks
		}
		calls = calls[first:]
		if applied == nil {
			applied = make(map[*call]*redis.Cmd)
		}
		evals = make([]bool, len(calls))
		for i, cl := range calls {
			if _, ok := applied[cl]; !ok && cl.once && !isNoScript(cl) {
				applied[cl] = cl.cmd
			}
			// (A third pass, after scripts were flushed once more between
			// two, sends them all in full.)
			evals[i] = pass == 1 || isNoScript(cl)
		}
	}
}

// firstNoScript returns the index of the first call the server refused
// with NOSCRIPT, or -1.
func firstNoScript(calls []*call) int {
	for i, cl := range calls {
		if isNoScript(cl) {
			return i
		}
	}
	return -1
}

// (HasErrorPrefix allocates even for nil: look first.)
func isNoScript(cl *call) bool {
	if cl.s == nil {
		return false
	}
	err := cl.cmd.Err()
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// eval runs one lock script on the lock's keys, in one round trip with the
// calls of other goroutines made at the same moment (see batcher).
func (n *node) eval(ctx context.Context, s *Spec, sc *Script, args ...interface{}) (interface{}, error) {
	return n.evalOn(ctx, s.KeyArgs, sc, args...)
}

// evalOn is eval on some of the lock's keys, the hash first.
func (n *node) evalOn(ctx context.Context, keys []interface{}, sc *Script, args ...interface{}) (interface{}, error) {
	return n.evalCall(ctx, &call{s: sc, keys: keys, args: args})
}

// evalTry is evalOn for an acquisition's call: a TryLock's if try. The call
// and its command's arguments come from a pool, as quickRelease's do: an
// acquisition is the hot path. They go back once answered, never after an
// error of the round trip (the drainer may still send a call cut off).
func (n *node) evalTry(ctx context.Context, try bool, keys []interface{}, sc *Script, args ...interface{}) (interface{}, error) {
	return n.evalPooled(ctx, call{s: sc, keys: keys, try: try}, args...)
}

// evalPooled is evalTry of the call cl (its script, keys and flags) with
// args: also a release's (once), which a hand-off sends, so that its way to
// the socket allocates no more than an acquisition's does.
func (n *node) evalPooled(ctx context.Context, cl call, args ...interface{}) (interface{}, error) {
	ac := acquirePool.Get().(*acquireCall)
	cl.args, cl.buf = append(ac.args[:0], args...), ac.built[:0]
	ac.cl = cl
	if err := n.batch.do(ctx, &ac.cl); err != nil {
		return nil, err
	}
	cmd := ac.cl.cmd
	ac.cl = call{}
	clear(ac.args[:])
	clear(ac.built[:])
	acquirePool.Put(ac)
	return n.answer(cmd)
}

// acquireCall is evalPooled's call, pooled; built is its command's arguments
// (see call.build), room enough for every acquisition's.
type acquireCall struct {
	cl    call
	args  [8]interface{}
	built [16]interface{}
}

var acquirePool = sync.Pool{New: func() any { return new(acquireCall) }}

// evalCall is evalOn of a call built already.
func (n *node) evalCall(ctx context.Context, cl *call) (interface{}, error) {
	if err := n.batch.do(ctx, cl); err != nil {
		return nil, err
	}
	return n.answer(cl.cmd)
}

// answer is the reply of a script's command, its error named (scriptError)
// and a missing script loaded again (reloadAfter).
func (n *node) answer(cmd *redis.Cmd) (interface{}, error) {
	v, err := cmd.Result()
	if err != nil {
		n.reloadAfter(err)
		return nil, n.errs(err)
	}
	return v, nil
}

// pub is the argument every lock script ends with, read only by its slow
// path (see pub.lua): the publish command, in capitals where the queue
// only wakes waiters (a quorum).
func (n *node) pub(ctx context.Context) interface{} {
	switch {
	case !n.cluster:
		return n.pubs[0]
	case n.sharded(ctx):
		return n.pubs[1]
	}
	return n.pubs[2]
}

func (n *node) Acquire(ctx context.Context, s *Spec, r AcquireReq) (Reply, error) {
	if r.Quick && n.ack.replicas == 0 && s.Quick.calm() {
		switch granted, f, err := n.quickLock(ctx, s, r); {
		case err != nil:
			return Reply{}, err
		case granted:
			return Reply{Code: wire.Granted, Val: f}, nil
		}
	}
	args := []interface{}{r.Owner, r.Have, r.Want, r.Lease, r.Fence.arg(), r.entryArg(s), n.pub(ctx)}
	if s.Size != nil {
		args = []interface{}{r.Owner, r.Have, r.Want, r.Lease, r.Fence.arg(), r.entryArg(s), s.Size, n.pub(ctx)}
	}
	if r.Have > 0 || n.ack.replicas == 0 {
		v, err := n.evalTry(ctx, r.Try, s.KeyArgs, s.Scripts.Acquire, args...)
		if err != nil {
			return Reply{}, err
		}
		rep, err := ParseReply(v)
		if err == nil && (rep.Code == wire.Busy || rep.Code == wire.Queued) {
			s.Quick.Contended()
		}
		return rep, err
	}
	return n.ackedAcquire(ctx, s, r.Owner, args)
}

// ackedAcquire runs acquire followed by WAIT on the same connection (one
// round trip), as a job of the batcher (so that it is cut off by ctx, and
// what undoes it follows it). A grant that fewer than the required replicas
// acknowledged is given back and reported as ErrTooFewReplicas: a failover
// could otherwise promote a replica that never saw it.
func (n *node) ackedAcquire(ctx context.Context, s *Spec, owner interface{}, args []interface{}) (Reply, error) {
	var r Reply
	var err error
	if jerr := n.batch.job(ctx, func(ctx context.Context) { r, err = n.ackedRound(ctx, s, owner, args) }); jerr != nil {
		return Reply{}, jerr
	}
	return r, err
}

// ackedRound is ackedAcquire's round trip, run by the drainer.
func (n *node) ackedRound(ctx context.Context, s *Spec, owner interface{}, args []interface{}) (Reply, error) {
	v, short, err := n.ackedSend(ctx, s, &call{s: s.Scripts.Acquire, keys: s.KeyArgs, args: args})
	if err != nil {
		return Reply{}, err
	}
	r, err := ParseReply(v)
	if err != nil || r.Code != wire.Granted {
		return r, err
	}
	if short != nil {
		PostRelease(ctx, n, s, owner, "0") // posted: the drainer sends it next round
		return Reply{}, short
	}
	return r, nil
}

// ackedCall runs cl followed by WAIT on the same connection (one round
// trip), as a job of the batcher, like ackedAcquire: a DistOnce's final
// release, whose record its Do reports only once the replicas have it (a
// failover could otherwise lose it, and f run again). Fewer acknowledgements
// than required are ErrTooFewReplicas; the call took effect on the master.
//
// The shortfall is final, not retried: a resend would find the record
// written and nothing of the hold, which a resent release counts as done.
func (n *node) ackedCall(ctx context.Context, s *Spec, cl *call) (interface{}, error) {
	var v interface{}
	var err error
	jerr := n.batch.job(ctx, func(ctx context.Context) {
		var short error
		if v, short, err = n.ackedSend(ctx, s, cl); err == nil && short != nil {
			err = final{short}
		}
	})
	if jerr != nil {
		return nil, jerr
	}
	return v, err
}

// ackedSend is the round trip of ackedRound and ackedCall, run by the
// drainer: cl, then WAIT on the same connection. It returns cl's reply and
// why the acknowledgements fell short of WithReplicaAck (nil if they did
// not).
func (n *node) ackedSend(ctx context.Context, s *Spec, cl *call) (v interface{}, short, err error) {
	t, err := n.masterFor(ctx, s.Home)
	if err != nil {
		return nil, nil, err
	}
	acks := n.send(ctx, t, []*call{cl}, true, true)
	if v, err = cl.cmd.Result(); err != nil {
		n.reloadAfter(err)
		return nil, nil, n.errs(err)
	}
	return v, n.ackErr(acks), nil
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

func (n *node) Release(ctx context.Context, s *Spec, owner interface{}, want int, lease interface{}) (int64, error) {
	if want == 0 && lease == "0" && !isPosted(ctx) {
		// (A posted release cannot look at the Reply, nor HDEL keep the key
		// for WithMinHold: release.lua alone.)
		if s.Quick.calm() {
			return n.quickRelease(ctx, s, owner)
		}
		if n.handoff && !s.Records && s.Quick.hands() {
			return n.handRelease(ctx, s, owner)
		}
	}
	var v interface{}
	var err error
	if s.Records && n.Acked() && !isPosted(ctx) {
		cl := &call{s: s.Scripts.Release, keys: s.KeyArgs, args: []interface{}{owner, want, lease, n.pub(ctx)}, once: true}
		v, err = n.ackedCall(ctx, s, cl)
	} else {
		v, err = n.evalPooled(ctx, call{s: s.Scripts.Release, keys: s.KeyArgs, once: true}, owner, want, lease, n.pub(ctx))
	}
	if err != nil {
		return 0, err
	}
	res, err := wire.Int64(v)
	if res == wire.Handoff {
		s.Quick.Contended()
	}
	return res, err
}

func (n *node) Leave(ctx context.Context, s *Spec, owner interface{}, entry string) error {
	_, err := n.eval(ctx, s, s.Scripts.Leave, owner, entry, n.pub(ctx))
	return err
}

func (n *node) Refusal() <-chan struct{} { return n.dials.Refusal() }
func (n *node) Refused() error           { return n.dials.Refused() }

func (n *node) Grants() bool      { return true }
func (n *node) FreshOwners() bool { return false }
func (n *node) Acked() bool       { return n.ack.replicas > 0 }
func (n *node) Exact() bool       { return true }

func (n *node) Script(ctx context.Context, s *Spec, sc *Script, args ...interface{}) (interface{}, error) {
	if sc.Pub {
		args = append(args[:len(args):len(args)], n.pub(ctx))
	}
	if sc.Acked && n.Acked() {
		v, err := n.ackedCall(ctx, s, &call{s: sc, keys: s.KeyArgs, args: args})
		var f final
		if errors.As(err, &f) {
			// (Unlike a DistOnce's release, a write sent again that finds
			// itself done answers the same, and is acknowledged anew: the
			// shortfall is transient.)
			err = f.error
		}
		return v, err
	}
	return n.eval(ctx, s, sc, args...)
}

func (n *node) Get(ctx context.Context, keys ...interface{}) ([]interface{}, error) {
	if len(keys) != 2 {
		panic("remutex: node.get reads two keys") // (its one caller's: one pipelined pair)
	}
	first, second := &call{args: []interface{}{"get", keys[0]}}, &call{args: []interface{}{"get", keys[1]}}
	if err := n.batch.doPair(ctx, first, second); err != nil {
		return nil, err
	}
	vals := []interface{}{false, false}
	for i, cl := range []*call{first, second} {
		v, err := cl.cmd.Text()
		switch {
		case err == nil:
			vals[i] = v
		case errors.Is(err, redis.Nil):
		case IsReply(err):
			return nil, err
		default:
			n.reloadAfter(err)
			return nil, n.errs(err)
		}
	}
	return vals, nil
}

// RenewItem is one hold to renew: its lock's hash key, owner token and lease.
type RenewItem struct {
	Key          string
	Owner, Lease interface{}
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
func (n *node) Renew(ctx context.Context, items []RenewItem) []int64 {
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
		if n.Acked() {
			var err error
			if t, err = n.masterFor(ctx, items[b.idx[0]].Key); err != nil {
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
		acks := n.send(ctx, t, calls, n.Acked(), true)
		for _, b := range bs {
			n.collect(b, acks, res)
		}
	}
	return res
}

// renewBatches groups items by cluster slot, maxBatch to a call.
func (n *node) renewBatches(items []RenewItem) []renewBatch {
	groups := map[int][]int{}
	for i, it := range items {
		slot := 0
		if n.cluster {
			slot = wire.Slot(it.Key)
		}
		groups[slot] = append(groups[slot], i)
	}
	var out []renewBatch
	for _, g := range groups {
		for len(g) > 0 {
			k := min(len(g), maxBatch)
			cl := &call{s: RenewScript, keys: make([]interface{}, k), args: make([]interface{}, 0, 2*k)}
			for j, i := range g[:k] {
				cl.keys[j] = items[i].Key
				cl.args = append(cl.args, items[i].Owner, items[i].Lease)
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
