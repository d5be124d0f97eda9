package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// hangGuard bounds every wait of the harness for a server to reach a state:
// it turns a hang into a failure and is never a performance target.
const hangGuard = 20 * time.Second

// adminCtx bounds an administrative command.
func adminCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	t.Cleanup(cancel)
	return ctx
}

// WaitFor polls cond until it holds, failing the test after timeout. It is
// for states that announce nothing (a server's, a file's); where an event
// can be awaited, await it.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newRDB returns a go-redis client for addr, closed at the end of the test.
func newRDB(t testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// StartServers starts n independent redis-servers, e.g. for a quorum.
func StartServers(t testing.TB, n int) []*Server {
	t.Helper()
	srvs := make([]*Server, n)
	for i := range srvs {
		srvs[i] = Start(t)
	}
	return srvs
}

// ReplicaPair is a primary and a replica of it. Link is the replica's path
// to the primary when it goes through a Proxy (which can hold the
// replication stream), else nil.
type ReplicaPair struct {
	Primary, Replica *Server
	Link             *Proxy
}

// StartReplicaPair starts a primary and a replica of it (through a Proxy
// when proxied) and waits until the replica is in sync and acknowledges.
func StartReplicaPair(t testing.TB, proxied bool) *ReplicaPair {
	t.Helper()
	p := &ReplicaPair{Primary: Start(t, "--repl-diskless-sync-delay", "0")}
	target := p.Primary.Addr()
	if proxied {
		p.Link = NewProxy(t, target)
		target = p.Link.Addr()
	}
	host, port, _ := strings.Cut(target, ":")
	p.Replica = Start(t, "--replicaof", host, port)
	awaitInSync(t, p.Primary, []*Server{p.Replica})
	return p
}

// awaitInSync waits until every one of replicas is in sync with primary and
// acknowledges its writes.
func awaitInSync(t testing.TB, primary *Server, replicas []*Server) {
	t.Helper()
	ctx := adminCtx(t)
	prdb := newRDB(t, primary.Addr())
	var rrdbs []*redis.Client
	for _, r := range replicas {
		rrdbs = append(rrdbs, newRDB(t, r.Addr()))
	}
	n := len(replicas)
	WaitFor(t, hangGuard, fmt.Sprintf("%d replicas in sync with the primary and acknowledging", n), func() bool {
		for _, rrdb := range rrdbs {
			if r, err := rrdb.Info(ctx, "replication").Result(); err != nil || !strings.Contains(r, "master_link_status:up") {
				return false
			}
		}
		m, err := prdb.Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(m, fmt.Sprintf("connected_slaves:%d", n)) || strings.Count(m, "state=online") != n {
			return false
		}
		acks, err := prdb.Wait(ctx, n, 100*time.Millisecond).Result()
		return err == nil && acks == int64(n)
	})
}

// Node is one redis-server of a Cluster.
type Node struct {
	*Server
	RDB    *redis.Client // an administrative connection
	ID     string        // CLUSTER MYID
	Master *Node         // for a replica, its master

	savedConf []byte // its nodes.conf as KillMaster saved it, for Rejoin
}

func (n *Node) String() string { return n.Addr() }

// Cluster is a Redis Cluster of redis-servers on 127.0.0.1.
type Cluster struct {
	Masters, Replicas []*Node
}

// StartCluster starts masters masters (at least 3) with replicasPer
// replicas each, joins them with redis-cli --cluster create, and waits until
// every node reports cluster_state:ok, knows every other node, and every
// replica is in sync. extra are arguments of every server, after the
// harness's own (e.g. "--cluster-node-timeout", "1000": 5000 unless given).
// A cluster-node-timeout in extra is set once the cluster has formed: a
// short one during formation lets a busy machine's slow gossip fail nodes
// over before the cluster is ever ok. The servers are stopped at the end
// of the test.
func StartCluster(t testing.TB, masters, replicasPer int, extra ...string) *Cluster {
	t.Helper()
	bin := Require(t, "redis-server")
	cli := Require(t, "redis-cli")
	extra, nodeTimeout := splitArg(extra, "--cluster-node-timeout")
	nodes := launchNodes(t, bin, masters*(1+replicasPer), extra)
	ctx := adminCtx(t)
	args := []string{"--cluster", "create"}
	for _, n := range nodes {
		n.RDB = newRDB(t, n.Addr())
		id, err := n.RDB.Do(ctx, "cluster", "myid").Text()
		if err != nil {
			t.Fatalf("CLUSTER MYID on %v: %v", n, err)
		}
		n.ID = id
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPer), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c := &Cluster{}
	formCtx, cancel := context.WithTimeout(context.Background(), formGuard+hangGuard)
	defer cancel()
	awaitFormed(t, formCtx, c, nodes, masters)
	ctx = adminCtx(t)
	if nodeTimeout != "" {
		for _, n := range nodes {
			if err := n.RDB.ConfigSet(ctx, "cluster-node-timeout", nodeTimeout).Err(); err != nil {
				t.Fatalf("CONFIG SET cluster-node-timeout on %v: %v", n, err)
			}
		}
	}
	for _, r := range c.Replicas {
		repl := r.RDB.Info(ctx, "replication").Val()
		for _, m := range c.Masters {
			if strings.Contains(repl, "master_port:"+strconv.Itoa(m.Port())+"\r") {
				r.Master = m
			}
		}
		if r.Master == nil {
			t.Fatalf("replica %v: master not found in %q", r, repl)
		}
	}
	return c
}

// launchNodes starts n cluster-enabled servers at once, stopped at the end
// of the test.
func launchNodes(t testing.TB, bin string, n int, extra []string) []*Node {
	t.Helper()
	nodes := make([]*Node, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range nodes {
		dir := t.TempDir()
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv, err := launchClusterNode(bin, dir, extra)
			if err != nil {
				errs <- err
				return
			}
			nodes[i] = &Node{Server: srv}
		}()
	}
	wg.Wait()
	for _, n := range nodes {
		if n != nil {
			t.Cleanup(n.Stop)
		}
	}
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	return nodes
}

// launchClusterNode starts a cluster-enabled redis-server in dir, with
// extra arguments after its own. The cluster bus gets a free port of its
// own where the server has the cluster-port directive (Redis 7): the
// default, the client port + 10000, may be taken or out of range. Older
// servers (Redis 6.2) listen on the client port + 10000, so the client port
// is chosen with that port free too.
func launchClusterNode(bin, dir string, extra []string) (*Server, error) {
	v, err := BinaryVersion(bin)
	if err != nil {
		return nil, err
	}
	for try := 0; try < 5; try++ {
		sub, derr := os.MkdirTemp(dir, "node")
		if derr != nil {
			return nil, derr
		}
		args := append(ClusterArgs(v), "--cluster-node-timeout", "5000", "--repl-diskless-sync-delay", "0")
		args = append(args, extra...)
		var port int
		if port, err = FreePortWithBus(v); err != nil {
			continue
		}
		var srv *Server
		if srv, err = LaunchOn(bin, sub, port, args...); err == nil {
			return srv, nil
		}
	}
	return nil, fmt.Errorf("starting a cluster node of %v: %w", v, err)
}

// ClusterArgs returns the arguments that make a server of version v a
// cluster node, with its configuration in nodes.conf of its directory and,
// where v has the directive, its bus on a free port of its own (a server
// without it must be started on a port from FreePortWithBus).
func ClusterArgs(v Version) []string {
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"}
	if v.ClusterPort() {
		if bus, err := FreePort(); err == nil {
			args = append(args, "--cluster-port", strconv.Itoa(bus))
		}
	}
	return args
}

// busOffset is where a server without cluster-port puts its cluster bus:
// the client port + 10000.
const busOffset = 10000

// freePortWithBus returns a loopback port that was free a moment ago, with
// the port busOffset above it free too.
func freePortWithBus() (int, error) {
	for try := 0; try < 100; try++ {
		port, err := FreePort()
		if err != nil {
			return 0, err
		}
		if port+busOffset <= 65535 {
			if bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+busOffset)); err == nil {
				_ = bus.Close()
				return port, nil
			}
		}
	}
	return 0, fmt.Errorf("no free port with port+%d free after 100 tries", busOffset)
}

