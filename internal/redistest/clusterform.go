package redistest

// Forming a new cluster: waiting until its nodes agree, and helping them
// to (see StartCluster).

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// awaitFormed waits until sortRoles finds the cluster ready, failing the
// test with what it found last if that takes longer than formGuard. Every
// remeetEvery it has nodes meet those they do not know: a server drops a
// handshake that does not complete within its node timeout (on a busy
// machine), and redis-cli --cluster create meets each node once.
func awaitFormed(t testing.TB, ctx context.Context, c *Cluster, nodes []*Node, masters int) {
	t.Helper()
	deadline := time.Now().Add(formGuard)
	remeet := time.Now().Add(remeetEvery)
	for {
		missing := c.sortRoles(ctx, nodes, masters)
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not formed after %v: %s", formGuard, missing)
		}
		if time.Now().After(remeet) {
			meetUnknown(ctx, nodes)
			remeet = time.Now().Add(remeetEvery)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// remeetEvery is how often awaitFormed has the nodes meet again.
const remeetEvery = time.Second

// meetUnknown has every node meet each other node it does not know (CLUSTER
// MEET with the address and bus port the other reports for itself). Errors
// are left to the caller's wait.
func meetUnknown(ctx context.Context, nodes []*Node) {
	self := make([][]interface{}, len(nodes)) // each node's MEET arguments
	known := make([]map[string]bool, len(nodes))
	for i, m := range nodes {
		out, err := m.RDB.ClusterNodes(ctx).Result()
		if err != nil {
			return
		}
		known[i] = map[string]bool{}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) < 3 {
				continue
			}
			addr, _, _ := strings.Cut(f[1], ",") // ip:port@cport[,hostname]
			hostPort, cport, _ := strings.Cut(addr, "@")
			known[i][hostPort] = true
			if strings.Contains(f[2], "myself") {
				host, port, _ := strings.Cut(hostPort, ":")
				self[i] = []interface{}{"cluster", "meet", host, port}
				if cport != "" && cport != strconv.Itoa(m.Port()+busOffset) {
					self[i] = append(self[i], cport)
				}
			}
		}
	}
	for i, n := range nodes {
		for j, meet := range self {
			if j != i && meet != nil && !known[i][meet[2].(string)+":"+meet[3].(string)] {
				_ = n.RDB.Do(ctx, meet...).Err()
			}
		}
	}
}

// formGuard bounds the wait for a new cluster to form: longer than
// hangGuard, because a busy machine's gossip between six servers takes a
// while to agree, and it too only turns a hang into a failure.
const formGuard = 3 * hangGuard

// sortRoles fills Masters and Replicas from nodes and says what the cluster
// lacks to be ready ("" when it is): every node ok and knowing all, masters
// masters, every replica's link up.
func (c *Cluster) sortRoles(ctx context.Context, nodes []*Node, masters int) string {
	c.Masters, c.Replicas = nil, nil
	for _, n := range nodes {
		info, err := n.RDB.ClusterInfo(ctx).Result()
		switch {
		case err != nil:
			return fmt.Sprintf("CLUSTER INFO on %v: %v", n, err)
		case !strings.Contains(info, "cluster_state:ok"):
			return fmt.Sprintf("%v is not cluster_state:ok", n)
		case !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r", len(nodes))):
			return fmt.Sprintf("%v does not know all %d nodes", n, len(nodes))
		}
		repl, err := n.RDB.Info(ctx, "replication").Result()
		switch {
		case err != nil:
			return fmt.Sprintf("INFO replication on %v: %v", n, err)
		case strings.Contains(repl, "role:master"):
			c.Masters = append(c.Masters, n)
		case strings.Contains(repl, "master_link_status:up"):
			c.Replicas = append(c.Replicas, n)
		default:
			return fmt.Sprintf("replica %v's link to its master is not up", n)
		}
	}
	if len(c.Masters) != masters {
		return fmt.Sprintf("%d masters, want %d", len(c.Masters), masters)
	}
	return ""
}

// splitArg removes flag and its value from args, returning the rest and
// the value ("" if args lacks flag).
func splitArg(args []string, flag string) (rest []string, value string) {
	for i := 0; i < len(args); i++ {
		if args[i] == flag && i+1 < len(args) {
			value = args[i+1]
			i++
			continue
		}
		rest = append(rest, args[i])
	}
	return rest, value
}
