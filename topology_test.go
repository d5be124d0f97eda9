package remutex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The deployments of the multi-node tests and benchmarks: a Redis Cluster, a
// primary with a replica, and independent servers for a quorum, all started
// by the tests on 127.0.0.1; and a fenced register that checks a log of
// critical sections for overlaps.

// topoCtx bounds an administrative command of a test.
func topoCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	t.Cleanup(cancel)
	return ctx
}

// topoPrefix returns a key prefix unique to the test, so that a test can list
// every key it made on a server other tests share.
func topoPrefix(t testing.TB) string {
	t.Helper()
	return "t" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
}

// topoRDB returns a go-redis client for addr, closed at the end of the test.
func topoRDB(t testing.TB, addr string, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: addr}
	for _, f := range opts {
		f(o)
	}
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// topoClient returns a remutex Client on rdb that logs to the test's log and
// is closed at the end of the test. A testing.B logs nothing.
func topoClient(t testing.TB, rdb redis.UniversalClient, opts ...Option) *Client {
	t.Helper()
	if _, ok := t.(*testing.B); ok {
		c := NewClient(rdb, opts...)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	return clientOn(t, rdb, opts...)
}

// ------------------------------------------------------------ cluster

// clusterNode is one redis-server of a test cluster.
type clusterNode struct {
	srv    *redisServer
	rdb    *redis.Client // administrative connection
	id     string        // CLUSTER MYID
	master *clusterNode  // for a replica, its master
}

func (n *clusterNode) String() string { return n.srv.Addr() }

// testCluster is a Redis Cluster of redis-servers on 127.0.0.1.
type testCluster struct {
	masters, replicas []*clusterNode
}

// requireRedisCLI returns the path of redis-cli, which creates clusters,
// skipping or failing like requireRedisServer when there is none.
func requireRedisCLI(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv("REMUTEX_REQUIRE_REDIS") == "1" {
			t.Fatalf("redis-cli not on PATH and REMUTEX_REQUIRE_REDIS=1: %v", err)
		}
		t.Skip("redis-cli not on PATH (install redis-tools to run the cluster tests)")
	}
	return bin
}

// startCluster starts masters masters with replicasPer replicas each, joins
// them with redis-cli --cluster create, and waits until every node reports
// cluster_state:ok, knows every other node, and every replica is in sync. The
// servers are stopped at the end of the test.
func startCluster(t testing.TB, masters, replicasPer int) *testCluster {
	t.Helper()
	bin := requireRedisServer(t)
	cli := requireRedisCLI(t)
	total := masters * (1 + replicasPer)
	nodes := make([]*clusterNode, total)
	errs := make(chan error, total)
	var wg sync.WaitGroup
	for i := range nodes {
		dir := t.TempDir()
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv, err := launchClusterNode(bin, dir)
			if err != nil {
				errs <- err
				return
			}
			nodes[i] = &clusterNode{srv: srv}
		}()
	}
	wg.Wait()
	for _, n := range nodes {
		if n != nil {
			t.Cleanup(n.srv.stop)
		}
	}
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	ctx := topoCtx(t)
	args := []string{"--cluster", "create"}
	for _, n := range nodes {
		n.rdb = topoRDB(t, n.srv.Addr())
		id, err := n.rdb.Do(ctx, "cluster", "myid").Text()
		if err != nil {
			t.Fatalf("CLUSTER MYID on %v: %v", n, err)
		}
		n.id = id
		args = append(args, n.srv.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPer), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	tc := &testCluster{}
	waitFor(t, "cluster_state:ok on every node, all nodes known, replicas in sync", func() bool {
		tc.masters, tc.replicas = nil, nil
		for _, n := range nodes {
			info, err := n.rdb.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") ||
				!strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", total)) {
				return false
			}
			repl, err := n.rdb.Info(ctx, "replication").Result()
			switch {
			case err != nil:
				return false
			case strings.Contains(repl, "role:master"):
				tc.masters = append(tc.masters, n)
			case strings.Contains(repl, "master_link_status:up"):
				tc.replicas = append(tc.replicas, n)
			default:
				return false
			}
		}
		return len(tc.masters) == masters && len(tc.replicas) == total-masters
	})
	for _, r := range tc.replicas {
		repl := r.rdb.Info(ctx, "replication").Val()
		for _, m := range tc.masters {
			if strings.Contains(repl, "master_port:"+strconv.Itoa(m.srv.port)+"\r") {
				r.master = m
			}
		}
		if r.master == nil {
			t.Fatalf("replica %v: master not found in %q", r, repl)
		}
	}
	return tc
}

