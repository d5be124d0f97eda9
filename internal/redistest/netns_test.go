package redistest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// netRole is the child of TestNet, in a namespace of a Net: it pings the
// redis-server at $NETNS_REDIS (emits "ready" once it answered), then for
// each line "set K" sets K with a 500ms bound and emits "set K <ok|error>".
func netRole() int {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("NETNS_REDIS"), MaxRetries: -1,
		ContextTimeoutEnabled: true})
	defer rdb.Close()
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			break
		}
		if try == 10 {
			Emit("fatal", "ping", strings.ReplaceAll(err.Error(), " ", "_"))
			return 1
		}
	}
	Emit("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		key, ok := strings.CutPrefix(sc.Text(), "set ")
		if !ok {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := rdb.Set(ctx, key, "1", 0).Err()
		cancel()
		res := "ok"
		if err != nil {
			res = "error"
		}
		Emit("set", key, res)
	}
	return 0
}

// hostLinks lists the interfaces of the namespace the test runs in.
func hostLinks(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			names = append(names, f[1])
		}
	}
	return strings.Join(names, " ")
}

func netnsList(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestNet: processes in namespaces of a Net reach a redis-server in another
// until a cut, which acts on the nodes and directions it names only; Heal
// undoes it; the namespaces (and those a killed run left) are removed, and
// the host's interfaces are untouched.
func TestNet(t *testing.T) {
	RequireNetns(t)
	Require(t, "redis-server")
	stale := fmt.Sprintf("%s%d-1-x", netnsPrefix, 1<<22-1) // a pid above pid_max: a dead run
	if err := run("ip", "netns", "add", stale); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = run("ip", "netns", "del", stale) })
	links := hostLinks(t)
	var prefix string
	t.Run("cuts", func(t *testing.T) {
		n := NewNet(t, "redis", "a", "b")
		prefix = n.prefix
		if strings.Contains(netnsList(t), stale) {
			t.Errorf("namespace %s of a dead run: got still there after NewNet, want removed", stale)
		}
		srv := n.StartServer(t, "redis")
		if !strings.HasPrefix(srv.Addr(), "192.0.2.") {
			t.Errorf("server address: got %s, want one of 192.0.2.0/24", srv.Addr())
		}
		local := redis.NewClient(&redis.Options{Network: "unix", Addr: srv.UnixSocket()})
		t.Cleanup(func() { _ = local.Close() })
		children := map[string]*Child{}
		for _, node := range []string{"a", "b"} {
			children[node] = n.StartChild(t, node, "redis", node, "NETNS_REDIS="+srv.Addr())
		}
		for _, c := range children {
			c.Expect(t, "ready", hangGuard)
		}
		seq := 0
		// set asks node to set a fresh key and returns the key and whether
		// the reply came.
		set := func(node string) (string, bool) {
			seq++
			key := fmt.Sprintf("%s%d", node, seq)
			children[node].Send(t, "set "+key)
			got := children[node].Expect(t, "set", hangGuard)
			return key, got[1] == "ok"
		}
		// stored reports whether key reached the server (read on its unix
		// socket, which no cut reaches).
		stored := func(key string) bool {
			n, err := local.Exists(ctx(t), key).Result()
			if err != nil {
				t.Fatal(err)
			}
			return n == 1
		}
		// reaches waits until node's sets succeed again (a dial or a
		// retransmission may need a moment after a heal).
		reaches := func(node string) {
			t.Helper()
			for try := 0; ; try++ {
				if _, ok := set(node); ok {
					return
				}
				if try == 20 {
					t.Fatalf("%s: no set succeeded after the heal", node)
				}
			}
		}
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		reaches("a")

		must(n.Isolate("a"))
		if key, ok := set("a"); ok || stored(key) {
			t.Errorf("a isolated: got reply %v, stored %v; want neither", ok, stored(key))
		}
		if _, ok := set("b"); !ok {
			t.Error("a isolated: b's set failed, want it to succeed")
		}
		must(n.Heal())
		reaches("a")

		must(n.CutIn("a"))
		key, ok := set("a")
		if ok || !stored(key) {
			t.Errorf("traffic to a cut: got reply %v, stored %v; want no reply, stored", ok, stored(key))
		}
		must(n.Heal())
		reaches("a")

		must(n.CutOut("a"))
		if key, ok := set("a"); ok || stored(key) {
			t.Errorf("traffic from a cut: got reply %v, stored %v; want neither", ok, stored(key))
		}
		if _, ok := set("b"); !ok {
			t.Error("traffic from a cut: b's set failed, want it to succeed")
		}
		must(n.Heal())
		reaches("a")

		must(n.Isolate("redis"))
		for _, node := range []string{"a", "b"} {
			if key, ok := set(node); ok || stored(key) {
				t.Errorf("redis isolated: %s's set got reply %v, stored %v; want neither", node, ok, stored(key))
			}
		}
		must(n.Heal())
		reaches("a")
		reaches("b")
	})
	if prefix != "" && strings.Contains(netnsList(t), prefix) {
		t.Errorf("namespaces %s*: got still there after the test, want removed:\n%s", prefix, netnsList(t))
	}
	if got := hostLinks(t); got != links {
		t.Errorf("host interfaces: got %s after the test, want %s as before", got, links)
	}
}

// TestStartUnix: a server on a unix socket only, and a register on it.
func TestStartUnix(t *testing.T) {
	srv := StartUnix(t)
	if srv.Port() != 0 || srv.UnixSocket() == "" {
		t.Fatalf("got port %d, socket %q; want port 0 and a socket", srv.Port(), srv.UnixSocket())
	}
	r := NewRegisterOn(t, srv)
	if ok, err := r.Write(ctx(t), 1, "a"); !ok || err != nil {
		t.Fatalf("register write: got (%v, %v), want (true, nil)", ok, err)
	}
	if accepted, _ := r.Check(t); len(accepted) != 1 {
		t.Fatalf("register: got %d accepted writes, want 1", len(accepted))
	}
}

func TestCrowds(t *testing.T) {
	w := func(name string, start, end int64) Write {
		return Write{OK: true, Writer: name, Start: start, End: end}
	}
	cases := []struct {
		name   string
		writes []Write
		limit  int
		want   []string // the writers of each crowd
	}{
		{"two of two", []Write{w("a", 0, 10), w("b", 5, 15), w("c", 12, 20)}, 2, nil},
		{"three of two", []Write{w("a", 0, 10), w("b", 5, 15), w("c", 8, 20)}, 2, []string{"a b c"}},
		{"one after the end", []Write{w("a", 0, 10), w("b", 10, 15)}, 1, nil},
		{"overlap of one", []Write{w("b", 5, 15), w("a", 0, 10)}, 1, []string{"a b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range Crowds(tc.writes, tc.limit) {
				var names []string
				for _, w := range c {
					names = append(names, w.Writer)
				}
				got = append(got, strings.Join(names, " "))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got crowds %q, want %q", got, tc.want)
			}
		})
	}
}