// FreePortWithBus returns a port for a cluster node of version v: any free
// port where v has cluster-port, else one whose port + 10000, the bus, is
// free too.
func FreePortWithBus(v Version) (int, error) {
	if v.ClusterPort() {
		return FreePort()
	}
	return freePortWithBus()
}

// Addrs returns the addresses of the masters.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, n := range c.Masters {
		a = append(a, n.Addr())
	}
	return a
}

// Client returns a new ClusterClient (a pool of its own, standing for a
// separate process), closed at the end of the test.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Slot returns the slot of key, as the server computes it.
func (c *Cluster) Slot(t testing.TB, key string) int {
	t.Helper()
	s, err := c.Masters[0].RDB.ClusterKeySlot(adminCtx(t), key).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
	}
	return int(s)
}

// Owner returns the master that serves slot according to CLUSTER SLOTS on
// asked.
func (c *Cluster) Owner(t testing.TB, asked *Node, slot int) *Node {
	t.Helper()
	ranges, err := asked.RDB.ClusterSlots(adminCtx(t)).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS on %v: %v", asked, err)
	}
	for _, r := range ranges {
		if r.Start <= slot && slot <= r.End && len(r.Nodes) > 0 {
			for _, n := range c.Masters {
				if n.ID == r.Nodes[0].ID {
					return n
				}
			}
		}
	}
	t.Fatalf("no master serves slot %d according to %v", slot, asked)
	return nil
}

