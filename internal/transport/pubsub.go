package transport

import (
	"context"
	"errors"
	"net"
	"runtime"
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
// (Un)subscriptions are sent by a second goroutine per connection, in the
// order they were decided, never by a waiter and never under the
// subscriber's mutex: a server that does not answer (paused, or a
// partitioned quorum member) holds up nothing but its own connection.
//
// When a cluster moves a slot, the server drops the shard channels of that
// slot; the reader then subscribes them again on the slot's new master and
// wakes their waiters. A subscription that a master refuses with MOVED (the
// cluster client's view of the slots was out of date) is sent again where
// the slot lives. When SUBSCRIBE is denied (ACL NOPERM), waiters fall back
// to polling with bounded backoff; this is logged once.
type subscriber struct {
	to      Listener // whose waiters hear the messages
	n       *node    // whose server the connections go to
	mu      sync.Mutex
	closed  bool
	denied  bool
	chans   map[string]*subEntry
	conns   map[string]*psConn // by node address; "" for the one unsharded connection
	readers sync.WaitGroup
}

// Listener is the engine's side of a node's pub/sub: the waiters that hear
// the messages. The subscriber hands it every message as it reads it (no
// goroutine between), and tells it when messages may have been missed.
type Listener interface {
	// Dispatch takes a message on a lock's channel.
	Dispatch(channel, payload string)
	// WakeAll makes every waiter look again: messages may have been
	// missed (a connection lost, a slot moved, SUBSCRIBE denied).
	WakeAll()
	// Done is closed when the Client closes: the connections' writers
	// stop, and so do the batcher's waits.
	Done() <-chan struct{}
}

// psConn is one pub/sub connection, its reader and its writer.
type psConn struct {
	addr    string
	ps      *redis.PubSub
	sharded bool
	ops     []subOp       // guarded by subscriber.mu: for the writer, in order
	kick    chan struct{} // capacity 1: ops has work
	retired chan struct{} // closed when the connection is given up (see retire)
}

// subOp is a subscription (sub) or unsubscription for a connection's writer.
type subOp struct {
	channel string
	sub     bool
}

type subEntry struct {
	refs      int
	conn      *psConn       // nil while no connection could be had: retried by waiters
	ready     chan struct{} // closed once the server confirmed the subscription
	confirmed bool
	// redone: subscribed again after its subscription was lost (a
	// connection given up, a slot moved): its confirmation wakes every
	// listener, since a message may have been missed meanwhile, and a wake
	// before it could not yet tell.
	redone    bool
	idleSince time.Time // when refs last dropped to 0
}

// watch registers interest in channel; without create only if it is
// subscribed (or lingering) already. It reports whether it registered.
func (s *subscriber) Watch(channel string, create bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.chans == nil {
		s.chans = make(map[string]*subEntry)
		s.conns = make(map[string]*psConn)
	}
	e := s.chans[channel]
	if e == nil && !create {
		return false
	}
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
	return true
}

// ready returns a channel that is closed once messages on channel are
// delivered (at once when subscriptions are denied). A waiter asks again each
// time it looks, so that a subscription that could not be made yet (cluster
// unreachable) is retried.
func (s *subscriber) Ready(channel string) <-chan struct{} {
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

// subscribeLocked has the subscription for e sent on the connection serving
// channel.
func (s *subscriber) subscribeLocked(channel string, e *subEntry) {
	conn, err := s.connLocked(channel)
	if err != nil {
		s.n.log.Debug("remutex: no pub/sub connection yet", "channel", channel, "err", err)
		return
	}
	e.conn = conn
	s.queueLocked(conn, channel, true)
}

// queueLocked hands a (un)subscription to conn's writer. The writer sends
// them in the order they were queued, so that subscribes and unsubscribes of
// one channel reach the server in the order they were decided.
func (s *subscriber) queueLocked(conn *psConn, channel string, sub bool) {
	conn.ops = append(conn.ops, subOp{channel: channel, sub: sub})
	select {
	case conn.kick <- struct{}{}:
	default:
	}
}

// write sends conn's queued (un)subscriptions until the Client closes. An
// error is not final: go-redis records a subscribed channel and subscribes
// it again when the reader reconnects.
//
// The writer starts the connection's reader once it has sent its first
// batch: go-redis opens a PubSub's connection at its first call, and a
// cluster client opens it on the master of the first channel's slot, but
// on a random node for a call that names no channel (a receive). So a
// Client's classic subscription sits where its first wait put it.
func (s *subscriber) write(conn *psConn) {
	defer s.readers.Done()
	ctx := context.Background()
	reading := false
	for {
		select {
		case <-conn.kick:
		case <-s.to.Done():
			return
		case <-conn.retired:
			return
		}
		s.mu.Lock()
		ops := conn.ops
		conn.ops = nil
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		for _, op := range ops {
			var err error
			switch {
			case op.sub && conn.sharded:
				err = conn.ps.SSubscribe(ctx, op.channel)
			case op.sub:
				err = conn.ps.Subscribe(ctx, op.channel)
			case conn.sharded:
				err = conn.ps.SUnsubscribe(ctx, op.channel)
			default:
				err = conn.ps.Unsubscribe(ctx, op.channel)
			}
			if err != nil {
				s.n.log.Debug("remutex: (un)subscribe failed", "channel", op.channel, "subscribe", op.sub, "err", err)
			}
		}
		if !reading {
			reading = true
			s.readers.Add(1) // (this writer's count keeps the group open)
			go s.run(conn)
		}
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
	conn := &psConn{addr: addr, sharded: sharded, kick: make(chan struct{}, 1), retired: make(chan struct{})}
	if sharded {
		conn.ps = node.SSubscribe(ctx) // without channels: no I/O yet
	} else {
		conn.ps = s.n.rdb.Subscribe(ctx)
	}
	s.conns[addr] = conn
	s.readers.Add(1)
	go s.write(conn) // which starts the reader (see write)
	return conn, nil
}

// unwatch drops a waiter's interest in channel.
func (s *subscriber) Unwatch(channel string) {
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
func (s *subscriber) Polling() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.denied
}

// close stops the readers and writers and waits for them. It is called
// after the Client's closing channel is closed.
func (s *subscriber) Close() {
	s.mu.Lock()
	s.closed = true
	conns := make([]*psConn, 0, len(s.conns))
	for _, conn := range s.conns {
		conns = append(conns, conn)
	}
	s.mu.Unlock()
	for _, conn := range conns {
		_ = conn.ps.Close() // waits for a (un)subscription in flight
	}
	s.readers.Wait()
}

func (s *subscriber) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// run reads conn and hands each message to the Listener, until the
// connection is given up or the Client closes. After a message it yields: the
// waiter the message woke is next to run on this processor, but only once the
// reader parks, after it has armed its read deadline and made a read system
// call that finds nothing; yielding lets the waiter run first, and the reader
// re-arms after it (or on another processor meanwhile).
func (s *subscriber) run(conn *psConn) {
	defer s.readers.Done()
	var bo Backoff
	var live liveness
	for {
		msg, err := conn.ps.ReceiveTimeout(context.Background(), s.sweep(conn))
		if err != nil {
			if s.isClosed() || IsClosed(conn.retired) {
				return
			}
			var nerr net.Error
			if errors.As(err, &nerr) && nerr.Timeout() {
				// The sweep's tick, or a quiet connection: is the server
				// still there?
				if live.silent(conn) {
					s.retire(conn)
					return
				}
				continue
			}
			if redis.HasErrorPrefix(err, "NOPERM") {
				s.deny(err)
				continue
			}
			if conn.sharded && redis.HasErrorPrefix(err, "MOVED") {
				s.redirected(conn, err)
				continue
			}
			// The connection broke; go-redis reconnects and subscribes again
			// on the next receive. Messages may have been missed meanwhile:
			// every waiter looks again. A shard channel whose master died
			// and was failed over follows its slot to the new master.
			if conn.sharded {
				s.rehome(conn)
			}
			s.to.WakeAll()
			t := time.NewTimer(bo.Next())
			select {
			case <-t.C:
			case <-s.to.Done():
			}
			t.Stop()
			continue
		}
		bo = Backoff{}
		live = liveness{}
		switch m := msg.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				s.confirm(m.Channel)
			case "sunsubscribe":
				s.moved(conn, m.Channel)
			}
		case *redis.Message:
			s.to.Dispatch(m.Channel, m.Payload)
			runtime.Gosched() // (see above)
		}
	}
}

// A server that stops answering without closing the connection (paused,
// partitioned, a host frozen) would keep a Client's subscriptions, and its
// waiters would hear nothing while a replica promoted in its place hands the
// lock on. So a connection with channels that has been quiet for pingAfter
// is pinged, and one that does not answer within pongWithin is given up:
// its channels are subscribed again on a new connection, which the redis
// client opens to wherever the lock's server is now.
const (
	pingAfter  = time.Second
	pongWithin = 2 * time.Second
)

// liveness is a reader's view of its connection: quiet since, pinged at.
type liveness struct{ quiet, pinged time.Time }

// silent is called when a receive timed out: it pings a connection quiet
// for pingAfter and reports whether a ping went unanswered for pongWithin.
func (l *liveness) silent(conn *psConn) bool {
	now := time.Now()
	switch {
	case l.quiet.IsZero():
		l.quiet = now
	case l.pinged.IsZero() && now.Sub(l.quiet) >= pingAfter:
		l.pinged = now
		_ = conn.ps.Ping(context.Background())
	case !l.pinged.IsZero() && now.Sub(l.pinged) >= pongWithin:
		return true
	}
	return false
}

// retire gives conn up: its channels are subscribed again on a new
// connection (see connLocked), its writer stops, and every waiter looks
// again, since releases may have been missed.
func (s *subscriber) retire(conn *psConn) {
	if cc, ok := s.n.rdb.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
	s.mu.Lock()
	close(conn.retired)
	if s.conns[conn.addr] == conn {
		delete(s.conns, conn.addr)
	}
	for ch, e := range s.chans {
		if e.conn == conn && !s.closed {
			if e.confirmed {
				e.ready = make(chan struct{})
			}
			e.conn, e.confirmed, e.redone = nil, false, true
			s.subscribeLocked(ch, e)
		}
	}
	s.mu.Unlock()
	s.n.log.Warn("remutex: pub/sub connection did not answer a ping; subscribing again on a new one", "addr", conn.addr)
	_ = conn.ps.Close()
	s.to.WakeAll()
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
		s.queueLocked(conn, ch, false)
	}
	if busy {
		return linger / 2
	}
	return 0
}

func (s *subscriber) confirm(channel string) {
	s.mu.Lock()
	e := s.chans[channel]
	again := e != nil && (e.confirmed || e.redone)
	if e != nil && !e.confirmed {
		e.confirmed, e.redone = true, false
		close(e.ready)
	}
	s.mu.Unlock()
	if again {
		// Subscribed again after a reconnect, or on a new connection: a
		// message may have been missed.
		s.to.WakeAll()
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
		s.n.log.Warn("remutex: SUBSCRIBE denied; waiters poll with backoff instead", "err", err)
	}
}
