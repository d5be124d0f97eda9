package remutex

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// Tests on a real Redis Cluster started by the test: keys of a lock in one
// slot, exclusion across Clients, waiters woken by sharded pub/sub on the
// right master, renewal of locks on several masters, replica
// acknowledgement per master, and a slot migration while a lock is held and
// waited for.

// TestCluster runs on one cluster of three masters with a replica each;
// its subtests leave the cluster as they found it, so they share it.
func TestCluster(t *testing.T) {
	t.Parallel()
	tc := redistest.StartCluster(t, 3, 1)
	t.Run("KeysShareOneSlot", func(t *testing.T) { testClusterKeysShareOneSlot(t, tc) })
	t.Run("Exclusion", func(t *testing.T) { testClusterExclusion(t, tc) })
	t.Run("WaitersWokenOnTheirMaster", func(t *testing.T) { testClusterWaitersWoken(t, tc) })
	t.Run("WatchdogRenewsOnEveryMaster", func(t *testing.T) { testClusterWatchdog(t, tc) })
	t.Run("ReplicaAck", func(t *testing.T) { testClusterReplicaAck(t, tc) })
	t.Run("RWMutex", func(t *testing.T) { testClusterRWMutex(t, tc) })
	t.Run("BatchSpansSlots", func(t *testing.T) { testClusterBatch(t, tc) })
}

// testClusterKeysShareOneSlot checks, for names with and without braces of
// their own, that every key a lock uses (hash, fence counter, queue, queue
// deadlines, release marker) and its channel hash to one slot and live on
// the master that serves it.
func testClusterKeysShareOneSlot(t *testing.T, tc *redistest.Cluster) {
	redistest.RequireShardedPubSub(t)
	for _, name := range []string{"a", "{user1}:cart", "x}y", "{}", "a{b}c{d}"} {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t, hangGuard)
			prefix := topoPrefix(t)
			ma := clientOn(t, tc.Client(t), WithKeyPrefix(prefix)).NewMutex(name, WithFencing())
			cb := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
			mb := cb.NewMutex(name, WithFencing())
			hash := prefix + "{" + name + "}"
			slot := tc.Slot(t, hash)
			owner := tc.Owner(t, tc.Masters[0], slot)

			if err := ma.LockContext(ctx); err != nil {
				t.Fatalf("LockContext(%q): got %v, want nil", name, err)
			}
			fa := ma.Fence()
			w := lockAsync(t, mb, nil, "")
			waitFor(t, "the waiter queued on "+owner.String(), func() bool {
				return owner.RDB.Exists(ctx, hash+":waiting").Val() == 1
			})
			want := []string{hash, hash + ":fence", hash + ":waiting"}
			checkLockKeys(t, tc, owner, prefix, slot, want)
			channel := hash + ":released:" + cb.id // the waiting Client's channel
			if got := tc.Slot(t, channel); got != slot {
				t.Errorf("channel %s is in slot %d, want %d", channel, got, slot)
			}
			// The waiter subscribes once its queueing call returned.
			waitFor(t, fmt.Sprintf("SHARDNUMSUB %s on %v to be 1", channel, owner), func() bool {
				return owner.ShardSubs(t, channel) == 1
			})

			if err := ma.UnlockContext(ctx); err != nil {
				t.Fatalf("UnlockContext: got %v, want nil", err)
			}
			r := await(t, w.locked, "the waiter's LockContext to return")
			if r.err != nil || r.fence <= fa {
				t.Fatalf("waiter's LockContext: got (%v, fence %d), want (nil, fence > %d)", r.err, r.fence, fa)
			}
			w.unlock()
			if err := await(t, w.unlocked, "the waiter's UnlockContext"); err != nil {
				t.Fatalf("waiter's UnlockContext: got %v, want nil", err)
			}
			checkLockKeys(t, tc, owner, prefix, slot, []string{hash + ":fence"})
		})
	}
}

