package remutex

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// A release hands the lock to the head of the queue and tells its Client
// with a grant message; a head whose Client does not listen is dropped and
// its grant given back. The message must then never have gone out: PUBLISH
// counts only the listeners of the server it ran on, while its replicas (and
// on Redis 6.2 every node of a cluster) deliver it too, so a grant given
// back after it was published can be taken from the message by a Client
// listening elsewhere, beside the next holder.

// TestGrantGivenBackIsNotHeard: a dead entry at the head of the queue, whose
// channel has a listener only on the replica. The release drops it and hands
// the lock to the live waiter behind it; the listener on the replica must
// hear no grant for the dead entry, only the marker published after.
func TestGrantGivenBackIsNotHeard(t *testing.T) {
	const claim = time.Second
	ctx := testCtx(t, hangGuard)
	p := redistest.StartReplicaPair(t, false)
	rdb := rdbAt(t, p.Primary.Addr())
	name := lockName(t)
	k := keysOf(name)
	holder := clientOn(t, rdb).NewMutex(name)
	if err := holder.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: %v", err)
	}

	deadID := strings.Repeat("d", 22) + ".host.1"
	dead := fmt.Sprintf("%d:0:1.1:%s:1", claim.Milliseconds(), deadID)
	heard := observeChannel(t, rdbAt(t, p.Replica.Addr()).Subscribe(ctx, k.channel+deadID))
	if err := rdb.RPush(ctx, k.queue, dead).Err(); err != nil {
		t.Fatalf("RPUSH the dead entry: %v", err)
	}
	wc := clientOn(t, rdb)
	w := goLock(t, wc.NewMutex(name))
	waitFor(t, "the live waiter queued behind the dead entry, and listening", func() bool {
		n := rdb.PubSubNumSub(ctx, k.channel+wc.id).Val()
		return rdb.LLen(ctx, k.queue).Val() == 2 && n[k.channel+wc.id] == 1
	})

	if err := holder.UnlockContext(ctx); err != nil {
		t.Fatalf("UnlockContext: %v", err)
	}
	if err := await(t, w.locked, "the live waiter's LockContext"); err != nil {
		t.Fatalf("the live waiter's LockContext: %v", err)
	}
	if err := rdb.Publish(ctx, k.channel+deadID, "marker").Err(); err != nil {
		t.Fatalf("PUBLISH the marker: %v", err)
	}
	if msg := await(t, heard, "the marker on the replica"); msg.Payload != "marker" {
		t.Errorf("heard on the replica before the marker: %q; a grant given back must never be published", msg.Payload)
	}
	fields := rdb.HKeys(ctx, k.hash).Val()
	if len(fields) != 1 || !strings.HasPrefix(fields[0], wc.id+":") {
		t.Errorf("holders in Redis: got %q, want the live waiter's (Client %s)", fields, wc.id)
	}
	w.release()
	if err := await(t, w.unlocked, "the live waiter's UnlockContext"); err != nil {
		t.Errorf("the live waiter's UnlockContext: %v", err)
	}
}

// TestClusterGrantHeardOnAnotherNode: a waiter whose Client listens on
// another node than the lock's master (on Redis 6.2, the Client's one
// classic subscription sits where its first wait put it, and every node
// relays each message) is handed the lock by the release, and holds it in
// Redis: nobody else can take it while the waiter believes it holds.
func TestClusterGrantHeardOnAnotherNode(t *testing.T) {
	t.Parallel()
	v := redistest.ServerVersion(t)
	tc := redistest.StartCluster(t, 3, 0)
	ctx := testCtx(t, hangGuard)
	prefix := topoPrefix(t)
	owner, other := tc.Masters[0], tc.Masters[1]
	first, name := nameOn(t, tc, other, prefix, "first"), nameOn(t, tc, owner, prefix, "grant")
	ca := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	cb := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	cc := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	hashOf := func(n string) string { return prefix + "{" + n + "}" }

	held := ca.NewMutex(first)
	if err := held.LockContext(ctx); err != nil {
		t.Fatalf("LockContext(%s): %v", first, err)
	}
	holder := ca.NewMutex(name)
	if err := holder.LockContext(ctx); err != nil {
		t.Fatalf("LockContext(%s): %v", name, err)
	}
	// cb's first wait, on a lock of the other master, places its
	// subscription there; its second waits on the lock of the owner.
	w1 := lockAsync(t, cb.NewMutex(first), nil, "the first waiter")
	subscribed := func(node *redistest.Node, channel string) bool {
		if v.ShardedPubSub() {
			return node.ShardSubs(t, channel) == 1
		}
		n, err := node.RDB.PubSubNumSub(ctx, channel).Result()
		return err == nil && n[channel] == 1
	}
	waitFor(t, "the first waiter listening on "+other.String(), func() bool {
		return subscribed(other, hashOf(first)+releasedInfix+cb.id)
	})
	w2 := lockAsync(t, cb.NewMutex(name), nil, "the second waiter")
	listensOn := owner // sharded: on the lock's master
	if !v.ShardedPubSub() {
		listensOn = other // classic: on the Client's one connection
	}
	waitFor(t, fmt.Sprintf("the second waiter queued on %v and listening on %v", owner, listensOn), func() bool {
		return owner.RDB.Exists(ctx, hashOf(name)+":waiting").Val() == 1 &&
			subscribed(listensOn, hashOf(name)+releasedInfix+cb.id)
	})

	if err := holder.UnlockContext(ctx); err != nil {
		t.Fatalf("UnlockContext(%s): %v", name, err)
	}
	if r := await(t, w2.locked, "the second waiter's LockContext"); r.err != nil {
		t.Fatalf("the second waiter's LockContext on %v: %v", v, r.err)
	}
	if ok, err := cc.NewMutex(name).TryLockContext(ctx); ok || err != nil {
		t.Errorf("TryLockContext of a third Client while the waiter holds %s: got (%v, %v), want (false, nil)", name, ok, err)
	}
	w2.unlock()
	if err := await(t, w2.unlocked, "the second waiter's UnlockContext"); err != nil {
		t.Errorf("the second waiter's UnlockContext: %v", err)
	}
	if err := held.UnlockContext(ctx); err != nil {
		t.Fatalf("UnlockContext(%s): %v", first, err)
	}
	if r := await(t, w1.locked, "the first waiter's LockContext"); r.err != nil {
		t.Fatalf("the first waiter's LockContext: %v", r.err)
	}
	w1.unlock()
	if err := await(t, w1.unlocked, "the first waiter's UnlockContext"); err != nil {
		t.Errorf("the first waiter's UnlockContext: %v", err)
	}
}
