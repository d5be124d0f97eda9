package transport

import "github.com/redis/go-redis/v9"

// Probes of a node's state, for the root package's tests of the engine
// over it. Each takes the backend NewNode returned.

// QueuedCall is a call waiting in a node's queue: its script (nil for a
// plain command), keys and arguments.
type QueuedCall struct {
	Script     *Script
	Keys, Args []interface{}
}

// Queued returns the calls waiting in b's queue: only those whose callers
// still wait, or with all every one (some given up, or posted).
func Queued(b Backend, all bool) []QueuedCall {
	bt := &b.(*node).batch
	bt.mu.Lock()
	defer bt.mu.Unlock()
	var out []QueuedCall
	for _, p := range bt.queue {
		if all || p.state == pendQueued {
			out = append(out, QueuedCall{Script: p.cl.s, Keys: p.cl.keys, Args: p.cl.args})
		}
	}
	return out
}

// Idle reports whether b has no call in flight or queued (posted calls
// included).
func Idle(b Backend) bool {
	bt := &b.(*node).batch
	bt.mu.Lock()
	defer bt.mu.Unlock()
	return !bt.drainer && bt.alone == 0 && len(bt.queue) == 0
}

// Confirmed reports whether the server confirmed b's subscription of
// channel.
func Confirmed(b Backend, channel string) bool {
	s := &b.(*node).subscriber
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.chans[channel]
	return e != nil && e.confirmed
}

// Redis returns b's redis client.
func Redis(b Backend) redis.UniversalClient { return b.(*node).rdb }
