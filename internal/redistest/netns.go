package redistest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// A Net is a test network of Linux network namespaces that the test makes
// itself: one namespace per node (a redis-server, a holder process), each
// with one interface (eth0, an address of 192.0.2.0/24, TEST-NET-1, which
// is never routed), joined by a veth pair to a bridge in a namespace of its
// own. Nothing is done in the namespace the test runs in: no interface,
// address or route of the host is touched. Processes reach the test through
// their stdin and stdout and through unix sockets (path-based unix sockets
// cross network namespaces), which no cut reaches.
//
// Cuts (see Isolate, CutOut, CutIn) need nothing but iproute2: a bridge port
// that is down cuts its node off both ways; a pfifo qdisc of limit 0 drops
// everything leaving an interface, so on one end of a veth pair it cuts one
// direction. Heal undoes every cut.
//
// Everything needs root and the ip and tc programs (Debian's iproute2):
// without them the tests that use a Net skip saying why, unless
// REMUTEX_REQUIRE_NETNS=1, when they fail instead. The namespaces are
// removed at the end of the test, failed or not; those of a test run that
// was killed are removed by the next NewNet (their names carry the pid of
// the run that made them).
type Net struct {
	prefix string // of every namespace of this Net: netnsPrefix<pid>-<n>-
	bridge string // the bridge's namespace

	mu    sync.Mutex
	nodes map[string]*NetNode
	cuts  map[cut]bool // applied, for Heal
}

// NetNode is one namespace of a Net.
type NetNode struct {
	Name string // as given to NewNet
	NS   string // the namespace's name (for ip netns exec)
	IP   string // its address, 192.0.2.<n>
	port string // its end of the veth pair in the bridge's namespace
}

// cut is one applied cut: a bridge port down, or a dropping qdisc on an
// interface of a namespace.
type cut struct {
	ns, dev string
	down    bool // link down rather than qdisc
}

// NetnsRequireEnv is the environment variable that, set to 1, makes a test
// that needs network namespaces fail where it cannot make them instead of
// skipping. CI sets it (and runs as root).
const NetnsRequireEnv = "REMUTEX_REQUIRE_NETNS"

// netnsPrefix begins the name of every namespace a Net makes.
const netnsPrefix = "rmxt-"

var nets atomic.Int64

// RequireNetns skips the test, saying why, unless network namespaces can be
// made here (root, ip and tc on PATH); with REMUTEX_REQUIRE_NETNS=1 it fails
// it instead.
func RequireNetns(t testing.TB) {
	t.Helper()
	var why string
	switch {
	case os.Geteuid() != 0:
		why = "network namespaces need root"
	default:
		for _, p := range []string{"ip", "tc"} {
			if _, err := exec.LookPath(p); err != nil {
				why = p + " not on PATH (install iproute2)"
				break
			}
		}
	}
	if why == "" {
		return
	}
	if os.Getenv(NetnsRequireEnv) == "1" {
		t.Fatalf("%s, and %s=1", why, NetnsRequireEnv)
	}
	t.Skipf("%s: set %s=1 to make this a failure", why, NetnsRequireEnv)
}

// NewNet makes a network of one namespace per name (at most 200), removed at
// the end of the test. It skips the test as RequireNetns does.
func NewNet(t testing.TB, names ...string) *Net {
	t.Helper()
	RequireNetns(t)
	if len(names) > 200 {
		t.Fatalf("NewNet: %d nodes, want at most 200", len(names))
	}
	removeStaleNetns(t)
	n := &Net{
		prefix: fmt.Sprintf("%s%d-%d-", netnsPrefix, os.Getpid(), nets.Add(1)),
		nodes:  map[string]*NetNode{},
		cuts:   map[cut]bool{},
	}
	n.bridge = n.prefix + "br"
	t.Cleanup(n.remove)
	steps := [][]string{
		{"netns", "add", n.bridge},
		{"-n", n.bridge, "link", "add", "br0", "type", "bridge"},
		{"-n", n.bridge, "link", "set", "br0", "up"},
	}
	for i, name := range names {
		if _, dup := n.nodes[name]; dup || name == "" || strings.ContainsAny(name, " /") {
			t.Fatalf("NewNet: node name %q: want distinct names without spaces or slashes", name)
		}
		node := &NetNode{Name: name, NS: n.prefix + name, IP: "192.0.2." + strconv.Itoa(i+1), port: "p" + strconv.Itoa(i+1)}
		n.nodes[name] = node
		steps = append(steps,
			[]string{"netns", "add", node.NS},
			[]string{"-n", n.bridge, "link", "add", node.port, "type", "veth", "peer", "name", "eth0", "netns", node.NS},
			[]string{"-n", n.bridge, "link", "set", node.port, "master", "br0"},
			[]string{"-n", n.bridge, "link", "set", node.port, "up"},
			[]string{"-n", node.NS, "addr", "add", node.IP + "/24", "dev", "eth0"},
			[]string{"-n", node.NS, "link", "set", "eth0", "up"},
			[]string{"-n", node.NS, "link", "set", "lo", "up"},
		)
	}
	for _, s := range steps {
		if err := run("ip", s...); err != nil {
			t.Fatalf("making the test network: %v", err)
		}
	}
	return n
}

