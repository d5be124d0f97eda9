package remutex

// DistRWMutex on the deployments of DistMutex: a primary with a replica
// (WithReplicaAck) and a Redis Cluster (a subtest of TestCluster, on its
// cluster).

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/remutex/remutex/internal/redistest"
)

// rwOn returns a DistRWMutex of lock name for each Client.
func rwOn(cs []*Client, name string, opts ...MutexOption) []*DistRWMutex {
	rws := make([]*DistRWMutex, len(cs))
	for i, c := range cs {
		rws[i] = c.NewRWMutex(name, opts...)
	}
	return rws
}

// checkRWExclusion runs the basic exchange of read and write holds between
// three DistRWMutexes of one lock: two readers share it while a writer
// waits, a reader that comes later waits behind the writer, the writer gets
// in once both readers left, the late reader once it left. step, if not
// nil, is called at each stage ("read held", "writer waiting", "write held",
// "reader waiting") to check the servers.
func checkRWExclusion(t *testing.T, rws []*DistRWMutex, step func(string)) {
	t.Helper()
	if step == nil {
		step = func(string) {}
	}
	r1, r2, w := newFaultGoroutine(t), newFaultGoroutine(t), newFaultGoroutine(t)
	r1.do(t, hangGuard, "RLock", rws[0].RLock)
	step("read held")
	var ok bool
	// (TryRLockContext: TryRLock's 300ms, with a replica's WAIT, may pass
	// on a busy machine before the answer comes.)
	r2.do(t, hangGuard, "TryRLockContext", func() { ok, _ = rws[2].TryRLockContext(testCtx(t, hangGuard)) })
	assert.True(t, ok, "a second reader's TryRLockContext: got false, want true")
	w.do(t, hangGuard, "TryLock", func() { ok = rws[1].TryLock() })
	assert.False(t, ok, "a writer's TryLock while readers hold: got true, want false")
	locked := w.async(rws[1].Lock)
	step("writer waiting")
	r1.do(t, hangGuard, "RUnlock", rws[0].RUnlock)
	notYet(t, locked, "the writer while a reader holds")
	r2.do(t, hangGuard, "RUnlock", rws[2].RUnlock)
	faultAwait(t, locked, hangGuard, "the writer once both readers left")
	step("write held")
	r1.do(t, hangGuard, "TryRLock", func() { ok = rws[0].TryRLock() })
	assert.False(t, ok, "a reader's TryRLock while the writer holds: got true, want false")
	rlocked := r1.async(rws[0].RLock)
	step("reader waiting")
	w.do(t, hangGuard, "Unlock", rws[1].Unlock)
	faultAwait(t, rlocked, hangGuard, "the late reader once the writer left")
	r1.do(t, hangGuard, "RUnlock", rws[0].RUnlock)
}

// TestRWMutexReplicaAck: with WithReplicaAck(1, ...) a read hold and a write
// hold are on the replica when RLock and Lock return; readers and writers of
// three Clients exclude each other (sync's hammer). Asking for two replicas
// of a primary that has one, reads and writes are refused with
// ErrTooFewReplicas and leave no hold.
func TestRWMutexReplicaAck(t *testing.T) {
	t.Parallel()
	p := redistest.StartReplicaPair(t, false)
	name := lockName(t)
	k := rwKeysOf(name)
	ctx := testCtx(t, hangGuard)
	var cs []*Client
	for i := 0; i < 3; i++ {
		cs = append(cs, clientOn(t, rdbAt(t, p.Primary.Addr()), WithReplicaAck(1, time.Second)))
	}
	replica := rdbAt(t, p.Replica.Addr())
	checkRWExclusion(t, rwOn(cs, name), func(step string) {
		switch step {
		case "read held":
			assert.Equal(t, int64(1), replica.ZCard(ctx, k.readers).Val(), "read holds on the replica when RLock returned")
		case "write held":
			assert.Equal(t, int64(1), replica.HLen(ctx, k.w).Val(), "write holds on the replica when Lock returned")
		}
	})
	hammerRWMutex(t, rwOn(cs, name+".hammer"), 3, 6)

	sc := clientOn(t, rdbAt(t, p.Primary.Addr()), WithReplicaAck(2, 50*time.Millisecond))
	short := sc.NewRWMutex(name)
	ok, err := short.TryRLockContext(ctx)
	assert.False(t, ok, "TryRLockContext with too few replicas: got true")
	assert.ErrorIs(t, err, ErrTooFewReplicas, "TryRLockContext with too few replicas")
	ok, err = short.TryLockContext(ctx)
	assert.False(t, ok, "TryLockContext with too few replicas: got true")
	assert.ErrorIs(t, err, ErrTooFewReplicas, "TryLockContext with too few replicas")
	settled(t, sc) // the grants are given back by calls that follow them
	primary := rdbAt(t, p.Primary.Addr())
	assert.Zero(t, primary.Exists(ctx, k.w, k.readers, k.queue).Val(), "keys left after the refused calls")
}

// testClusterRWMutex: on each master, the basic exchange of read and write
// holds between Clients of ClusterClients, the waiters subscribed to their
// Client's shard channels on the lock's master alone and woken there, the
// keys on that master alone; then sync's hammer on one lock.
func testClusterRWMutex(t *testing.T, tc *redistest.Cluster) {
	redistest.RequireShardedPubSub(t)
	prefix := topoPrefix(t)
	var cs []*Client
	for i := 0; i < 3; i++ {
		cs = append(cs, clientOn(t, tc.Client(t), WithKeyPrefix(prefix)))
	}
	for _, n := range tc.Masters {
		name := nameOn(t, tc, n, prefix, "rw")
		base := prefix + "{" + name + "}:rw"
		t.Run(n.String(), func(t *testing.T) {
			checkRWExclusion(t, rwOn(cs, name, WithFencing()), func(step string) {
				switch step {
				case "writer waiting":
					checkShardWaiter(t, tc, n, base+releasedInfix+cs[1].id)
				case "reader waiting":
					checkShardWaiter(t, tc, n, base+":readers"+releasedInfix+cs[0].id)
				}
				for _, o := range tc.Masters {
					if got := redistest.KeysWithPrefix(t, o.RDB, prefix+"{"+name+"}"); o != n && len(got) > 0 {
						t.Errorf("keys of %q on %v, which does not serve it: %q", name, o, got)
					}
				}
			})
		})
	}
	hammerRWMutex(t, rwOn(cs, nameOn(t, tc, tc.Masters[0], prefix, "hammer")), 3, 6)
}

// checkShardWaiter waits until a waiter's Client subscribed to its shard
// channel on master, and checks that no other master has the subscription.
func checkShardWaiter(t *testing.T, tc *redistest.Cluster, master *redistest.Node, channel string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("a subscriber of %s on %v", channel, master), func() bool { return master.ShardSubs(t, channel) == 1 })
	for _, o := range tc.Masters {
		if got := o.ShardSubs(t, channel); o != master && got != 0 {
			t.Errorf("SHARDNUMSUB %s on %v, which does not serve it: got %d, want 0", channel, o, got)
		}
	}
}
