package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	if role := ChildRole(); role != "" {
		os.Exit(runRole(role))
	}
	code := m.Run()
	StopShared()
	os.Exit(code)
}

// runRole is the child of TestChild: "echo" answers each line it reads; and
// of TestNet: "redis" (see netRole).
func runRole(role string) int {
	if role == "redis" {
		return netRole()
	}
	if role != "echo" {
		Emit("fatal", "unknown-role", role)
		return 2
	}
	Emit("ready", os.Getenv("ECHO_GREETING"))
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		Emit("echo", sc.Text())
	}
	return 0
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), hangGuard)
	t.Cleanup(cancel)
	return c
}

func TestServerRestartAndPause(t *testing.T) {
	s := Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Set(ctx(t), "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: got %v, want nil", err)
	}
	s.Restart(t)
	if n, err := rdb.Exists(ctx(t), "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS k after Restart: got (%d, %v), want (0, nil): nothing persists", n, err)
	}

	s.Signal(t, syscall.SIGSTOP)
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err := rdb.Ping(short).Err()
	cancel()
	if err == nil {
		t.Fatal("PING of a paused server: got an answer, want a timeout")
	}
	s.Signal(t, syscall.SIGCONT)
	if err := rdb.Ping(ctx(t)).Err(); err != nil {
		t.Fatalf("PING after SIGCONT: got %v, want nil", err)
	}

	s.Stop()
	s.Stop() // a second Stop does nothing
	short, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := rdb.Ping(short).Err(); err == nil {
		t.Fatal("PING of a stopped server: got an answer, want an error")
	}
}

func TestServerArgs(t *testing.T) {
	s := Start(t, "--maxmemory", "1mb")
	got, err := newRDB(t, s.Addr()).ConfigGet(ctx(t), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"bind": "127.0.0.1", "save": "", "appendonly": "no", "maxmemory": "1048576", "dir": s.Dir()}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("CONFIG GET %s: got %q, want %q", k, got[k], v)
		}
	}
}

func TestShared(t *testing.T) {
	if a, b := Shared(t), Shared(t); a != b {
		t.Fatalf("Shared: got two servers, %v and %v, want one", a.Addr(), b.Addr())
	}
}

// TestProxy checks each fault: a paused proxy holds a command until it
// resumes, a blackhole loses it, latency delays its reply, and a cut reply
// leaves the command applied and the connection closed.
func TestProxy(t *testing.T) {
	p := NewProxy(t, Shared(t).Addr())
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	key := "proxy:" + t.Name()

	p.Pause()
	done := make(chan error, 1)
	go func() { done <- rdb.Set(context.Background(), key, "1", 0).Err() }()
	select {
	case err := <-done:
		t.Fatalf("SET through a paused proxy: got %v, want no reply while paused", err)
	case <-time.After(100 * time.Millisecond): // the time passing is the test
	}
	p.Resume()
	if err := <-done; err != nil {
		t.Fatalf("SET after Resume: got %v, want nil", err)
	}

	p.SetLatency(150 * time.Millisecond)
	start := time.Now()
	if err := rdb.Ping(ctx(t)).Err(); err != nil || time.Since(start) < 150*time.Millisecond {
		t.Errorf("PING with 150ms latency: got %v after %v, want nil after 150ms or more", err, time.Since(start))
	}

	p.SetBlackhole(true)
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err := rdb.Ping(short).Err()
	cancel()
	if err == nil {
		t.Error("PING through a blackhole: got an answer, want a timeout")
	}
	p.Heal()
	if err := rdb.Ping(ctx(t)).Err(); err != nil {
		t.Fatalf("PING after Heal: got %v, want nil", err)
	}

	p.CutReplyTo("incr")
	if err := rdb.Incr(ctx(t), key).Err(); err == nil {
		t.Error("INCR whose reply is cut: got a reply, want an error")
	}
	if got := p.ReplyCuts(); got != 1 {
		t.Errorf("ReplyCuts: got %d, want 1", got)
	}
	if got, err := newRDB(t, Shared(t).Addr()).Get(ctx(t), key).Int(); err != nil || got != 2 {
		t.Errorf("the key after an INCR whose reply was cut: got (%d, %v), want (2, nil): applied", got, err)
	}
}

