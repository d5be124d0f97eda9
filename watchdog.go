package remutex

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// watchdog renews every hold of a Client. One goroutine does it, started with
// the first hold and stopped and joined by Close; it keeps no goroutine or
// timer per lock. Holds that are due are renewed together: one script call per
// cluster slot (one in all on a single node), sent in one pipeline. The
// pipeline runs in a helper goroutine the watchdog owns, so that a reply that
// never comes cannot keep the watchdog from declaring holds lost when their
// validity deadline passes.
//
// A hold is valid until the send time of its last successful acquire or
// renewal plus its lease minus a drift margin. A renewal whose reply arrives
// after that counts as failed. A renewal that finds another owner loses the
// hold at once; failed renewals are retried sooner, and when the deadline
// passes without success the hold is lost.
type watchdog struct {
	c       *Client
	holds   map[*hold]struct{} // guarded by c.mu
	started bool               // guarded by c.mu
	wake    time.Time          // when the goroutine looks next; guarded by c.mu
	timer   *time.Timer        // fires at wake; reset under c.mu
	quit    chan struct{}
	done    chan struct{}
}

// maxBatch bounds the keys of one renewal script call, so that the server is
// never busy for long in one script.
const maxBatch = 500

// addLocked starts tracking h, starting the goroutine on first use.
func (w *watchdog) addLocked(h *hold) {
	if w.holds == nil {
		w.holds = make(map[*hold]struct{})
		w.timer = time.NewTimer(time.Hour)
		w.quit = make(chan struct{})
		w.done = make(chan struct{})
	}
	w.holds[h] = struct{}{}
	if !w.started {
		w.started = true
		go w.run()
	}
	// Bring the goroutine's wake-up forward only if it would look too late
	// for h. Moving its timer does not wake it: a Lock+Unlock cycle does not
	// cost a goroutine switch, and taking many locks not a scan of every
	// hold each.
	if t := earliest(h.next, h.valid); w.wake.IsZero() || t.Before(w.wake) {
		w.wake = t
		w.timer.Reset(time.Until(t))
	}
}

// renewWindow is how early a hold may be renewed: when one hold is due, every
// hold past half its renewal interval goes along, so that holds taken at
// different moments come to share one round trip per interval.
func renewWindow(h *hold) time.Duration { return h.m.lease / 6 }

func (w *watchdog) removeLocked(h *hold) {
	delete(w.holds, h)
}

// loseAllLocked marks every tracked hold lost (Close) and returns the notices.
func (w *watchdog) loseAllLocked(cause error) (lost []notice) {
	for h := range w.holds {
		lost = append(lost, w.c.loseLocked(h, cause)...)
	}
	return lost
}

// stop ends the goroutine and waits for it (and any renewal in flight).
func (w *watchdog) stop() {
	w.c.mu.Lock()
	started := w.started
	w.c.mu.Unlock()
	if started {
		close(w.quit)
		<-w.done
	}
}

type renewal struct {
	holds []*hold
	sent  time.Time
	res   []int64 // per hold: 1 renewed, 0 not ours, -1 failed
}

func (w *watchdog) run() {
	defer close(w.done)
	defer w.timer.Stop()
	var inflight chan *renewal
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for {
		due, lost := w.scan(inflight != nil)
		w.c.announce(lost)
		if len(due) > 0 {
			inflight = make(chan *renewal, 1)
			go w.renew(ctx, due, inflight)
		}
		select {
		case <-w.timer.C:
		case r := <-inflight:
			inflight = nil
			w.c.announce(w.apply(r))
		case <-w.quit:
			cancel()
			if inflight != nil {
				<-inflight
			}
			return
		}
	}
}

// scan loses the holds past their deadline, picks the holds due for renewal
// (unless a renewal is in flight) and sets the timer for the next look.
func (w *watchdog) scan(busy bool) (due []*hold, lost []notice) {
	c := w.c
	now := time.Now()
	wake := now.Add(time.Hour)
	var (
		near     []*hold // holds within their renewal window
		nearWake = wake
		anyDue   bool
	)
	c.mu.Lock()
	defer c.mu.Unlock()
	for h := range w.holds {
		if !now.Before(h.valid) {
			cause := errExpired
			if !h.m.renew {
				cause = errLeaseEnded
			}
			lost = append(lost, c.loseLocked(h, cause)...)
			continue
		}
		wake = earliest(wake, h.valid)
		if !h.m.renew || h.inBatch || h.ending || busy {
			// A renewal in flight wakes the loop when it ends. A hold whose
			// final release is in flight needs none: the reply would be moot,
			// and the hold would be sent again after each moot reply.
			continue
		}
		if now.Before(h.next.Add(-renewWindow(h))) {
			wake = earliest(wake, h.next)
			continue
		}
		// Within its window: renewed now if some hold is due.
		near = append(near, h)
		nearWake = earliest(nearWake, h.next)
		anyDue = anyDue || !now.Before(h.next)
	}
	if anyDue {
		for _, h := range near {
			h.inBatch = true
		}
		due = near
	} else {
		wake = earliest(wake, nearWake)
	}
	w.wake = wake
	w.timer.Reset(time.Until(wake))
	return due, lost
}

