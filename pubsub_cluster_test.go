package remutex

import (
	"fmt"
	"testing"

	"github.com/remutex/remutex/internal/redistest"
)

// TestClusterReleaseMessages: a waiter of another Client on a cluster is
// woken by the release's message, of the kind the servers have. With
// sharded pub/sub (Redis 7, Valkey) the waiter's Client subscribes on the
// lock's master and the release SPUBLISHes there; without it (Redis 6.2)
// the Client falls back to SUBSCRIBE and the release to PUBLISH, which
// every node of the cluster relays: an observer subscribed on a master that
// does not serve the lock gets the message.
func TestClusterReleaseMessages(t *testing.T) {
	t.Parallel()
	v := redistest.ServerVersion(t)
	tc := redistest.StartCluster(t, 3, 0)
	ctx := testCtx(t, hangGuard)
	prefix := topoPrefix(t)
	owner, other := tc.Masters[0], tc.Masters[1]
	name := nameOn(t, tc, owner, prefix, "msg")
	hash := prefix + "{" + name + "}"
	ca, cb := clientOn(t, tc.Client(t), WithKeyPrefix(prefix)), clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	ma, mb := ca.NewMutex(name, WithFencing()), cb.NewMutex(name, WithFencing())
	channel := hash + releasedInfix + cb.id

	if err := ma.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: %v", err)
	}
	w := lockAsync(t, mb, nil, "waiter")
	waitFor(t, "the waiter queued on "+owner.String(), func() bool {
		return owner.RDB.Exists(ctx, hash+":waiting").Val() == 1
	})
	observer := owner
	if v.ShardedPubSub() {
		waitFor(t, fmt.Sprintf("SHARDNUMSUB %s on %v to be 1", channel, owner), func() bool {
			return owner.ShardSubs(t, channel) == 1
		})
	} else {
		// One classic subscription, on whichever node the Client's
		// subscription connection reached.
		waitFor(t, "one subscriber of "+channel+" in the cluster", func() bool {
			var n int64
			for _, m := range tc.Masters {
				subs, err := m.RDB.PubSubNumSub(ctx, channel).Result()
				if err != nil {
					t.Fatalf("PUBSUB NUMSUB on %v: %v", m, err)
				}
				n += subs[channel]
			}
			return n == 1
		})
		observer = other // PUBLISH on the owner reaches it through the cluster bus
	}
	messages := observeChannel(t, observer.SubscribeShard(ctx, channel))

	if err := ma.UnlockContext(ctx); err != nil {
		t.Fatalf("UnlockContext: %v", err)
	}
	// The holder's lease is 30s, beyond the hang guard: the waiter cannot
	// have taken the lock by waiting out its timer.
	if r := await(t, w.locked, "the waiter's LockContext"); r.err != nil {
		t.Fatalf("the waiter's LockContext on %v: %v", v, r.err)
	}
	if msg := await(t, messages, fmt.Sprintf("the release's message on %s, observed on %v", channel, observer)); msg.Channel != channel {
		t.Errorf("the release's message: got channel %q, want %q", msg.Channel, channel)
	}
	w.unlock()
	if err := await(t, w.unlocked, "the waiter's UnlockContext"); err != nil {
		t.Errorf("the waiter's UnlockContext: %v", err)
	}
}