func TestChild(t *testing.T) {
	c := StartChild(t, "echo", "1", "ECHO_GREETING=hello")
	if got := c.Expect(t, "ready", hangGuard); len(got) != 1 || got[0] != "hello" {
		t.Fatalf("ready event: got %q, want [hello]", got)
	}
	c.Send(t, "a b")
	c.Send(t, "c")
	c.Expect(t, "echo", hangGuard) // "a b"
	if got := c.Expect(t, "echo", hangGuard); len(got) != 1 || got[0] != "c" {
		t.Fatalf("second echo: got %q, want [c]", got)
	}
	if c.Has("echo") {
		t.Error("Has(echo) after taking both: got true, want false")
	}
	c.Signal(t, syscall.SIGSTOP)
	c.Kill() // a paused child dies too
	select {
	case <-c.Exited():
	default:
		t.Fatal("Exited after Kill: got open, want closed")
	}
}

// recorder is a testing.TB that records what would fail the test.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func TestRegister(t *testing.T) {
	ctx := ctx(t)
	cases := []struct {
		name  string
		run   func(r *Register) error
		stale int
		want  string // in the one failure, or "" for none
	}{
		{"in turn", func(r *Register) error {
			r.Enter("a", 1)()
			r.Enter("b", 2)()
			return nil
		}, 0, ""},
		{"overlap", func(r *Register) error { // the section that began first is refused at its end
			end := r.Enter("a", 1)
			r.Enter("b", 2)()
			end()
			return nil
		}, 1, ""},
		{"shared fence", func(r *Register) error {
			r.Enter("a", 3)()
			r.Enter("b", 3)()
			return nil
		}, 0, "share a fence"},
		{"stale", func(r *Register) error {
			if ok, err := r.Write(ctx, 5, "a"); !ok || err != nil {
				return fmt.Errorf("first write: got (%v, %v), want (true, nil)", ok, err)
			}
			if ok, err := r.Write(ctx, 4, "b"); ok || err != nil {
				return fmt.Errorf("stale write: got (%v, %v), want (false, nil)", ok, err)
			}
			return nil
		}, 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegister(t)
			if err := tc.run(r); err != nil {
				t.Fatal(err)
			}
			rec := &recorder{TB: t}
			_, stale := r.Check(rec)
			if len(stale) != tc.stale {
				t.Errorf("stale writes: got %v, want %d", stale, tc.stale)
			}
			switch {
			case tc.want == "" && len(rec.errs) != 0:
				t.Errorf("Check: got failures %q, want none", rec.errs)
			case tc.want != "" && (len(rec.errs) != 1 || !strings.Contains(rec.errs[0], tc.want)):
				t.Errorf("Check: got failures %q, want one saying %q", rec.errs, tc.want)
			}
		})
	}
}

// A refused write names the write whose fence it fell below: the highest
// among those that began before it, not merely the last.
func TestRegisterRefusedNamesItsCause(t *testing.T) {
	ctx := ctx(t)
	r := NewRegister(t)
	for _, w := range []struct {
		fence  int64
		writer string
		want   bool
	}{{5, "a", true}, {7, "b", true}, {7, "c", true}, {6, "d", false}} {
		if ok, err := r.Write(ctx, w.fence, w.writer); ok != w.want || err != nil {
			t.Fatalf("write %d by %s: got (%v, %v), want (%v, nil)", w.fence, w.writer, ok, err, w.want)
		}
	}
	_, found := r.Anomalies(t)
	var refused []Anomaly
	for _, a := range found {
		if a.Kind == Refused {
			refused = append(refused, a)
		}
	}
	if len(refused) != 1 || refused[0].B.Writer != "d" || refused[0].A.Writer != "b" || refused[0].A.Fence != 7 {
		t.Fatalf("refused: got %v, want d's write below b's fence 7", refused)
	}
}

func TestRegisterCheckSections(t *testing.T) {
	r := NewRegister(t)
	r.Enter("a", 1)()
	rec := &recorder{TB: t}
	r.CheckSections(rec, 2)
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "got 1 critical sections, want 2") {
		t.Errorf("CheckSections with one section of two: got failures %q, want one counting them", rec.errs)
	}
	_ = r.Close()
	rec = &recorder{TB: t}
	r.Enter("b", 2)()
	r.mu.Lock()
	n := len(r.errs)
	r.mu.Unlock()
	if n != 2 || !errors.Is(r.errs[0], redis.ErrClosed) {
		t.Errorf("Enter on a closed register: got errors %v, want two, of a closed client", r.errs)
	}
}

