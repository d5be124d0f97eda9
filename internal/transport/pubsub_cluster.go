package transport

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/wire"
)

// Redis Cluster's side of the subscriber: shard channels follow their slot
// when it moves or its master fails over, and the Client decides once whether
// releases use sharded pub/sub.

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
	s.detachLocked(conn, channel, e)
	s.mu.Unlock()
	s.follow(conn, []string{channel})
}

// rehome moves the channels of conn, whose connection broke, to the master
// that serves their slot now, if that is another one: a master that died
// sends no SUNSUBSCRIBE, and its replica, promoted, does not know of the
// subscriptions. It asks the cluster client to reload its view of the
// slots, and is called again on every failed reconnection until the view
// names the new master.
func (s *subscriber) rehome(conn *psConn) {
	cc, ok := s.n.rdb.(*redis.ClusterClient)
	if !ok {
		return
	}
	cc.ReloadState(context.Background())
	s.mu.Lock()
	var chans []string
	for ch, e := range s.chans {
		if e.conn != conn {
			continue
		}
		if node, err := cc.MasterForKey(context.Background(), ch); err == nil && node.Options().Addr != conn.addr {
			s.detachLocked(conn, ch, e)
			chans = append(chans, ch)
		}
	}
	s.mu.Unlock()
	s.follow(conn, chans)
}

// redirected handles a MOVED reply to a subscription sent on conn: the
// cluster client's view of the slots was out of date, or conn's node, a
// master that died and came back as a replica, was subscribed again by
// go-redis when it reconnected. The channels of that slot on conn, confirmed
// or not, are subscribed again where the slot lives.
func (s *subscriber) redirected(conn *psConn, err error) {
	f := strings.Fields(err.Error()) // MOVED <slot> <addr>
	if len(f) != 3 {
		return
	}
	slot, perr := strconv.Atoi(f[1])
	if perr != nil {
		return
	}
	var chans []string
	s.mu.Lock()
	for ch, e := range s.chans {
		if e.conn == conn && wire.Slot(ch) == slot {
			s.detachLocked(conn, ch, e)
			chans = append(chans, ch)
		}
	}
	s.mu.Unlock()
	s.follow(conn, chans)
}

// detachLocked forgets channel's subscription on conn, so that go-redis does
// not subscribe it there again on a reconnect, and marks it unsubscribed.
func (s *subscriber) detachLocked(conn *psConn, channel string, e *subEntry) {
	s.queueLocked(conn, channel, false)
	if e.confirmed {
		e.ready = make(chan struct{})
	}
	e.conn, e.confirmed, e.redone = nil, false, true
}

// follow subscribes chans, which conn's node no longer serves, where their
// slot lives now, and wakes every waiter. The cluster client reloads its
// view of the slots in the background: follow waits, for up to a second,
// until that view sends the slot elsewhere, so as not to subscribe on conn's
// node again.
func (s *subscriber) follow(conn *psConn, chans []string) {
	if len(chans) == 0 {
		return
	}
	if cc, ok := s.n.rdb.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
		t := time.NewTimer(0)
		defer t.Stop()
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
			node, err := cc.MasterForKey(context.Background(), chans[0])
			if err == nil && node.Options().Addr != conn.addr {
				break
			}
			t.Reset(5 * time.Millisecond)
			select {
			case <-t.C:
			case <-s.to.Done():
				return
			}
		}
	}
	s.mu.Lock()
	for _, ch := range chans {
		if e := s.chans[ch]; e != nil && e.conn == nil && !s.closed {
			s.subscribeLocked(ch, e)
		}
	}
	s.mu.Unlock()
	s.to.WakeAll()
}

// sharded reports whether release messages use sharded pub/sub: on a
// ClusterClient whose servers know SPUBLISH (Redis 7 or later). The Client
// asks as it is made (see askSharded), so that its first release need not;
// until it is decided, and where it cannot be told, classic pub/sub. An
// operation that finds it undecided asks again, by a job of the batcher
// (so that a server that does not answer holds up no caller past its
// context). A question that a context or a timeout cut short decides
// nothing: a TryLock's short bound, or an Unlock's, on a busy machine
// would otherwise leave the Client on classic pub/sub for good, where a
// Client on sharded pub/sub would not hear its messages.
func (n *node) sharded(ctx context.Context) bool {
	if n.decided.Load() {
		return n.shardPub.Load()
	}
	cc, ok := n.rdb.(*redis.ClusterClient)
	if !ok {
		return false
	}
	_ = n.batch.job(ctx, func(ctx context.Context) {
		if !n.decided.Load() { // jobs run one at a time, on the drainer
			n.decideSharded(ctx, cc)
		}
	})
	return n.shardPub.Load()
}

// askBound bounds the question a cluster Client asks as it is made.
const askBound = 5 * time.Second

// askSharded posts the question of sharded pub/sub to the drainer, on no
// caller's time: a Client's first release (an Unlock has at most
// UnlockTimeout, part of it spent) then finds it decided.
func (n *node) askSharded(cc *redis.ClusterClient) {
	_ = n.batch.job(PostCtx(context.Background(), askBound), func(ctx context.Context) {
		if !n.decided.Load() {
			n.decideSharded(ctx, cc)
		}
	})
}

// decideSharded asks COMMAND INFO, which any ACL user with @connection may
// run, whether the cluster knows SPUBLISH. An answer decides; so does an
// error that is neither ctx's end nor a timeout (a refusal, or a reply
// error such as an ACL's), as classic pub/sub.
func (n *node) decideSharded(ctx context.Context, cc *redis.ClusterClient) {
	v, err := cc.Do(ctx, "command", "info", "spublish").Slice()
	var ne net.Error
	if err != nil && (ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout()) {
		return
	}
	defer n.decided.Store(true)
	if err != nil {
		n.log.Warn("remutex: cannot tell whether the cluster has sharded pub/sub; using classic pub/sub", "err", err)
		return
	}
	if len(v) == 1 && v[0] != nil {
		n.shardPub.Store(true)
	}
}