// checkLockKeys checks that the keys under prefix are exactly want, all on
// owner and in slot.
func checkLockKeys(t *testing.T, tc *redistest.Cluster, owner *redistest.Node, prefix string, slot int, want []string) {
	t.Helper()
	slices.Sort(want)
	if got := redistest.KeysWithPrefix(t, owner.RDB, prefix); !slices.Equal(got, want) {
		t.Errorf("keys on %v (serving slot %d): got %q, want %q", owner, slot, got, want)
	}
	for _, k := range want {
		if got := tc.Slot(t, k); got != slot {
			t.Errorf("key %q is in slot %d, want %d", k, got, slot)
		}
	}
	for _, n := range tc.Masters {
		if n == owner {
			continue
		}
		if got := redistest.KeysWithPrefix(t, n.RDB, prefix); len(got) > 0 {
			t.Errorf("keys on %v, which does not serve slot %d: got %q, want none", n, slot, got)
		}
	}
}

// testClusterExclusion runs Clients on separate ClusterClients against one
// lock: no two critical sections overlap, and fences strictly increase.
func testClusterExclusion(t *testing.T, tc *redistest.Cluster) {
	const clients, goroutines, rounds = 3, 2, 8
	name := lockName(t)
	var mutexes []*DistMutex
	for i := 0; i < clients; i++ {
		mutexes = append(mutexes, clientOn(t, tc.Client(t)).NewMutex(name, WithFencing()))
	}
	reg := redistest.NewRegister(t)
	if err := hammer(testCtx(t, hangGuard), reg, mutexes, goroutines, rounds); err != nil {
		t.Fatal(err)
	}
	reg.CheckSections(t, clients*goroutines*rounds)
}

// testClusterWaitersWoken holds one lock on each master and makes a second
// Client wait for all three: its Client subscribes to each lock's shard
// channel on the master that serves the lock and on no other, and each
// waiter gets its lock once the holder unlocks.
func testClusterWaitersWoken(t *testing.T, tc *redistest.Cluster) {
	redistest.RequireShardedPubSub(t)
	prefix := topoPrefix(t)
	holder := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	waiter := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	type lock struct {
		master *redistest.Node
		reg    *redistest.Register
		held   *asyncLock
		wait   *asyncLock
		ch     string
	}
	var locks []lock
	for i, n := range tc.Masters {
		name := nameOn(t, tc, n, prefix, "w")
		l := lock{master: n, ch: prefix + "{" + name + "}:released:" + waiter.id, reg: redistest.NewRegister(t)}
		l.held = lockAsync(t, holder.NewMutex(name, WithFencing()), l.reg, fmt.Sprint("holder ", i))
		if r := await(t, l.held.locked, "the holder's LockContext"); r.err != nil {
			t.Fatalf("holder's LockContext(%q): got %v, want nil", name, r.err)
		}
		l.wait = lockAsync(t, waiter.NewMutex(name, WithFencing()), l.reg, fmt.Sprint("waiter ", i))
		locks = append(locks, l)
	}
	for _, l := range locks {
		waitFor(t, fmt.Sprintf("the waiter subscribed to %s on %v", l.ch, l.master), func() bool {
			return l.master.ShardSubs(t, l.ch) == 1
		})
		for _, n := range tc.Masters {
			if got := n.ShardSubs(t, l.ch); n != l.master && got != 0 {
				t.Errorf("SHARDNUMSUB %s on %v, which does not serve it: got %d, want 0", l.ch, n, got)
			}
		}
	}
	for i, l := range locks {
		select {
		case r := <-l.wait.locked:
			t.Fatalf("waiter %d: got LockContext result %+v while the lock is held, want it waiting", i, r)
		default:
		}
		released := time.Now()
		l.held.unlock()
		if err := await(t, l.held.unlocked, "the holder's UnlockContext"); err != nil {
			t.Fatalf("holder %d: UnlockContext: got %v, want nil", i, err)
		}
		r := await(t, l.wait.locked, "the waiter's LockContext")
		if r.err != nil {
			t.Fatalf("waiter %d: LockContext: got %v, want nil", i, r.err)
		}
		t.Logf("waiter %d on %v got the lock %v after the holder's unlock began", i, l.master, r.at.Sub(released))
		l.wait.unlock()
		if err := await(t, l.wait.unlocked, "the waiter's UnlockContext"); err != nil {
			t.Fatalf("waiter %d: UnlockContext: got %v, want nil", i, err)
		}
		l.reg.CheckSections(t, 2)
	}
}