// TestReplicaPair: a write reaches the replica, except while the proxied
// replication link is paused.
func TestReplicaPair(t *testing.T) {
	p := StartReplicaPair(t, true)
	prdb, rrdb := newRDB(t, p.Primary.Addr()), newRDB(t, p.Replica.Addr())
	p.Link.Pause()
	if err := prdb.Set(ctx(t), "k", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := prdb.Wait(ctx(t), 1, 100*time.Millisecond).Result(); err != nil || n != 0 {
		t.Errorf("WAIT 1 while the link is paused: got (%d, %v), want (0, nil)", n, err)
	}
	p.Link.Resume()
	if n, err := prdb.Wait(ctx(t), 1, hangGuard).Result(); err != nil || n != 1 {
		t.Errorf("WAIT 1 after Resume: got (%d, %v), want (1, nil)", n, err)
	}
	if got, err := rrdb.Get(ctx(t), "k").Result(); err != nil || got != "1" {
		t.Errorf("GET k on the replica: got (%q, %v), want (\"1\", nil)", got, err)
	}
}

// TestSentinel pauses the primary past the sentinels' patience: they
// promote a replica and announce it, a failover client reaches the new
// primary (with the data), and the old primary, resumed, is made a replica
// of the new one (or of a later one, should the new one stall in turn).
func TestSentinel(t *testing.T) {
	t.Parallel()
	s := StartSentinel(t)
	rdb := s.Client(t, redis.FailoverOptions{})
	if err := rdb.Set(ctx(t), "k", "1", 0).Err(); err != nil {
		t.Fatalf("SET through the failover client: got %v, want nil", err)
	}
	old := s.Primary(t)
	if old != s.Servers[0] {
		t.Fatalf("primary: got %v, want the first server %v", old.Addr(), s.Servers[0].Addr())
	}
	if n, err := newRDB(t, old.Addr()).Wait(ctx(t), 2, hangGuard).Result(); err != nil || n != 2 {
		t.Fatalf("WAIT 2: got (%d, %v), want (2, nil)", n, err)
	}
	old.Signal(t, syscall.SIGSTOP)
	promoted, _ := s.AwaitSwitch(t, old)
	if promoted == old {
		t.Fatalf("+switch-master named the paused primary")
	}
	if got := s.Primary(t); got != promoted {
		t.Errorf("primary after the switch: got %v, want %v", got.Addr(), promoted.Addr())
	}
	if got, err := rdb.Get(ctx(t), "k").Result(); err != nil || got != "1" {
		t.Errorf("GET k through the failover client after the switch: got (%q, %v), want (\"1\", nil)", got, err)
	}
	old.Signal(t, syscall.SIGCONT)
	if now, _ := s.AwaitSettled(t); now == old {
		t.Fatalf("the resumed primary %v is the primary again", old.Addr())
	}
	if got, err := rdb.Get(ctx(t), "k").Result(); err != nil || got != "1" {
		t.Errorf("GET k through the failover client after the old primary returned: got (%q, %v), want (\"1\", nil)", got, err)
	}
}

// TestSentinelSecondFailover pauses the primary, and then the replica
// promoted in its place, as a loaded machine can stall it: the sentinels
// promote the last replica, and once both paused servers resume,
// AwaitSettled names it, with both replicating it.
func TestSentinelSecondFailover(t *testing.T) {
	t.Parallel()
	s := StartSentinel(t)
	first := s.Primary(t)
	first.Signal(t, syscall.SIGSTOP)
	second, _ := s.AwaitSwitch(t, first)
	second.Signal(t, syscall.SIGSTOP)
	third, switched := s.AwaitSwitch(t, second)
	if third == first || third == second {
		t.Fatalf("second +switch-master named a paused server %v", third.Addr())
	}
	first.Signal(t, syscall.SIGCONT)
	second.Signal(t, syscall.SIGCONT)
	got, at := s.AwaitSettled(t)
	if got != third {
		t.Fatalf("AwaitSettled: got primary %v, want %v, promoted last", got.Addr(), third.Addr())
	}
	if at.Before(switched) {
		t.Errorf("AwaitSettled: last switch read at %v, before the one AwaitSwitch read (%v)", at, switched)
	}
	for _, srv := range []*Server{first, second} {
		info, err := newRDB(t, srv.Addr()).Info(ctx(t), "replication").Result()
		if err != nil || !strings.Contains(info, fmt.Sprintf("master_port:%d\r", third.Port())) {
			t.Errorf("%v after AwaitSettled: INFO replication got (%q, %v), want a replica of %v", srv.Addr(), info, err, third.Addr())
		}
	}
}

// TestSentinelForgetsKilledPrimary kills the primary: once AwaitSwitch
// returned, no sentinel lists its address among the replicas it watches, so
// that none will make a replica of whatever server takes the port next.
func TestSentinelForgetsKilledPrimary(t *testing.T) {
	t.Parallel()
	s := StartSentinel(t)
	old := s.Primary(t)
	old.Stop()
	promoted, _ := s.AwaitSwitch(t, old)
	if promoted == old {
		t.Fatalf("+switch-master named the killed primary")
	}
	for _, sn := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr()})
		t.Cleanup(func() { _ = sc.Close() })
		replicas, err := sc.Replicas(ctx(t), SentinelMaster).Result()
		if err != nil {
			t.Fatalf("SENTINEL REPLICAS on %v: %v", sn.Addr(), err)
		}
		for _, r := range replicas {
			if r["name"] == old.Addr() {
				t.Errorf("sentinel %v still watches the killed primary %v as a replica: %v", sn.Addr(), old.Addr(), r)
			}
		}
	}
}