// launchClusterNode starts a cluster-enabled redis-server in dir. The
// cluster bus gets a free port of its own: the default, the client port +
// 10000, may be taken or out of range.
func launchClusterNode(bin, dir string) (*redisServer, error) {
	var err error
	for try := 0; try < 3; try++ {
		var bus int
		if bus, err = freePort(); err != nil {
			continue
		}
		sub, derr := os.MkdirTemp(dir, "node")
		if derr != nil {
			return nil, derr
		}
		var srv *redisServer
		srv, err = launchRedisServer(bin, sub,
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus), "--cluster-node-timeout", "5000",
			"--repl-diskless-sync-delay", "0")
		if err == nil {
			return srv, nil
		}
	}
	return nil, err
}

// addrs returns the addresses of the cluster's masters.
func (tc *testCluster) addrs() []string {
	var a []string
	for _, n := range tc.masters {
		a = append(a, n.srv.Addr())
	}
	return a
}

// client returns a new ClusterClient (a pool of its own, standing for a
// separate process), closed at the end of the test.
func (tc *testCluster) client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: tc.addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// slot returns the cluster slot of key, as the server computes it.
func (tc *testCluster) slot(t testing.TB, key string) int {
	t.Helper()
	s, err := tc.masters[0].rdb.ClusterKeySlot(topoCtx(t), key).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
	}
	return int(s)
}

// owner returns the master that serves slot according to CLUSTER SLOTS on
// asked.
func (tc *testCluster) owner(t testing.TB, asked *clusterNode, slot int) *clusterNode {
	t.Helper()
	ranges, err := asked.rdb.ClusterSlots(topoCtx(t)).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS on %v: %v", asked, err)
	}
	for _, r := range ranges {
		if r.Start <= slot && slot <= r.End && len(r.Nodes) > 0 {
			for _, n := range tc.masters {
				if n.id == r.Nodes[0].ID {
					return n
				}
			}
		}
	}
	t.Fatalf("no master serves slot %d according to %v", slot, asked)
	return nil
}

// nameOn returns a lock name, beginning with base, whose keys under prefix
// live on master.
func (tc *testCluster) nameOn(t testing.TB, master *clusterNode, prefix, base string) string {
	t.Helper()
	for i := 0; i < 1000; i++ {
		name := base + strconv.Itoa(i)
		if tc.owner(t, tc.masters[0], keySlot(prefix+"{"+name+"}")) == master {
			return name
		}
	}
	t.Fatalf("no name %s<n> lands on %v", base, master)
	return ""
}

// shardSubs returns the shard-channel subscribers of channel on node.
func shardSubs(t testing.TB, n *clusterNode, channel string) int64 {
	t.Helper()
	m, err := n.rdb.PubSubShardNumSub(topoCtx(t), channel).Result()
	if err != nil {
		t.Fatalf("PUBSUB SHARDNUMSUB on %v: %v", n, err)
	}
	return m[channel]
}

// keysWithPrefix returns the keys beginning with prefix on node (a test
// server: KEYS is fine).
func keysWithPrefix(t testing.TB, rdb *redis.Client, prefix string) []string {
	t.Helper()
	keys, err := rdb.Keys(topoCtx(t), prefix+"*").Result()
	if err != nil {
		t.Fatalf("KEYS %s*: %v", prefix, err)
	}
	sort.Strings(keys)
	return keys
}

