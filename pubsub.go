package remutex

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// subscriber is a Client's single pub/sub connection. Waiters register on a
// lock's channel (reference counted); a channel stays subscribed for a short
// while after its last waiter leaves, so that a busy lock is not subscribed
// and unsubscribed on every hand-off. One goroutine reads the connection and
// hands each message to the waiter it concerns: the head local waiter for a
// release, the named waiter for a grant from the queue.
//
// When SUBSCRIBE is denied (ACL NOPERM) waiters fall back to polling with
// bounded backoff; this is logged once.
type subscriber struct {
	c       *Client
	mu      sync.Mutex
	ps      *redis.PubSub
	started bool
	closed  bool
	denied  bool
	chans   map[string]*subEntry
	done    chan struct{}
}

type subEntry struct {
	refs      int
	ready     chan struct{} // closed once the server confirmed the subscription
	confirmed bool
	idleSince time.Time // when refs last dropped to 0
}

// acquire registers interest in channel and returns a channel that is closed
// once messages on it are delivered (at once when subscriptions are denied).
func (s *subscriber) acquire(channel string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.denied {
		return closedChan
	}
	if e := s.chans[channel]; e != nil {
		e.refs++
		return e.ready
	}
	if !s.started {
		s.started = true
		s.chans = make(map[string]*subEntry)
		s.done = make(chan struct{})
		s.ps = s.c.rdb.Subscribe(context.Background())
		go s.run(s.ps)
	}
	e := &subEntry{refs: 1, ready: make(chan struct{})}
	s.chans[channel] = e
	// Sent under s.mu so that subscribes and unsubscribes of one channel reach
	// the server in the order they were decided. An error is not final: the
	// channel is recorded and subscribed again when the reader reconnects.
	if err := s.ps.Subscribe(context.Background(), channel); err != nil {
		s.c.log.Debug("remutex: subscribe failed, will retry on reconnect", "channel", channel, "err", err)
	}
	return e.ready
}

// release drops a waiter's interest in channel.
func (s *subscriber) release(channel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.chans[channel]; e != nil {
		e.refs--
		if e.refs == 0 {
			e.idleSince = time.Now()
		}
	}
}

// polling reports whether waiters must poll because SUBSCRIBE was denied.
func (s *subscriber) polling() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.denied
}

// close stops the reader and waits for it.
func (s *subscriber) close() {
	s.mu.Lock()
	s.closed = true
	started := s.started
	if started {
		_ = s.ps.Close()
	}
	s.mu.Unlock()
	if started {
		<-s.done
	}
}

func (s *subscriber) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *subscriber) run(ps *redis.PubSub) {
	defer close(s.done)
	var bo backoff
	for {
		msg, err := ps.ReceiveTimeout(context.Background(), s.sweep())
		if err != nil {
			if s.isClosed() {
				return
			}
			var nerr net.Error
			if errors.As(err, &nerr) && nerr.Timeout() {
				continue // the sweep's tick, or a quiet connection
			}
			if redis.HasErrorPrefix(err, "NOPERM") {
				s.deny(err)
				continue
			}
			// The connection broke; go-redis reconnects and subscribes again
			// on the next receive. Messages may have been missed meanwhile:
			// every waiter looks again.
			s.c.wakeAll()
			t := time.NewTimer(bo.next())
			select {
			case <-t.C:
			case <-s.c.closing:
			}
			t.Stop()
			continue
		}
		bo = backoff{}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				s.confirm(m.Channel)
			}
		case *redis.Message:
			s.c.dispatch(m.Channel, m.Payload)
		}
	}
}

// sweep unsubscribes channels that lingered out and returns how long the
// reader may block: a tick while any channel is subscribed, else forever.
func (s *subscriber) sweep() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for ch, e := range s.chans {
		if e.refs == 0 && now.Sub(e.idleSince) >= linger {
			delete(s.chans, ch)
			if err := s.ps.Unsubscribe(context.Background(), ch); err != nil {
				s.c.log.Debug("remutex: unsubscribe failed", "channel", ch, "err", err)
			}
		}
	}
	if len(s.chans) > 0 {
		return linger / 2
	}
	return 0
}

func (s *subscriber) confirm(channel string) {
	s.mu.Lock()
	e := s.chans[channel]
	again := e != nil && e.confirmed
	if e != nil && !e.confirmed {
		e.confirmed = true
		close(e.ready)
	}
	s.mu.Unlock()
	if again {
		// Subscribed again after a reconnect: a release may have been missed.
		s.c.wakeAll()
	}
}

// deny switches the Client to polling after SUBSCRIBE was refused.
func (s *subscriber) deny(err error) {
	s.mu.Lock()
	first := !s.denied
	s.denied = true
	for _, e := range s.chans {
		if !e.confirmed {
			e.confirmed = true
			close(e.ready)
		}
	}
	s.mu.Unlock()
	if first {
		s.c.log.Warn("remutex: SUBSCRIBE denied; waiters poll with backoff instead", "err", err)
	}
}

// dispatch hands a message on a lock's channel to its local waiters.
//
//	"r"                   released in normal mode: wake the head waiter
//	"g <fence> <entry>"   the queue granted the lock to entry
func (c *Client) dispatch(channel, payload string) {
	key, ok := strings.CutSuffix(channel, ":released")
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.locks[key]
	if st == nil {
		return
	}
	if payload == "r" {
		st.wakeHeadLocked()
		return
	}
	rest, ok := strings.CutPrefix(payload, "g ")
	if !ok {
		return
	}
	f, entry, ok := strings.Cut(rest, " ")
	if !ok {
		return
	}
	for _, w := range st.waiters {
		if w.entry == entry {
			fence, _ := strconv.ParseInt(f, 10, 64)
			w.granted, w.fence = true, fence
			w.signal()
			return
		}
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