// ReplicaOf returns a replica of master.
func (c *Cluster) ReplicaOf(t testing.TB, master *Node) *Node {
	t.Helper()
	for _, r := range c.Replicas {
		if r.Master == master {
			return r
		}
	}
	t.Fatalf("no replica of %v", master)
	return nil
}

// RequireShardedPubSub skips the test where the redis-server on PATH has
// no sharded pub/sub (Redis 6.2): there is no shard subscription to count,
// and a cluster's release messages go by PUBLISH, which every node relays.
func RequireShardedPubSub(t testing.TB) {
	t.Helper()
	if v := ServerVersion(t); !v.ShardedPubSub() {
		t.Skipf("%v has no sharded pub/sub (SPUBLISH): this test counts shard subscriptions", v)
	}
}

// SubscribeShard subscribes to channel on n, as a Client of the locks of
// its slot does: SSUBSCRIBE where the server has sharded pub/sub, else
// SUBSCRIBE (a PUBLISH on any node of the cluster reaches it).
func (n *Node) SubscribeShard(ctx context.Context, channel string) *redis.PubSub {
	if v, err := BinaryVersion(n.bin); err == nil && !v.ShardedPubSub() {
		return n.RDB.Subscribe(ctx, channel)
	}
	return n.RDB.SSubscribe(ctx, channel)
}

// ShardSubs returns the shard-channel subscribers of channel on n.
func (n *Node) ShardSubs(t testing.TB, channel string) int64 {
	t.Helper()
	m, err := n.RDB.PubSubShardNumSub(adminCtx(t), channel).Result()
	if err != nil {
		t.Fatalf("PUBSUB SHARDNUMSUB on %v: %v", n, err)
	}
	return m[channel]
}

// KeysWithPrefix returns the keys beginning with prefix on the server of
// rdb, sorted (a test server: KEYS is fine).
func KeysWithPrefix(t testing.TB, rdb *redis.Client, prefix string) []string {
	t.Helper()
	keys, err := rdb.Keys(adminCtx(t), prefix+"*").Result()
	if err != nil {
		t.Fatalf("KEYS %s* on %v: %v", prefix, rdb.Options().Addr, err)
	}
	sort.Strings(keys)
	return keys
}

