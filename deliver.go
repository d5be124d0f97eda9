package remutex

// Delivery: the engine's side of pub/sub. A node's subscriber reads the
// messages of every lock its Client waits for and hands each to dispatch,
// on its reader goroutine; dispatch finds the local waiter the message names
// and signals it.

import (
	"strings"
	"time"

	"github.com/remutex/remutex/internal/wire"
)

// listener is the Client as its backend's subscriptions see it (see
// transport.Listener).
type listener Client

func (l *listener) Dispatch(channel, payload string) { (*Client)(l).dispatch(channel, payload) }
func (l *listener) WakeAll()                         { (*Client)(l).wakeAll() }
func (l *listener) Done() <-chan struct{}            { return l.closing }

// dispatch hands a message on the Client's channel of a lock (see
// wire.Message) to the local waiter it names: a grant, a wake-up, or the
// outcome of a DistOnce's run (see tellOutcome).
//
// A message for an entry without a local waiter is kept a while, for a
// waiter whose call queued it but has not returned yet (see
// keepEarlyLocked); a wake-up also goes to the lock's first local waiter.
// Otherwise the message is moot: its waiter left the queue with a leave call
// that also released a grant, or learnt of it from its own call.
func (c *Client) dispatch(channel, payload string) {
	// (In two cuts: the suffix joined would be built for every message.)
	key, ok := strings.CutSuffix(channel, c.id)
	if ok {
		key, ok = strings.CutSuffix(key, wire.ReleasedInfix)
	}
	if !ok {
		c.observers.tell(channel, payload) // an election's changes
		return
	}
	msg, ok := wire.ParseMessage(payload)
	switch {
	case !ok:
		return
	case msg.Kind == "o":
		c.tellOutcome(key, msg.Outcome, msg.Entries)
		return
	}
	g, granted := grant{fence: msg.Fence, at: msg.At}, msg.Grant()
	c.mu.Lock()
	st := c.stateOfLocked(key)
	for _, w := range st.waiters {
		if w.key == msg.Wait {
			// (Of two grants of one wait, the later entry's is valid longer.)
			if granted && (!w.granted || g.at > w.grant.at) {
				w.granted, w.grant = true, g
			}
			c.mu.Unlock()
			// Signalled once c.mu is free: the waiter takes it first thing.
			w.signal()
			return
		}
	}
	// The entry's waiter may not be registered yet: its call, which queued
	// it, can return after the message came.
	st.keepEarlyLocked(early{key: msg.Wait, granted: granted, grant: g, at: time.Now()})
	if msg.Kind == "w" && len(st.waiters) > 0 {
		st.waiters[0].signal()
	}
	c.mu.Unlock()
}

// tellOutcome hands the outcome of a DistOnce's run ("d" or "e<record>",
// see once_release.lua) to the local waiters of the entries the run's final
// release named: each of them returns from its Do with it, without a call.
// The release removed the entries, so a waiter that does not hear it finds
// its entry gone at its next call, and then the outcome in Redis.
func (c *Client) tellOutcome(key, outcome, entries string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stateOfLocked(key)
next:
	for _, e := range strings.Split(entries, " ") {
		wait, _, ok := wire.ParseEntry(e)
		if !ok {
			continue
		}
		for _, w := range st.waiters {
			if w.key == wait {
				w.told = outcome
				w.signal()
				continue next
			}
		}
		// (Its call, which queued it, may not have returned yet.)
		st.keepEarlyLocked(early{key: wait, told: outcome, at: now})
	}
}

// wakeAll makes every waiter of the Client look again.
func (c *Client) wakeAll() {
	c.observers.wakeAll()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.locks {
		for _, w := range st.waiters {
			w.signal()
		}
	}
}
