package remutex

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/remutex/remutex/internal/wire"
)

// Observe returns a channel that receives the election's leader now (if
// one leads) and then every change of leader or value, in order, until ctx
// ends or the Client closes; then it is closed. It never goes back to an
// older term. A reader slower than the changes may miss values that a later
// one of the same term replaced, but never a term: each term whose leader
// published appears at least once. (The log in Redis that an observer
// catches up from holds one record per term, for at least the latest 1000
// terms: an observer cut off from Redis while more than 1000 terms began
// misses the oldest of them. It can tell: it reports an error to the error
// handler and logs a warning, then goes on from the oldest term the log
// holds. See docs/guarantees.md.)
//
// Changes are pushed: the Client's pub/sub connection hears each one in a
// message that carries it (one message per Client however many observe),
// and an observer reads the log in Redis only when it missed one (after a
// reconnect, a failover, a moved slot). Where SUBSCRIBE is denied it reads
// the log every second instead. Errors it meets are reported to the error
// handler; a permanent one (a key of another type) closes the channel.
//
// One goroutine per call serves the channel; it ends, and the channel
// closes, once ctx is done (or the Client closed): read the channel until
// it closes, or cancel ctx, to let it go.
func (e *DistElection) Observe(ctx context.Context) <-chan Leader {
	c := e.client().m.c
	out := make(chan Leader)
	ob := &observer{kick: make(chan struct{}, 1)}
	c.observers.add(e.channel, ob)
	c.be.Watch(e.channel, true)
	go func() {
		defer close(out)
		defer c.observers.remove(e.channel, ob)
		defer c.be.Unwatch(e.channel)
		e.observe(ctx, ob, out)
	}()
	return out
}

// observer is one Observe's inbox: the messages dispatch hands it, and
// whether it must read the log (a message may have been missed).
type observer struct {
	mu    sync.Mutex
	inbox []string
	look  bool
	kick  chan struct{} // capacity 1: something arrived
}

func (ob *observer) post(payload string, look bool) {
	ob.mu.Lock()
	if look {
		ob.look = true
	} else {
		ob.inbox = append(ob.inbox, payload)
	}
	ob.mu.Unlock()
	select {
	case ob.kick <- struct{}{}:
	default:
	}
}

func (ob *observer) take() (msgs []string, look bool) {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	msgs, look = ob.inbox, ob.look
	ob.inbox, ob.look = nil, false
	return msgs, look
}

// observers are a Client's observers, by the channel they hear on. dispatch
// hands them the messages of their channels, and wakeAll tells them all to
// read the log, on the subscriber's reader goroutine: posting never blocks.
type observers struct {
	mu sync.Mutex
	by map[string][]*observer
}

func (o *observers) add(channel string, ob *observer) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by == nil {
		o.by = make(map[string][]*observer)
	}
	o.by[channel] = append(o.by[channel], ob)
}

func (o *observers) remove(channel string, ob *observer) {
	o.mu.Lock()
	defer o.mu.Unlock()
	list := o.by[channel]
	for i, x := range list {
		if x == ob {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(o.by, channel)
	} else {
		o.by[channel] = list
	}
}

// tell hands payload to the observers of channel.
func (o *observers) tell(channel, payload string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ob := range o.by[channel] {
		ob.post(payload, false)
	}
}

// wakeAll makes every observer read the log: messages may have been missed.
func (o *observers) wakeAll() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, list := range o.by {
		for _, ob := range list {
			ob.post("", true)
		}
	}
}

// observation is the state of one Observe: the last record's ID it took,
// and the leaders not yet sent, at most one per term.
type observation struct {
	last    wire.LeaderID
	pending []Leader
}

// add queues rec unless it is not newer than the last one taken; a record
// of the term last queued replaces it (a slow reader sees the latest value
// of each term).
func (s *observation) add(rec *wire.LeaderRecord) {
	if !s.last.Less(rec.ID) {
		return
	}
	s.last = rec.ID
	l := leaderOf(rec)
	if n := len(s.pending); n > 0 && s.pending[n-1].Term == l.Term {
		s.pending[n-1] = l
		return
	}
	s.pending = append(s.pending, l)
}