// testClusterWatchdog holds two locks on each master (six slots) with a
// short lease for more than three leases: the watchdog renews every one of
// them on its own master, and none is lost.
func testClusterWatchdog(t *testing.T, tc *redistest.Cluster) {
	const lease = 2 * time.Second // renewed every 667ms: a busy machine's stalls stay inside it
	ctx := testCtx(t, hangGuard)
	prefix := topoPrefix(t)
	c := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	other := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	type held struct {
		m      *DistMutex
		master *redistest.Node
		lost   <-chan struct{}
	}
	var holds []held
	slots := map[int]bool{}
	for _, n := range tc.Masters {
		for _, base := range []string{"p", "q"} {
			name := nameOn(t, tc, n, prefix, base)
			m := c.NewMutex(name, WithLease(lease))
			slots[keySlot(m.spec.hash())] = true
			if err := m.LockContext(ctx); err != nil {
				t.Fatalf("LockContext(%q): got %v, want nil", name, err)
			}
			holds = append(holds, held{m: m, master: n, lost: m.Lost()})
		}
	}
	if len(slots) != len(holds) {
		t.Fatalf("got %d slots for %d locks, want one each", len(slots), len(holds))
	}
	time.Sleep(3*lease + lease/2) // the time that passes is the point
	for _, h := range holds {
		if isClosed(h.lost) {
			t.Errorf("lock %q on %v: Lost closed after %v, want it held", h.m.Name(), h.master, 3*lease+lease/2)
		}
		if ttl := h.master.RDB.PTTL(ctx, h.m.spec.hash()).Val(); ttl <= 0 {
			t.Errorf("lock %q: PTTL on %v: got %v, want > 0 (renewed)", h.m.Name(), h.master, ttl)
		}
		if other.NewMutex(h.m.Name(), WithLease(lease)).TryLock() {
			t.Errorf("lock %q: another Client's TryLock: got true, want false", h.m.Name())
		}
	}
	for _, h := range holds {
		if err := h.m.UnlockContext(ctx); err != nil {
			t.Errorf("lock %q: UnlockContext: got %v, want nil", h.m.Name(), err)
		}
	}
}

// testClusterReplicaAck locks, with WithReplicaAck(1, ...), one lock on each
// master: when LockContext returns, the master's replica has the hold, and
// renewals that wait for the replica keep it past three leases.
func testClusterReplicaAck(t *testing.T, tc *redistest.Cluster) {
	const lease = 2 * time.Second // as testClusterWatchdog's
	ctx := testCtx(t, hangGuard)
	prefix := topoPrefix(t)
	c := clientOn(t, tc.Client(t), WithKeyPrefix(prefix), WithReplicaAck(1, time.Second))
	var mutexes []*DistMutex
	var replicas []*redistest.Node
	for _, n := range tc.Masters {
		m := c.NewMutex(nameOn(t, tc, n, prefix, "r"), WithLease(lease), WithFencing())
		if err := m.LockContext(ctx); err != nil {
			t.Fatalf("LockContext(%q): got %v, want nil", m.Name(), err)
		}
		// A cluster replica serves reads of its master's slots once the
		// connection sent READONLY.
		r := tc.ReplicaOf(t, n)
		if err := r.RDB.Do(ctx, "readonly").Err(); err != nil {
			t.Fatalf("READONLY on %v: %v", r, err)
		}
		owners, err := r.RDB.HKeys(ctx, m.spec.hash()).Result()
		if err != nil || len(owners) != 1 || !strings.HasPrefix(owners[0], c.id+":") {
			t.Errorf("lock %q on replica %v right after LockContext: got owners %q (%v), want one of Client %s", m.Name(), r, owners, err, c.id)
		}
		fence, err := r.RDB.Get(ctx, m.spec.Keys[1]).Int64()
		if err != nil || fence != m.Fence() {
			t.Errorf("fence of %q on replica %v: got %d (%v), want %d", m.Name(), r, fence, err, m.Fence())
		}
		mutexes = append(mutexes, m)
		replicas = append(replicas, r)
	}
	// Each lock outlives three of its leases, renewed by acknowledged
	// renewals: the replica's copy of the hash sees its expiry moved on.
	expiry := func(i int) time.Time {
		return time.Now().Add(replicas[i].RDB.PTTL(ctx, mutexes[i].spec.hash()).Val())
	}
	last, seen := make([]time.Time, len(mutexes)), make([]int, len(mutexes))
	for i := range mutexes {
		last[i] = expiry(i)
	}
	waitFor(t, "every lock renewed on its replica for three leases", func() bool {
		done := true
		for i, m := range mutexes {
			// A renewal moves the expiry on by lease/3; clock steps and
			// PTTL's rounding by less than lease/10.
			if at := expiry(i); at.After(last[i].Add(lease / 10)) {
				last[i], seen[i] = at, seen[i]+1
			}
			done = done && (seen[i] >= 9 || isClosed(m.Lost()))
		}
		return done
	})
	for _, m := range mutexes {
		if isClosed(m.Lost()) {
			t.Errorf("lock %q: Lost closed with acknowledged renewals, want it held", m.Name())
		}
		if err := m.UnlockContext(ctx); err != nil {
			t.Errorf("lock %q: UnlockContext: got %v, want nil", m.Name(), err)
		}
	}
}