// beginMigration marks slot as moving from src to dst (IMPORTING on dst,
// MIGRATING on src), as redis-cli --cluster reshard does.
func (tc *testCluster) beginMigration(t testing.TB, slot int, src, dst *clusterNode) {
	t.Helper()
	ctx := topoCtx(t)
	if err := dst.rdb.Do(ctx, "cluster", "setslot", slot, "importing", src.id).Err(); err != nil {
		t.Fatalf("CLUSTER SETSLOT %d IMPORTING on %v: %v", slot, dst, err)
	}
	if err := src.rdb.Do(ctx, "cluster", "setslot", slot, "migrating", dst.id).Err(); err != nil {
		t.Fatalf("CLUSTER SETSLOT %d MIGRATING on %v: %v", slot, src, err)
	}
}

// migrateKeys moves keys from src to dst with MIGRATE; with no keys given, it
// moves every key of slot (CLUSTER GETKEYSINSLOT) until none is left. It
// returns the keys it moved.
func (tc *testCluster) migrateKeys(t testing.TB, slot int, src, dst *clusterNode, keys ...string) []string {
	t.Helper()
	ctx := topoCtx(t)
	all := len(keys) == 0
	var moved []string
	for {
		if all {
			var err error
			keys, err = src.rdb.ClusterGetKeysInSlot(ctx, slot, 100).Result()
			if err != nil {
				t.Fatalf("CLUSTER GETKEYSINSLOT %d on %v: %v", slot, src, err)
			}
		}
		if len(keys) == 0 {
			return moved
		}
		args := []interface{}{"migrate", "127.0.0.1", dst.srv.port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		// NOKEY: the keys expired meanwhile, which is fine.
		if err := src.rdb.Do(ctx, args...).Err(); err != nil && !strings.HasPrefix(err.Error(), "NOKEY") {
			t.Fatalf("MIGRATE %v from %v to %v: %v", keys, src, dst, err)
		}
		moved = append(moved, keys...)
		if !all {
			return moved
		}
	}
}

// endMigration assigns slot to dst on every master, dst and the source
// first, as redis-cli --cluster reshard does, and waits until every node of
// the cluster says dst serves it.
func (tc *testCluster) endMigration(t testing.TB, slot int, src, dst *clusterNode) {
	t.Helper()
	ctx := topoCtx(t)
	order := []*clusterNode{dst, src}
	for _, n := range tc.masters {
		if n != dst && n != src {
			order = append(order, n)
		}
	}
	for _, n := range order {
		if err := n.rdb.Do(ctx, "cluster", "setslot", slot, "node", dst.id).Err(); err != nil {
			t.Fatalf("CLUSTER SETSLOT %d NODE on %v: %v", slot, n, err)
		}
	}
	waitFor(t, fmt.Sprintf("every node to say %v serves slot %d", dst, slot), func() bool {
		for _, n := range append(append([]*clusterNode(nil), tc.masters...), tc.replicas...) {
			ranges, err := n.rdb.ClusterSlots(ctx).Result()
			if err != nil {
				return false
			}
			ok := false
			for _, r := range ranges {
				if r.Start <= slot && slot <= r.End && len(r.Nodes) > 0 && r.Nodes[0].ID == dst.id {
					ok = true
				}
			}
			if !ok {
				return false
			}
		}
		return true
	})
}

// ------------------------------------------------------------ replication

// replicaPair is a primary and a replica of it. link is the replica's path to
// the primary: the primary itself, or a proxy that can hold the replication
// stream.
type replicaPair struct {
	primary, replica *redisServer
	link             *tcpProxy // nil unless started with a proxy
}

// startReplicaPair starts a primary and a replica of it (through a tcpProxy
// when proxied) and waits until the replica is in sync.
func startReplicaPair(t testing.TB, proxied bool) *replicaPair {
	t.Helper()
	p := &replicaPair{primary: startRedisServer(t, "--repl-diskless-sync-delay", "0")}
	target := p.primary.Addr()
	if proxied {
		p.link = startProxy(t, target)
		target = p.link.Addr()
	}
	host, port, _ := strings.Cut(target, ":")
	p.replica = startRedisServer(t, "--replicaof", host, port)
	ctx := topoCtx(t)
	prdb, rrdb := topoRDB(t, p.primary.Addr()), topoRDB(t, p.replica.Addr())
	waitFor(t, "the replica in sync with the primary and acknowledging", func() bool {
		r, err1 := rrdb.Info(ctx, "replication").Result()
		m, err2 := prdb.Info(ctx, "replication").Result()
		if err1 != nil || err2 != nil || !strings.Contains(r, "master_link_status:up") ||
			!strings.Contains(m, "connected_slaves:1") || !strings.Contains(m, "state=online") {
			return false
		}
		acks, err := prdb.Wait(ctx, 1, 100*time.Millisecond).Result()
		return err == nil && acks == 1
	})
	return p
}

// ------------------------------------------------------------ quorum

// startServers starts n independent redis-servers.
func startServers(t testing.TB, n int) []*redisServer {
	t.Helper()
	srvs := make([]*redisServer, n)
	for i := range srvs {
		srvs[i] = startRedisServer(t)
	}
	return srvs
}

// quorumClient returns a Client on a quorum of srvs, each through a new
// go-redis client (pools of its own, standing for a separate process).
func quorumClient(t testing.TB, srvs []*redisServer, opts ...Option) *Client {
	t.Helper()
	rdbs := make([]redis.UniversalClient, len(srvs))
	for i, s := range srvs {
		rdbs[i] = topoRDB(t, s.Addr())
	}
	c := NewQuorumClient(rdbs, opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ------------------------------------------------------------ register

// fencedRegister stands for a resource that a lock protects: it logs every
// critical section with its fence and its real start and end, and checks
// the log for overlaps and for fences that did not increase. A section
// always takes at least minSection, so that an overlap has time to show.
type fencedRegister struct {
	mu      sync.Mutex
	inside  int
	highest int64
	log     []section
	errs    []string
}

type section struct {
	who        string
	fence      int64
	start, end time.Time
}

const minSection = time.Millisecond

// begin starts a critical section of who holding fence: it checks that no
// one else is inside and, when fenced, that fence is above every fence seen
// before. The section ends when the returned function is called.
func (r *fencedRegister) begin(who string, fence int64, fenced bool) (end func()) {
	start := time.Now()
	r.mu.Lock()
	r.inside++
	if r.inside != 1 {
		r.errs = append(r.errs, fmt.Sprintf("%s entered with fence %d while %d others were inside: got %d inside, want 1", who, fence, r.inside-1, r.inside))
	}
	if fenced && fence <= r.highest {
		r.errs = append(r.errs, fmt.Sprintf("%s entered with fence %d after fence %d: got a fence <= %d, want a higher one", who, fence, r.highest, r.highest))
	}
	r.highest = max(r.highest, fence)
	r.mu.Unlock()
	return func() {
		for time.Since(start) < minSection {
			time.Sleep(minSection - time.Since(start))
		}
		r.mu.Lock()
		r.inside--
		r.log = append(r.log, section{who: who, fence: fence, start: start, end: time.Now()})
		r.mu.Unlock()
	}
}

// enter runs one critical section of at least minSection.
func (r *fencedRegister) enter(who string, fence int64, fenced bool) {
	r.begin(who, fence, fenced)()
}

// check fails the test if any sections overlapped, any fence did not
// increase (when fenced), or fewer than want sections were logged.
func (r *fencedRegister) check(t testing.TB, want int, fenced bool) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.errs {
		t.Error(e)
	}
	log := append([]section(nil), r.log...)
	sort.Slice(log, func(i, j int) bool { return log[i].start.Before(log[j].start) })
	for i := 1; i < len(log); i++ {
		prev, cur := log[i-1], log[i]
		if cur.start.Before(prev.end) {
			t.Errorf("section %d (%s, fence %d) began %v before section %d (%s, fence %d) ended: got an overlap, want none",
				i, cur.who, cur.fence, prev.end.Sub(cur.start), i-1, prev.who, prev.fence)
		}
		if fenced && cur.fence <= prev.fence {
			t.Errorf("section %d (%s) has fence %d after fence %d: got a fence that did not increase, want a higher one", i, cur.who, cur.fence, prev.fence)
		}
		if d := cur.end.Sub(cur.start); d < minSection {
			t.Errorf("section %d lasted %v: got less than %v, want at least", i, d, minSection)
		}
	}
	if len(log) < want {
		t.Errorf("got %d critical sections, want %d", len(log), want)
	}
}

// hammer runs goroutines goroutines on each of the mutexes, each locking
// rounds times and entering reg while it holds the lock. Errors from
// LockContext and UnlockContext are returned, not fatal: the goroutines
// belong to the test.
func hammer(ctx context.Context, reg *fencedRegister, mutexes []*DistMutex, goroutines, rounds int, fenced bool) error {
	var wg sync.WaitGroup
	errc := make(chan error, len(mutexes)*goroutines)
	for i, m := range mutexes {
		for j := 0; j < goroutines; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				who := fmt.Sprintf("client %d goroutine %d", i, j)
				for r := 0; r < rounds; r++ {
					if err := m.LockContext(ctx); err != nil {
						errc <- fmt.Errorf("%s: LockContext: %w", who, err)
						return
					}
					reg.enter(who, m.Fence(), fenced)
					if err := m.UnlockContext(context.Background()); err != nil {
						errc <- fmt.Errorf("%s: UnlockContext: %w", who, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// asyncLock is a LockContext running in a goroutine of the test: it
// reports the result, then holds the lock (a critical section of reg, if not
// nil) until unlock is called, and reports UnlockContext's error. The goroutine is cancelled and joined at the
// end of the test.
type asyncLock struct {
	locked   chan asyncResult
	release  chan struct{}
	once     sync.Once
	unlocked chan error
	exited   chan struct{}
}

type asyncResult struct {
	err   error
	fence int64
	at    time.Time // when LockContext returned
}

func lockAsync(t testing.TB, m *DistMutex, reg *fencedRegister, who string) *asyncLock {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := &asyncLock{
		locked:   make(chan asyncResult, 1),
		release:  make(chan struct{}),
		unlocked: make(chan error, 1),
		exited:   make(chan struct{}),
	}
	go func() {
		defer close(a.exited)
		err := m.LockContext(ctx)
		at := time.Now()
		if err != nil {
			a.locked <- asyncResult{err: err, at: at}
			return
		}
		end := func() {}
		if reg != nil {
			end = reg.begin(who, m.Fence(), m.spec.fence != fenceOff)
		}
		a.locked <- asyncResult{fence: m.Fence(), at: at}
		select {
		case <-a.release:
		case <-ctx.Done():
		}
		end()
		a.unlocked <- m.UnlockContext(context.Background())
	}()
	t.Cleanup(func() {
		cancel()
		<-a.exited
	})
	return a
}

// unlock lets the goroutine unlock.
func (a *asyncLock) unlock() { a.once.Do(func() { close(a.release) }) }

// replicaOf returns a replica of master.
func (tc *testCluster) replicaOf(t testing.TB, master *clusterNode) *clusterNode {
	t.Helper()
	for _, r := range tc.replicas {
		if r.master == master {
			return r
		}
	}
	t.Fatalf("no replica of %v", master)
	return nil
}

// errSink collects what a Client's error handler hears.
type errSink struct {
	mu   sync.Mutex
	errs []error
}

func (s *errSink) handle(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, err)
}

// count returns how many of the errors heard so far match target.
func (s *errSink) count(target error) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, err := range s.errs {
		if errors.Is(err, target) {
			n++
		}
	}
	return n
}

// settleDialers makes the end of the test wait (up to 3s) until go-redis
// has no dial-retry goroutine left. After a server is killed for good, a
// connection pool keeps one that sleeps a second between dials and notices
// only then that its pool was closed; the suite's goroutine-leak check
// must not find it. Call it first, so that it runs after every other
// cleanup.
func settleDialers(t testing.TB) {
	t.Helper()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		buf := make([]byte, 1<<20)
		for time.Now().Before(deadline) {
			n := runtime.Stack(buf, true)
			if !bytes.Contains(buf[:n], []byte("pool.(*ConnPool).tryDial")) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
