package remutex

// Delivery: the engine's side of pub/sub. A node's subscriber reads the
// messages of every lock its Client waits for and hands each to dispatch,
// on its reader goroutine; dispatch finds the local waiter the message names
// and signals it.

import (
	"strconv"
	"strings"
	"time"
)

func (c *Client) done() <-chan struct{} { return c.closing }

// dispatch hands a message on the Client's channel of a lock to the local
// waiter it names:
//
//	"w <entry>"           a quorum's: the lock is free, entry may take it
//	"g <fence> <entry>"   a single server's: the lock was handed to entry
//	"o <outcome>\n<entry> <entry> ..."
//	                      a DistOnce's run ended with outcome, and the
//	                      entries, which waited for it, left the queue
//	                      (see tellOutcome)
//
// A message for an entry without a local waiter is kept a while, for a
// waiter whose call queued it but has not returned yet (see
// keepEarlyLocked); a wake-up also goes to the lock's first local waiter.
// Otherwise the message is moot: its waiter left the queue with a leave call
// that also released a grant, or learnt of it from its own call.
func (c *Client) dispatch(channel, payload string) {
	key, ok := strings.CutSuffix(channel, releasedInfix+c.id)
	if !ok {
		return
	}
	kind, rest, _ := strings.Cut(payload, " ")
	if kind == "o" {
		c.tellOutcome(key, rest)
		return
	}
	var g grant
	if kind == "g" {
		f, entry, ok := strings.Cut(rest, " ")
		if !ok {
			return
		}
		g.fence, _ = strconv.ParseInt(f, 10, 64)
		rest = entry
	}
	wait, at, ok := parseGrantEntry(rest)
	if !ok {
		return
	}
	g.at = at
	granted := kind == "g"
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stateOfLocked(key)
	for _, w := range st.waiters {
		if w.key == wait {
			// (Of two grants of one wait, the later entry's is valid longer.)
			if granted && (!w.granted || g.at > w.grant.at) {
				w.granted, w.grant = true, g
			}
			w.signal()
			return
		}
	}
	// The entry's waiter may not be registered yet: its call, which queued
	// it, can return after the message came.
	st.keepEarlyLocked(early{key: wait, granted: granted, grant: g, at: time.Now()})
	if kind == "w" && len(st.waiters) > 0 {
		st.waiters[0].signal()
	}
}

// tellOutcome hands the outcome of a DistOnce's run ("d" or "e<record>",
// see once_release.lua) to the local waiters of the entries the run's final
// release named: each of them returns from its Do with it, without a call.
// The release removed the entries, so a waiter that does not hear it finds
// its entry gone at its next call, and then the outcome in Redis.
func (c *Client) tellOutcome(key, msg string) {
	outcome, entries, ok := strings.Cut(msg, "\n")
	if !ok || outcome == "" {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stateOfLocked(key)
next:
	for _, e := range strings.Split(entries, " ") {
		wait, _, ok := parseGrantEntry(e)
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
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.locks {
		for _, w := range st.waiters {
			w.signal()
		}
	}
}