// observe serves one Observe until ctx ends or the Client closes: it reads
// the leader now, then takes the messages posted to ob, and reads the log
// whenever one may have been missed.
func (e *DistElection) observe(ctx context.Context, ob *observer, out chan<- Leader) {
	c := e.m.c
	if !e.subscribed(ctx) {
		return
	}
	var tick <-chan time.Time
	if c.be.Polling() {
		poll := time.NewTicker(time.Second)
		defer poll.Stop()
		tick = poll.C
	}
	var s observation
	var bo backoff
	var retry <-chan time.Time
	started, look := false, true
	for {
		if look && retry == nil {
			switch err := e.look(ctx, &s, started); {
			case err == nil:
				started, look, bo = true, false, backoff{}
			case !e.observeFailed(ctx, err):
				return
			default:
				retry = time.After(bo.Next())
			}
		}
		var send chan<- Leader
		var next Leader
		if len(s.pending) > 0 {
			send, next = out, s.pending[0]
		}
		select {
		case send <- next:
			s.pending = s.pending[1:]
		case <-ob.kick:
			// (Before the first read, that read covers them.)
			msgs, wake := ob.take()
			look = look || started && (wake || s.apply(msgs))
		case <-retry:
			retry = nil
		case <-tick:
			look = true
		case <-ctx.Done():
			return
		case <-c.closing:
			return
		}
	}
}

// look reads the leader now (before the observer started) or the records
// logged since the last one taken.
func (e *DistElection) look(ctx context.Context, s *observation, started bool) error {
	if started {
		return e.catchUp(ctx, s)
	}
	live, rec, err := e.current(ctx)
	if err == nil && rec != nil {
		s.last = rec.ID
		if live {
			s.pending = append(s.pending, leaderOf(rec))
		}
	}
	return err
}

// apply takes the messages msgs in order and reports whether one showed
// that another was missed (its previous record is not the last one taken):
// the log must be read.
func (s *observation) apply(msgs []string) (missed bool) {
	for _, m := range msgs {
		prev, rec, ok := wire.ParseLeaderMessage(m)
		switch {
		case !ok || !s.last.Less(rec.ID):
		case prev != s.last:
			return true // (the log has this one, and those after it)
		default:
			s.add(&rec)
		}
	}
	return false
}

// catchUp reads the records logged after the last one taken. If the log
// no longer reaches back to the last term taken (its oldest entry is of a
// later term: the terms between were trimmed, or the log was lost), terms
// may have been missed: it says so, and goes on from the oldest.
func (e *DistElection) catchUp(ctx context.Context, s *observation) error {
	for {
		v, err := e.call(ctx, electScript, "r", s.last.String())
		if err != nil {
			return err
		}
		reply, _ := v.([]interface{})
		if len(reply) == 0 {
			return fmt.Errorf("remutex: unexpected reply of elect.lua: %v", v)
		}
		oldest, _ := reply[0].(string)
		if first, ok := wire.ParseLeaderID(oldest); ok && s.last.Term > 0 && first.Term > s.last.Term {
			e.termsDropped(s.last, first)
		}
		recs := reply[1:]
		for _, r := range recs {
			str, _ := r.(string)
			if rec, ok := wire.ParseLeaderRecord(str); ok {
				s.add(&rec)
			}
		}
		if len(recs) < 256 {
			return nil
		}
	}
}

// termsDropped reports that an observer whose last record was last found
// the log beginning at the later term of oldest: terms between may have
// been missed.
func (e *DistElection) termsDropped(last, oldest wire.LeaderID) {
	c := e.m.c
	err := fmt.Errorf("%w: the log begins at term %d, after the last term observed (%d)", errTermsDropped, oldest.Term, last.Term)
	c.log.Warn("remutex: an observer may have missed terms", "election", e.m.spec.name, "last", last.Term, "oldest", oldest.Term)
	c.report(e.wrap("observe", err))
}

// errTermsDropped is what an observer reports when the log no longer holds
// the terms after the last one it saw (see DistElection.Observe).
var errTermsDropped = errors.New("remutex: terms may have been missed")

// subscribed waits until the changes channel is subscribed, asking again
// while no subscription could be made (the server unreachable). It reports
// false if ctx ended or the Client closed first.
func (e *DistElection) subscribed(ctx context.Context) bool {
	c := e.m.c
	var bo backoff
	for {
		t := time.NewTimer(bo.Next())
		select {
		case <-c.be.Ready(e.channel):
			t.Stop()
			return true
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		case <-c.closing:
			t.Stop()
			return false
		}
	}
}

// observeFailed reports an error an observer met and whether it goes on
// (after a backoff step): not after ctx ended or the Client closed, nor
// after a permanent error.
func (e *DistElection) observeFailed(ctx context.Context, err error) bool {
	c := e.m.c
	if c.isClosed() || ctx.Err() != nil {
		return false
	}
	c.report(e.wrap("observe", err))
	return transient(err)
}