// TestClusterSlotMigration moves the slot of a lock to another master while
// one Client holds the lock and another waits for it, as redis-cli --cluster
// reshard does: IMPORTING and MIGRATING, the lock's hash first (renewals then
// reach it by ASK), the rest of the slot's keys, then CLUSTER SETSLOT NODE on
// every master. The holder keeps the lock throughout and past three leases
// after the move (renewals follow the slot), the waiter's subscription
// follows the slot to the new master (the old one drops it with a
// server-sent SUNSUBSCRIBE), the waiter gets the lock once the holder
// unlocks, fences keep increasing and no critical sections overlap. Then a
// third Client whose view of the slots is still the old one (its CLUSTER
// SLOTS replies are delayed) waits for another lock of the slot: its
// subscription, refused by the old master with MOVED, must land on the new
// one.
func TestClusterSlotMigration(t *testing.T) {
	skipShort(t, "a failover (slot migration)")
	t.Parallel()
	redistest.RequireShardedPubSub(t)
	// Long enough that renewals held up by a busy machine keep the hold.
	const lease = 1500 * time.Millisecond
	tc := redistest.StartCluster(t, 3, 0)
	ctx := testCtx(t, hangGuard)
	prefix := topoPrefix(t)
	a := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	b := clientOn(t, tc.Client(t), WithKeyPrefix(prefix))
	const name = "cart"
	ma := a.NewMutex(name, WithFencing(), WithLease(lease))
	mb := b.NewMutex(name, WithFencing(), WithLease(lease))
	hash := prefix + "{" + name + "}"
	channel := hash + ":released:" + b.id
	slot := tc.Slot(t, hash)
	src := tc.Owner(t, tc.Masters[0], slot)
	dst := tc.Masters[0]
	if dst == src {
		dst = tc.Masters[1]
	}
	reg := redistest.NewRegister(t)
	var slowView atomic.Bool
	c := clientOn(t, slowViewClient(t, tc, &slowView), WithKeyPrefix(prefix))
	name2 := nameInSlot(t, prefix, slot)
	mc2 := c.NewMutex(name2)
	// Loads the third Client's view of the slots (not TryLock, whose 300ms
	// a busy machine can outlast).
	if ok, err := mc2.TryLockContext(ctx); !ok {
		t.Fatalf("TryLockContext(%q): got (false, %v), want true", name2, err)
	}
	mc2.Unlock()

	if err := ma.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: got %v, want nil", err)
	}
	fa := ma.Fence()
	endA := reg.Enter("holder", fa)
	lostA := ma.Lost()
	w := lockAsync(t, mb, reg, "waiter")
	waitFor(t, "the waiter queued and subscribed on "+src.String(), func() bool {
		return src.RDB.Exists(ctx, hash+":waiting").Val() == 1 && src.ShardSubs(t, channel) == 1
	})

	tc.BeginMigration(t, slot, src, dst)
	tc.MigrateKeys(t, slot, src, dst, hash)
	time.Sleep(lease + lease/2) // renewals must reach the hash on dst by ASK
	if isClosed(lostA) {
		t.Fatalf("holder: Lost closed while the slot was migrating, want it held")
	}
	moved := tc.MigrateKeys(t, slot, src, dst)
	t.Logf("migrated %s, then %q, from %v to %v", hash, moved, src, dst)
	tc.EndMigration(t, slot, src, dst)
	movedAt := time.Now()

	waitFor(t, "the waiter subscribed to "+channel+" on "+dst.String(), func() bool {
		return dst.ShardSubs(t, channel) == 1
	})
	t.Logf("the waiter's subscription moved %v after the slot", time.Since(movedAt))
	if got := src.ShardSubs(t, channel); got != 0 {
		t.Errorf("SHARDNUMSUB %s on the old master %v: got %d, want 0", channel, src, got)
	}
	time.Sleep(time.Until(movedAt.Add(3*lease + lease/2))) // renewals must follow the slot
	if isClosed(lostA) {
		t.Fatalf("holder: Lost closed after the slot moved, want it held")
	}
	if ttl := dst.RDB.PTTL(ctx, hash).Val(); ttl <= 0 {
		t.Errorf("PTTL %s on the new master %v: got %v, want > 0", hash, dst, ttl)
	}
	if got := redistest.KeysWithPrefix(t, src.RDB, prefix); len(got) != 0 {
		t.Errorf("keys left on the old master %v: got %q, want none", src, got)
	}
	select {
	case r := <-w.locked:
		t.Fatalf("waiter: got LockContext result %+v while the holder holds, want it waiting", r)
	default:
	}

	endA()
	released := time.Now()
	if err := ma.UnlockContext(ctx); err != nil {
		t.Fatalf("holder: UnlockContext: got %v, want nil", err)
	}
	r := await(t, w.locked, "the waiter's LockContext")
	if r.err != nil {
		t.Fatalf("waiter: LockContext: got %v, want nil", r.err)
	}
	t.Logf("the waiter got the lock %v after the holder's release began", r.at.Sub(released))
	if r.fence <= fa {
		t.Errorf("waiter's fence: got %d, want > %d", r.fence, fa)
	}
	w.unlock()
	if err := await(t, w.unlocked, "the waiter's UnlockContext"); err != nil {
		t.Fatalf("waiter: UnlockContext: got %v, want nil", err)
	}

	// A Client with an outdated view of the slots subscribes where the
	// slot lives now.
	slowView.Store(true)
	ma2 := a.NewMutex(name2)
	if err := ma2.LockContext(ctx); err != nil {
		t.Fatalf("LockContext(%q): got %v, want nil", name2, err)
	}
	channel2 := prefix + "{" + name2 + "}:released:" + c.id
	w2 := lockAsync(t, mc2, nil, "")
	waitFor(t, "the third Client subscribed to "+channel2+" on "+dst.String(), func() bool {
		return dst.ShardSubs(t, channel2) == 1
	})
	if err := ma2.UnlockContext(ctx); err != nil {
		t.Fatalf("UnlockContext(%q): got %v, want nil", name2, err)
	}
	if r := await(t, w2.locked, "the third Client's LockContext"); r.err != nil {
		t.Fatalf("third Client: LockContext(%q): got %v, want nil", name2, r.err)
	}
	w2.unlock()
	if err := await(t, w2.unlocked, "the third Client's UnlockContext"); err != nil {
		t.Fatalf("third Client: UnlockContext(%q): got %v, want nil", name2, err)
	}

	// Both Clients keep taking turns on the new master.
	if err := hammer(ctx, reg, []*DistMutex{ma, mb}, 2, 5); err != nil {
		t.Fatal(err)
	}
	reg.CheckSections(t, 2+2*2*5)
	if got := tc.Owner(t, dst, slot); got != dst {
		t.Errorf("slot %d: got it served by %v, want %v", slot, got, dst)
	}
}

// slowViewClient returns a ClusterClient whose CLUSTER SLOTS queries take
// 300ms more while slow is set: its view of the slots then lags behind a
// migration for that long after the first MOVED it meets.
func slowViewClient(t *testing.T, tc *redistest.Cluster, slow *atomic.Bool) *redis.ClusterClient {
	t.Helper()
	delay := hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if args := cmd.Args(); slow.Load() && len(args) > 1 && cmd.Name() == "cluster" && strings.EqualFold(fmt.Sprint(args[1]), "slots") {
			time.Sleep(300 * time.Millisecond)
		}
		return next(ctx, cmd)
	}}
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: tc.Addrs(),
		NewClient: func(o *redis.Options) *redis.Client {
			c := redis.NewClient(o)
			c.AddHook(delay)
			return c
		},
	})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// nameInSlot returns a lock name whose keys under prefix are in slot.
func nameInSlot(t *testing.T, prefix string, slot int) string {
	t.Helper()
	for i := 0; i < 1<<20; i++ {
		name := "n" + strconv.Itoa(i)
		if keySlot(prefix+"{"+name+"}") == slot {
			return name
		}
	}
	t.Fatalf("no name found for slot %d", slot)
	return ""
}