var errLeaseEnded = errors.New("the fixed lease ran out (WithoutRenewal)")

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// renew sends one pipelined round trip per server renewing holds, and passes
// the outcome back.
func (w *watchdog) renew(ctx context.Context, holds []*hold, out chan<- *renewal) {
	c := w.c
	r := &renewal{holds: holds, sent: time.Now()}
	// A reply later than the earliest deadline is useless: stop waiting then.
	deadline := holds[0].valid
	items := make([]renewItem, len(holds))
	c.mu.Lock()
	for i, h := range holds {
		deadline = earliest(deadline, h.valid)
		items[i] = renewItem{key: h.m.k.hash(), owner: h.ownerArg, lease: h.m.leaseArg}
	}
	c.mu.Unlock()
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	r.res = c.renew(ctx, items)
	out <- r
}

// renewItem is one hold to renew: its lock's hash key, owner token and lease.
type renewItem struct {
	key          string
	owner, lease interface{}
}

// renew renews items on this node: one script call per cluster slot (one in
// all on a single server, at most maxBatch keys each), in one pipeline per
// server. Results per item: 1 renewed, 0 not ours, -1 failed.
func (n *node) renew(ctx context.Context, items []renewItem) []int64 {
	c := n.c
	res := make([]int64, len(items))
	groups := map[int][]int{}
	for i, it := range items {
		slot := 0
		if n.cluster {
			slot = keySlot(it.key)
		}
		groups[slot] = append(groups[slot], i)
	}
	type call struct {
		idx  []int
		keys []string
		args []interface{}
		cmd  *redis.Cmd
		acks *redis.IntCmd // WithReplicaAck: the WAIT after this call's pipeline
	}
	var calls []*call
	for _, g := range groups {
		for len(g) > 0 {
			k := min(len(g), maxBatch)
			cl := &call{idx: g[:k], keys: make([]string, k), args: make([]interface{}, 0, 2*k)}
			for j, i := range g[:k] {
				cl.keys[j] = items[i].key
				cl.args = append(cl.args, items[i].owner, items[i].lease)
			}
			calls = append(calls, cl)
			g = g[k:]
		}
	}
	// One pipeline per server: with WithReplicaAck its WAIT must share the
	// connection of the writes it waits for. Without it, everything goes in
	// one pipeline (go-redis splits a cluster pipeline by node).
	byTarget := map[redis.Cmdable][]*call{}
	for _, cl := range calls {
		target := redis.Cmdable(n.rdb)
		if c.ackReplicas > 0 {
			var err error
			if target, err = n.nodeFor(ctx, cl.keys[0]); err != nil {
				cl.cmd = redis.NewCmd(ctx)
				cl.cmd.SetErr(err)
				continue
			}
		}
		byTarget[target] = append(byTarget[target], cl)
	}
	run := func(eval bool) {
		for target, cls := range byTarget {
			pipe := target.Pipeline()
			for _, cl := range cls {
				if eval {
					cl.cmd = renewScript.Eval(ctx, pipe, cl.keys, cl.args...)
				} else {
					cl.cmd = renewScript.EvalSha(ctx, pipe, cl.keys, cl.args...)
				}
			}
			if c.ackReplicas > 0 {
				acks := redis.NewIntCmd(ctx, "wait", c.ackReplicas, c.ackTimeout.Milliseconds())
				_ = pipe.Process(ctx, acks)
				for _, cl := range cls {
					cl.acks = acks
				}
			}
			_, _ = pipe.Exec(ctx)
		}
	}
	run(false)
	for _, cl := range calls {
		if redis.HasErrorPrefix(cl.cmd.Err(), "NOSCRIPT") {
			run(true) // the server lost its scripts (SCRIPT FLUSH, restart)
			break
		}
	}
	for _, cl := range calls {
		vals, err := cl.cmd.Slice()
		if err == nil && cl.acks != nil {
			if got, aerr := cl.acks.Result(); aerr != nil || got < int64(c.ackReplicas) {
				err = fmt.Errorf("%w: %d of %d within %v", ErrTooFewReplicas, got, c.ackReplicas, c.ackTimeout)
			}
		}
		for j, i := range cl.idx {
			res[i] = -1
			if err == nil && j < len(vals) {
				if v, ok := vals[j].(int64); ok {
					res[i] = v
				}
			}
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			c.log.Warn("remutex: renewal failed", "locks", len(cl.idx), "err", err)
		}
	}
	return res
}

// apply records the outcome of a renewal round trip.
func (w *watchdog) apply(r *renewal) (news []notice) {
	c := w.c
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, h := range r.holds {
		h.inBatch = false
		if _, ok := w.holds[h]; !ok || h.ending {
			continue // unlocked, being unlocked, or lost meanwhile
		}
		switch {
		case r.res[i] == 0:
			news = append(news, c.loseLocked(h, errDenied)...)
		case r.res[i] == 1 && now.Before(h.valid):
			h.valid = r.sent.Add(validity(h.m.lease))
			h.next = r.sent.Add(h.m.lease / 3)
			if c.hook != nil {
				news = append(news, notice{ev: h.event(EventRenewed, now.Sub(r.sent), nil)})
			}
		default:
			// Failed or too late: try again soon; scan loses the hold when
			// its deadline passes first.
			h.next = now.Add(max(h.m.lease/12, 5*time.Millisecond))
		}
	}
	return news
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
