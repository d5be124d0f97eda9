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

// subscriber owns the Client's pub/sub connections: one in all, or on a
// Redis 7 cluster, where release messages use sharded pub/sub (SPUBLISH), one
// per master node that serves a lock being waited on. Waiters register on a
// lock's channel (reference counted); a channel stays subscribed for a short
// while after its last waiter leaves, so that a busy lock is not subscribed
// and unsubscribed on every hand-off. One goroutine per connection reads it
// and hands each message to the waiter it concerns: the head local waiter for
// a release, the named waiter for a grant from the queue.
//
// When a cluster moves a slot, the server drops the shard channels of that
// slot; the reader then subscribes them again on the slot's new master and
// wakes their waiters. When SUBSCRIBE is denied (ACL NOPERM), waiters fall
// back to polling with bounded backoff; this is logged once.
type subscriber struct {
	c       *Client // whose waiters hear the messages
	n       *node   // whose server the connections go to
	mu      sync.Mutex
	closed  bool
	denied  bool
	chans   map[string]*subEntry
	conns   map[string]*psConn // by node address; "" for the one unsharded connection
	readers sync.WaitGroup
}

// psConn is one pub/sub connection and its reader.
type psConn struct {
	addr    string
	ps      *redis.PubSub
	sharded bool
}

type subEntry struct {
	refs      int
	conn      *psConn       // nil while no connection could be had: retried by waiters
	ready     chan struct{} // closed once the server confirmed the subscription
	confirmed bool
	idleSince time.Time // when refs last dropped to 0
}

// acquire registers interest in channel.
func (s *subscriber) acquire(channel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.chans == nil {
		s.chans = make(map[string]*subEntry)
		s.conns = make(map[string]*psConn)
	}
	e := s.chans[channel]
	if e == nil {
		e = &subEntry{ready: make(chan struct{})}
		s.chans[channel] = e
		if s.denied {
			e.confirmed = true
			close(e.ready)
		}
	}
	e.refs++
	if !e.confirmed && e.conn == nil {
		s.subscribeLocked(channel, e)
	}
}

// ready returns a channel that is closed once messages on channel are
// delivered (at once when subscriptions are denied). A waiter asks again each
// time it looks, so that a subscription that could not be made yet (cluster
// unreachable) is retried.
func (s *subscriber) ready(channel string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.chans[channel]
	if e == nil || s.closed {
		return closedChan
	}
	if !e.confirmed && e.conn == nil {
		s.subscribeLocked(channel, e)
	}
	return e.ready
}

// subscribeLocked sends the subscription for e on the connection serving
// channel. It is sent under s.mu so that subscribes and unsubscribes of one
// channel reach the server in the order they were decided. An error on an
// existing connection is not final: go-redis records the channel and
// subscribes it again when the reader reconnects.
func (s *subscriber) subscribeLocked(channel string, e *subEntry) {
	conn, err := s.connLocked(channel)
	if err != nil {
		s.c.log.Debug("remutex: no pub/sub connection yet", "channel", channel, "err", err)
		return
	}
	e.conn = conn
	if conn.sharded {
		err = conn.ps.SSubscribe(context.Background(), channel)
	} else {
		err = conn.ps.Subscribe(context.Background(), channel)
	}
	if err != nil {
		s.c.log.Debug("remutex: subscribe failed, retried on reconnect", "channel", channel, "err", err)
	}
}

// connLocked returns the connection for channel, creating it and its reader.
func (s *subscriber) connLocked(channel string) (*psConn, error) {
	ctx := context.Background()
	sharded := s.n.sharded(ctx)
	addr := ""
	var node *redis.Client
	if sharded {
		cc := s.n.rdb.(*redis.ClusterClient)
		var err error
		if node, err = cc.MasterForKey(ctx, channel); err != nil {
			return nil, err
		}
		addr = node.Options().Addr
	}
	if conn := s.conns[addr]; conn != nil {
		return conn, nil
	}
	conn := &psConn{addr: addr, sharded: sharded}
	if sharded {
		conn.ps = node.SSubscribe(ctx)
	} else {
		conn.ps = s.n.rdb.Subscribe(ctx)
	}
	s.conns[addr] = conn
	s.readers.Add(1)
	go s.run(conn)
	return conn, nil
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

// close stops the readers and waits for them.
func (s *subscriber) close() {
	s.mu.Lock()
	s.closed = true
	for _, conn := range s.conns {
		_ = conn.ps.Close()
	}
	s.mu.Unlock()
	s.readers.Wait()
}

func (s *subscriber) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *subscriber) run(conn *psConn) {
	defer s.readers.Done()
	var bo backoff
	for {
		msg, err := conn.ps.ReceiveTimeout(context.Background(), s.sweep(conn))
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
			switch m.Kind {
			case "subscribe", "ssubscribe":
				s.confirm(m.Channel)
			case "sunsubscribe":
				s.moved(conn, m.Channel)
			}
		case *redis.Message:
			s.c.dispatch(m.Channel, m.Payload)
		}
	}
}

// sweep unsubscribes the connection's channels that lingered out and returns
// how long its reader may block: a tick while it has channels, else forever.
func (s *subscriber) sweep(conn *psConn) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	busy := false
	for ch, e := range s.chans {
		if e.conn != conn {
			continue
		}
		if e.refs > 0 || now.Sub(e.idleSince) < linger {
			busy = true
			continue
		}
		delete(s.chans, ch)
		var err error
		if conn.sharded {
			err = conn.ps.SUnsubscribe(context.Background(), ch)
		} else {
			err = conn.ps.Unsubscribe(context.Background(), ch)
		}
		if err != nil {
			s.c.log.Debug("remutex: unsubscribe failed", "channel", ch, "err", err)
		}
	}
	if busy {
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

// moved handles a shard channel the server dropped without being asked: its
// slot moved to another master. The channel is subscribed again there, and
// its waiters look again, since a release may have been missed.
func (s *subscriber) moved(conn *psConn, channel string) {
	s.mu.Lock()
	e := s.chans[channel]
	if e == nil || e.conn != conn || !e.confirmed {
		s.mu.Unlock()
		return // our own unsubscribe, or a subscription already redone
	}
	_ = conn.ps.SUnsubscribe(context.Background(), channel) // forget it locally
	if cc, ok := s.n.rdb.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
	e.conn, e.confirmed, e.ready = nil, false, make(chan struct{})
	s.subscribeLocked(channel, e)
	s.mu.Unlock()
	s.c.wakeAll()
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

// sharded reports whether release messages use sharded pub/sub: on a
// ClusterClient whose servers are Redis 7 or later. It is decided once, with
// the Client's first lock operation.
func (n *node) sharded(ctx context.Context) bool {
	n.shardOnce.Do(func() {
		cc, ok := n.rdb.(*redis.ClusterClient)
		if !ok {
			return
		}
		info, err := cc.Info(ctx, "server").Result()
		if err != nil {
			n.c.log.Warn("remutex: cannot tell the cluster's Redis version; using classic pub/sub", "err", err)
			return
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				major, _, _ := strings.Cut(v, ".")
				if v, err := strconv.Atoi(major); err == nil && v >= 7 {
					n.shardPub = true
					n.publish = "spublish"
				}
				break
			}
		}
	})
	return n.shardPub
}