// run runs a program and returns its output as the error if it fails.
func run(prog string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command(prog, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", prog, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// remove deletes the namespaces of n (their veth pairs go with them).
func (n *Net) remove() {
	for _, node := range n.nodes {
		_ = run("ip", "netns", "del", node.NS)
	}
	_ = run("ip", "netns", "del", n.bridge)
}

// removeStaleNetns deletes the namespaces that a Net of a test run that no
// longer exists left behind (it was killed before its cleanup).
func removeStaleNetns(t testing.TB) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], netnsPrefix) {
			continue
		}
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(f[0], netnsPrefix), "-", 2)[0])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue // not ours, or its run is alive
		}
		if err := run("ip", "netns", "del", f[0]); err != nil {
			t.Logf("removing a stale namespace: %v", err)
		}
	}
}

// Node returns the node called name, failing the test if there is none.
func (n *Net) Node(t testing.TB, name string) *NetNode {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	node, ok := n.nodes[name]
	if !ok {
		t.Fatalf("no node %q in the test network", name)
	}
	return node
}

// node is Node for the nemesis, which reports instead of failing.
func (n *Net) node(name string) (*NetNode, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	node, ok := n.nodes[name]
	if !ok {
		return nil, fmt.Errorf("no node %q in the test network", name)
	}
	return node, nil
}

// wrap is the command that runs a program in the node's namespace.
func (node *NetNode) wrap() []string { return []string{"ip", "netns", "exec", node.NS} }

// NetServerPort is the port of the redis-servers of StartServer: each node
// has a namespace of its own, so one port serves for all.
const NetServerPort = 6379

// StartServer starts a redis-server in the namespace of node, on its address
// (Addr is IP:NetServerPort) and on a unix socket in a directory of the
// test's (UnixSocket), through which the test reaches it whatever is cut. It
// is stopped at the end of the test.
func (n *Net) StartServer(t testing.TB, node string, extra ...string) *Server {
	t.Helper()
	nd := n.Node(t, node)
	dir := socketDir(t)
	s := &Server{bin: Require(t, "redis-server"), port: NetServerPort, dir: dir,
		host: nd.IP, unix: dir + "/redis.sock", wrap: nd.wrap(),
		// Protected mode refuses clients from other addresses than loopback
		// to a server without a password: here every client is one.
		args: append([]string{"--protected-mode", "no"}, extra...)}
	if err := s.start(); err != nil {
		t.Fatalf("starting redis-server in %s: %v", nd.NS, err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartChild is StartChild in the namespace of node.
func (n *Net) StartChild(t testing.TB, node, role, id string, env ...string) *Child {
	t.Helper()
	return startChild(t, n.Node(t, node).wrap(), role, id, env)
}

// Isolate cuts node off from every other node, both ways (its bridge port
// goes down).
func (n *Net) Isolate(node string) error {
	nd, err := n.node(node)
	if err != nil {
		return err
	}
	return n.apply(cut{ns: n.bridge, dev: nd.port, down: true})
}

// CutOut drops everything node sends (its side of the veth pair drops all
// it would transmit); what others send still reaches it.
func (n *Net) CutOut(node string) error {
	nd, err := n.node(node)
	if err != nil {
		return err
	}
	return n.apply(cut{ns: nd.NS, dev: "eth0"})
}

// CutIn drops everything sent to node (its bridge port drops all it would
// deliver); what it sends still reaches the others.
func (n *Net) CutIn(node string) error {
	nd, err := n.node(node)
	if err != nil {
		return err
	}
	return n.apply(cut{ns: n.bridge, dev: nd.port})
}

func (n *Net) apply(c cut) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var err error
	if c.down {
		err = run("ip", "-n", c.ns, "link", "set", c.dev, "down")
	} else {
		err = run("tc", "-n", c.ns, "qdisc", "replace", "dev", c.dev, "root", "pfifo", "limit", "0")
	}
	if err == nil {
		n.cuts[c] = true
	}
	return err
}

// Heal undoes every cut.
func (n *Net) Heal() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []string
	for c := range n.cuts {
		var err error
		if c.down {
			err = run("ip", "-n", c.ns, "link", "set", c.dev, "up")
		} else {
			err = run("tc", "-n", c.ns, "qdisc", "del", "dev", c.dev, "root")
		}
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		delete(n.cuts, c)
	}
	if len(errs) > 0 {
		return fmt.Errorf("healing the test network: %s", strings.Join(errs, "; "))
	}
	return nil
}