// divergedShards is a nodes.conf as a Valkey 8.0 node saved it after a
// failover, which the same server then refused to load: the replica (this
// node) is saved in another shard than its primary.
const divergedShards = `aaaa0938981fd3b1319e9765f3536092cb5e1b95 127.0.0.1:14117@24117,,tls-port=0,shard-id=1111b58b8f1c5cd9bd048f02eb68f72a117331f7 myself,slave 05fe0938981fd3b1319e9765f3536092cb5e1b95 0 0 2 connected
05fe0938981fd3b1319e9765f3536092cb5e1b95 127.0.0.1:14119@14118,,tls-port=0,shard-id=6486b58b8f1c5cd9bd048f02eb68f72a117331f7 master - 0 1795844410239 2 connected 5461-10922
bbbb0938981fd3b1319e9765f3536092cb5e1b95 127.0.0.1:14121@14120,,tls-port=0,shard-id=2222b58b8f1c5cd9bd048f02eb68f72a117331f7 master - 0 1795844410239 3 connected 0-5460
vars currentEpoch 3 lastVoteEpoch 0
`

func TestFollowPrimaryShards(t *testing.T) {
	got := string(followPrimaryShards([]byte(divergedShards)))
	want := strings.Replace(divergedShards, "shard-id=1111", "shard-id=6486", 1)
	if got != want {
		t.Fatalf("followPrimaryShards:\ngot  %q\nwant %q", got, want)
	}
	old := strings.NewReplacer(",,tls-port=0,shard-id=1111b58b8f1c5cd9bd048f02eb68f72a117331f7", "",
		",,tls-port=0,shard-id=6486b58b8f1c5cd9bd048f02eb68f72a117331f7", "",
		",,tls-port=0,shard-id=2222b58b8f1c5cd9bd048f02eb68f72a117331f7", "").Replace(divergedShards)
	if got := string(followPrimaryShards([]byte(old))); got != old {
		t.Fatalf("followPrimaryShards of a file without shard ids changed it:\ngot  %q\nwant %q", got, old)
	}

	// The server refuses the file as saved and loads the mended one.
	bin := Require(t, "redis-server")
	v := ServerVersion(t)
	if !v.AtLeast(7, 2) {
		t.Logf("%v keeps no shard ids in nodes.conf; only the text was checked", v)
		return
	}
	launch := func(conf string) (*Server, error) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "nodes.conf"), []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		port, err := FreePortWithBus(v)
		if err != nil {
			t.Fatal(err)
		}
		return LaunchOn(bin, dir, port, ClusterArgs(v)...)
	}
	if s, err := launch(divergedShards); err == nil {
		s.Stop()
		t.Fatalf("%v loaded a replica saved in another shard than its primary's; want it refused, as the test's premise", v)
	} else if !strings.Contains(err.Error(), "corrupted cluster config file") {
		t.Fatalf("%v refused the diverged file with %v; want corrupted cluster config file", v, err)
	}
	s, err := launch(got)
	if err != nil {
		t.Fatalf("%v refused the mended file: %v", v, err)
	}
	s.Stop()
}