// BeginMigration marks slot as moving from src to dst (IMPORTING on dst,
// MIGRATING on src), as redis-cli --cluster reshard does.
func (c *Cluster) BeginMigration(t testing.TB, slot int, src, dst *Node) {
	t.Helper()
	ctx := adminCtx(t)
	if err := dst.RDB.Do(ctx, "cluster", "setslot", slot, "importing", src.ID).Err(); err != nil {
		t.Fatalf("CLUSTER SETSLOT %d IMPORTING on %v: %v", slot, dst, err)
	}
	if err := src.RDB.Do(ctx, "cluster", "setslot", slot, "migrating", dst.ID).Err(); err != nil {
		t.Fatalf("CLUSTER SETSLOT %d MIGRATING on %v: %v", slot, src, err)
	}
}

// MigrateKeys moves keys from src to dst with MIGRATE; with no keys given,
// it moves every key of slot (CLUSTER GETKEYSINSLOT) until none is left. It
// returns the keys it moved.
func (c *Cluster) MigrateKeys(t testing.TB, slot int, src, dst *Node, keys ...string) []string {
	t.Helper()
	ctx := adminCtx(t)
	all := len(keys) == 0
	var moved []string
	for {
		if all {
			var err error
			keys, err = src.RDB.ClusterGetKeysInSlot(ctx, slot, 100).Result()
			if err != nil {
				t.Fatalf("CLUSTER GETKEYSINSLOT %d on %v: %v", slot, src, err)
			}
		}
		if len(keys) == 0 {
			return moved
		}
		args := []interface{}{"migrate", "127.0.0.1", dst.Port(), "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		// NOKEY: the keys expired meanwhile, which is fine.
		if err := src.RDB.Do(ctx, args...).Err(); err != nil && !strings.HasPrefix(err.Error(), "NOKEY") {
			t.Fatalf("MIGRATE %v from %v to %v: %v", keys, src, dst, err)
		}
		moved = append(moved, keys...)
		if !all {
			return moved
		}
	}
}

// EndMigration assigns slot to dst on every master, dst and the source
// first, as redis-cli --cluster reshard does, and waits until every node of
// the cluster says dst serves it.
func (c *Cluster) EndMigration(t testing.TB, slot int, src, dst *Node) {
	t.Helper()
	ctx := adminCtx(t)
	order := []*Node{dst, src}
	for _, n := range c.Masters {
		if n != dst && n != src {
			order = append(order, n)
		}
	}
	for _, n := range order {
		if err := n.RDB.Do(ctx, "cluster", "setslot", slot, "node", dst.ID).Err(); err != nil {
			t.Fatalf("CLUSTER SETSLOT %d NODE on %v: %v", slot, n, err)
		}
	}
	WaitFor(t, hangGuard, fmt.Sprintf("every node saying %v serves slot %d", dst, slot), func() bool {
		for _, n := range append(append([]*Node(nil), c.Masters...), c.Replicas...) {
			if !n.serves(ctx, slot, dst) {
				return false
			}
		}
		return true
	})
}

// serves reports whether n says that master serves slot.
func (n *Node) serves(ctx context.Context, slot int, master *Node) bool {
	ranges, err := n.RDB.ClusterSlots(ctx).Result()
	if err != nil {
		return false
	}
	for _, r := range ranges {
		if r.Start <= slot && slot <= r.End && len(r.Nodes) > 0 && r.Nodes[0].ID == master.ID {
			return true
		}
	}
	return false
}

// KillMaster kills master (SIGKILL) and returns its replica, which the
// cluster will promote (see AwaitPromotion).
func (c *Cluster) KillMaster(t testing.TB, master *Node) *Node {
	t.Helper()
	r := c.ReplicaOf(t, master)
	// A copy of its cluster configuration, saved whole, for Rejoin: a kill
	// that comes while the server rewrites nodes.conf may leave it cut short.
	if err := master.RDB.Do(adminCtx(t), "cluster", "saveconfig").Err(); err == nil {
		master.savedConf, _ = os.ReadFile(filepath.Join(master.dir, "nodes.conf"))
	}
	master.Stop()
	return r
}

// AwaitPromotion waits until replica, whose master was killed, is a master
// that every live node says serves slot, and every live node reports
// cluster_state:ok again. Masters and Replicas are updated: replica takes
// its dead master's place. The cluster's failover starts once the master was
// unreachable for the cluster-node-timeout.
func (c *Cluster) AwaitPromotion(t testing.TB, slot int, replica *Node) {
	t.Helper()
	ctx := adminCtx(t)
	dead := replica.Master
	var live []*Node
	for _, n := range append(append([]*Node(nil), c.Masters...), c.Replicas...) {
		if n != dead {
			live = append(live, n)
		}
	}
	WaitFor(t, hangGuard, fmt.Sprintf("%v promoted to serve slot %d on every node", replica, slot), func() bool {
		for _, n := range live {
			info, err := n.RDB.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !n.serves(ctx, slot, replica) {
				return false
			}
		}
		return true
	})
	for i, m := range c.Masters {
		if m == dead {
			c.Masters[i] = replica
		}
	}
	c.Replicas = slices.DeleteFunc(c.Replicas, func(n *Node) bool { return n == replica })
	replica.Master = nil
}

// Rejoin restarts node, a master that was killed and failed over, with its
// cluster configuration (as a supervisor restarts a crashed server): it
// comes back as a replica of master, the node that replaced it. Rejoin waits
// until master has it in sync and acknowledging.
//
// A server may refuse the configuration it saved ("corrupted cluster config
// file"), for one of two reasons: the kill came while it rewrote nodes.conf
// and cut it short; or (Redis 7.2+, Valkey) it saved a replica in another
// shard than its primary's, as gossip had told it so far. Rejoin then starts
// it from the copy KillMaster saved, with each replica put in its primary's
// shard (see followPrimaryShards), as an operator mends the file by hand.
func (c *Cluster) Rejoin(t testing.TB, node, master *Node) {
	t.Helper()
	if err := node.start(); err != nil {
		conf := node.savedConf
		if conf == nil {
			conf, _ = os.ReadFile(filepath.Join(node.dir, "nodes.conf"))
		}
		if len(conf) > 0 {
			t.Logf("restarting %v: %v; again with its configuration as saved before the kill, each replica in its primary's shard", node, err)
			if werr := os.WriteFile(filepath.Join(node.dir, "nodes.conf"), followPrimaryShards(conf), 0o600); werr != nil {
				t.Fatal(werr)
			}
		}
		node.Restart(t)
	}
	awaitInSync(t, master.Server, []*Server{node.Server})
	node.Master = master
	c.Replicas = append(c.Replicas, node)
}

// followPrimaryShards returns conf, the text of a cluster node's nodes.conf,
// with each replica's shard-id set to its primary's, where both are in it.
// A node loads a replica whose shard-id differs from its primary's as a
// corrupted file and refuses to start; the cluster tells the node the
// shards' ids again once it is back. Lines without shard-ids (servers
// before Redis 7.2) are left as they are.
func followPrimaryShards(conf []byte) []byte {
	lines := strings.Split(string(conf), "\n")
	shard := map[string]string{} // node id → shard id
	for _, l := range lines {
		if f := strings.Fields(l); len(f) >= 4 {
			shard[f[0]] = shardID(f[1])
		}
	}
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) < 4 || f[3] == "-" {
			continue
		}
		own, primary := shardID(f[1]), shard[f[3]]
		if own != "" && primary != "" && own != primary {
			lines[i] = strings.Replace(l, "shard-id="+own, "shard-id="+primary, 1)
		}
	}
	return []byte(strings.Join(lines, "\n"))
}

// shardID returns the shard-id in addr, a nodes.conf address field
// ("127.0.0.1:6379@16379,,tls-port=0,shard-id=ID"), or "" if it has none.
func shardID(addr string) string {
	for _, aux := range strings.Split(addr, ",") {
		if id, ok := strings.CutPrefix(aux, "shard-id="); ok {
			return id
		}
	}
	return ""
}
