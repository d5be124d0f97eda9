package transport

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/redistest"
)

// quietListener is a Listener that hears nothing.
type quietListener struct{ done chan struct{} }

func (quietListener) Dispatch(string, string) {}
func (quietListener) WakeAll()                {}
func (l quietListener) Done() <-chan struct{} { return l.done }

// TestShardedUndecidedByCallersDeadline: a question about sharded pub/sub
// that the caller's context ends decides nothing, and the next operation
// asks again; a failure of the cluster itself decides classic pub/sub.
// (A TryLock's short bound once left a Client on classic pub/sub for good,
// deaf to the messages of Clients on sharded pub/sub.)
func TestShardedUndecidedByCallersDeadline(t *testing.T) {
	// A server that takes connections and never answers: the question
	// outlives the caller's deadline.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() { // takes connections until ln closes, holding them unanswered
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	}()
	silent := newTestNode(t, ln.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if silent.sharded(ctx) {
		t.Fatal("sharded from a server that never answered: got true, want false")
	}
	waitIdle(t, silent)
	if silent.decided.Load() {
		t.Fatal("a question the caller's deadline cut short decided the Client's pub/sub for good")
	}

	// Nothing listens on port 1: the dial is refused at once, which
	// decides.
	refused := newTestNode(t, "127.0.0.1:1")
	if refused.sharded(context.Background()) {
		t.Fatal("sharded on a cluster that cannot be asked: got true, want false")
	}
	if !refused.decided.Load() {
		t.Fatal("a cluster that refused the question left it undecided, to be asked by every operation")
	}
}

// TestShardedAskedAsMade: a cluster Client asks whether the cluster has
// sharded pub/sub as it is made, before any operation. (A Client whose
// first call to need the answer was a release asked on the release's time,
// at most UnlockTimeout with part of it spent: on a busy machine the
// question could be cut short and that release's message go out on
// classic pub/sub, which a waiter listening on sharded pub/sub does not
// hear; it took the lock at its next refresh, a third of a lease later.)
func TestShardedAskedAsMade(t *testing.T) {
	v := redistest.ServerVersion(t)
	tc := redistest.StartCluster(t, 3, 0)
	cc := tc.Client(t)
	l := quietListener{done: make(chan struct{})}
	n := newNode(Config{Log: slog.New(slog.DiscardHandler), Listener: l}, cc, true)
	t.Cleanup(func() {
		n.Close(time.Now().Add(time.Second))
		close(l.done)
	})
	waitIdle(t, n)
	if !n.decided.Load() {
		t.Fatal("a cluster Client that nobody used: undecided whether the cluster has sharded pub/sub, want decided as it was made")
	}
	if got, want := n.shardPub.Load(), v.ShardedPubSub(); got != want {
		t.Fatalf("sharded pub/sub on %v: got %v, want %v", v, got, want)
	}
}

// newTestNode returns a node on a ClusterClient of addr, closed (before its
// client) at the end of the test.
func newTestNode(t *testing.T, addr string) *node {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, MaxRedirects: -1,
		ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
	l := quietListener{done: make(chan struct{})}
	n := newNode(Config{Log: slog.New(slog.DiscardHandler), Listener: l}, cc, true)
	t.Cleanup(func() {
		n.Close(time.Now().Add(time.Second))
		close(l.done)
		_ = cc.Close()
	})
	return n
}

// waitIdle waits until n's batcher has nothing queued or running.
func waitIdle(t *testing.T, n *node) {
	deadline := time.Now().Add(10 * time.Second)
	for !Idle(n) {
		if time.Now().After(deadline) {
			t.Fatal("the batcher still busy after 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// wakeCounter is a Listener that counts WakeAll calls.
type wakeCounter struct {
	wakes atomic.Int64
	done  chan struct{}
}

func (*wakeCounter) Dispatch(string, string) {}
func (w *wakeCounter) WakeAll()              { w.wakes.Add(1) }
func (w *wakeCounter) Done() <-chan struct{} { return w.done }

// TestResubscribedWakesWhenConfirmed: a subscription redone on a new
// connection (one given up for not answering a ping) wakes every listener
// once the server confirms it, not only when it is sent: a message
// published in between reached neither connection, and a listener that
// looked at the first wake (an election's observer reading the log) could
// not have seen it. (An observer stayed a term behind for good.)
func TestResubscribedWakesWhenConfirmed(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	l := &wakeCounter{done: make(chan struct{})}
	n := newNode(Config{Log: slog.New(slog.DiscardHandler), Listener: l}, rdb, true)
	t.Cleanup(func() {
		close(l.done) // (the Client's closing, which the subscriber's goroutines end by)
		n.Close(time.Now().Add(time.Second))
		_ = rdb.Close()
	})
	const channel = "remutex-test:resubscribed"
	n.Watch(channel, true)
	awaitClosed(t, n.Ready(channel), "the first subscription's confirmation")
	n.subscriber.mu.Lock()
	conn := n.subscriber.chans[channel].conn
	n.subscriber.mu.Unlock()

	n.subscriber.retire(conn) // wakes once as it gives the connection up
	awaitClosed(t, n.Ready(channel), "the new subscription's confirmation")
	deadline := time.Now().Add(5 * time.Second)
	for l.wakes.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("wakes after the subscription was redone and confirmed: %d, want 2 (one as it was given up, one at the confirmation)", l.wakes.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

func awaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s after 10s", what)
	}
}
