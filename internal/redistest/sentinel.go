package redistest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel timing: a sentinel holds a primary down after DownAfter without a
// valid reply; two of the three must agree, and then one of them, elected
// by the others, promotes the most up-to-date replica. A failed election is
// tried again after twice sentinelFailoverTimeout. With these a failover
// completes within a few seconds on loopback.
const (
	// SentinelMaster is the name under which the sentinels watch the primary.
	SentinelMaster          = "remutex"
	DownAfter               = time.Second
	sentinelQuorum          = 2
	sentinelFailoverTimeout = 2 * time.Second
)

// Sentinel is a primary with two replicas, watched by three Redis Sentinels
// (redis-server --sentinel), all on 127.0.0.1. Clients reach the primary
// through go-redis's failover client (Client). The primary can be killed
// (Stop) or paused (Signal SIGSTOP) and the promotion awaited (AwaitSwitch):
// the sentinels announce it, and every other step of a failover, on their
// pub/sub channels, which the harness reads from all three (a sentinel
// announces what it did itself, such as reconfiguring a server).
type Sentinel struct {
	Servers   []*Server // the data servers: Servers[0] is the first primary
	Sentinels []*Server
	events    *sentinelEvents
}

// StartSentinel starts the primary and its two replicas, waits until both
// replicas are in sync, starts three sentinels and waits until each one
// knows both replicas and the two other sentinels. Everything is stopped at
// the end of the test.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	bin := Require(t, "redis-server")
	// No delay before a diskless sync: after a failover the promoted replica
	// serves the others (and a stale primary) at once.
	noDelay := []string{"--repl-diskless-sync-delay", "0"}
	primary := Start(t, noDelay...)
	s := &Sentinel{Servers: []*Server{primary}}
	for i := 0; i < 2; i++ {
		s.Servers = append(s.Servers, Start(t, append(noDelay, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))...))
	}
	awaitInSync(t, primary, s.Servers[1:])
	for i := 0; i < 3; i++ {
		s.Sentinels = append(s.Sentinels, startSentinel(t, bin, primary))
	}
	s.awaitWatching(t)
	s.events = &sentinelEvents{kick: make(chan struct{}, 1)}
	for _, sn := range s.Sentinels {
		s.events.watch(t, sn)
	}
	// Registered after the watchers, so it runs before they stop: a failed
	// test says what the sentinels did (a second failover, say, when a new
	// primary is too slow to answer for DownAfter on a loaded machine).
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("REMUTEX_SENTINEL_EVENTS") == "1" {
			t.Logf("sentinel events, as the harness read them (%d switches of the primary):\n%s", s.events.count("+switch-master"), s.events)
		}
	})
	return s
}

// startSentinel starts a sentinel watching primary, stopped at the end of
// the test.
func startSentinel(t testing.TB, bin string, primary *Server) *Server {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf") // the sentinel rewrites it
	text := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d %[3]d\n"+
		"sentinel down-after-milliseconds %[1]s %[4]d\n"+
		"sentinel failover-timeout %[1]s %[5]d\n",
		SentinelMaster, primary.Port(), sentinelQuorum, DownAfter.Milliseconds(), sentinelFailoverTimeout.Milliseconds())
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &Server{bin: bin, dir: dir, conf: conf, args: []string{"--sentinel"}}
	if err := s.startOnFreePort(); err != nil {
		t.Fatalf("starting a sentinel: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// awaitWatching waits until every sentinel sees the primary up, both
// replicas and the two other sentinels: only then can they agree on a
// failover.
func (s *Sentinel) awaitWatching(t testing.TB) {
	t.Helper()
	ctx := adminCtx(t)
	for _, sn := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr()})
		t.Cleanup(func() { _ = sc.Close() })
		WaitFor(t, hangGuard, "sentinel "+sn.Addr()+" watching 2 replicas with 2 other sentinels", func() bool {
			m, err := sc.Master(ctx, SentinelMaster).Result()
			return err == nil && m["flags"] == "master" && m["num-slaves"] == "2" && m["num-other-sentinels"] == "2"
		})
	}
}

// Client returns a go-redis failover client (the master name and the
// sentinels' addresses filled in over opt), closed at the end of the test.
func (s *Sentinel) Client(t testing.TB, opt redis.FailoverOptions) *redis.Client {
	t.Helper()
	opt.MasterName = SentinelMaster
	opt.SentinelAddrs = nil
	for _, sn := range s.Sentinels {
		opt.SentinelAddrs = append(opt.SentinelAddrs, sn.Addr())
	}
	rdb := redis.NewFailoverClient(&opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Primary returns the data server the first sentinel names as the primary.
func (s *Sentinel) Primary(t testing.TB) *Server {
	t.Helper()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0].Addr()})
	defer sc.Close()
	addr, err := sc.GetMasterAddrByName(adminCtx(t), SentinelMaster).Result()
	if err != nil || len(addr) != 2 {
		t.Fatalf("SENTINEL GET-MASTER-ADDR-BY-NAME on %v: got %q, %v", s.Sentinels[0].Addr(), addr, err)
	}
	return s.server(t, addr[1])
}

// server returns the data server listening on port.
func (s *Sentinel) server(t testing.TB, port string) *Server {
	t.Helper()
	for _, srv := range s.Servers {
		if strconv.Itoa(srv.Port()) == port {
			return srv
		}
	}
	t.Fatalf("no data server on port %s", port)
	return nil
}

// AwaitSwitch waits until the sentinels announce (+switch-master) that the
// primary moved away from old, and returns the new primary and when the
// announcement was read. Where old was stopped (killed, not paused), it then
// makes the sentinels forget it (see forget).
func (s *Sentinel) AwaitSwitch(t testing.TB, old *Server) (*Server, time.Time) {
	t.Helper()
	e := s.Await(t, "+switch-master", fmt.Sprintf("%s 127.0.0.1 %d ", SentinelMaster, old.Port()))
	f := strings.Fields(e.Payload) // <name> <old ip> <old port> <new ip> <new port>
	if len(f) != 5 {
		t.Fatalf("+switch-master %q: want 5 fields", e.Payload)
	}
	if !old.running() {
		s.forget(t, old)
	}
	return s.server(t, f[4]), e.At
}

// forget waits until the failover away from old, a server that was killed,
// ended (+failover-end), and then resets every sentinel (SENTINEL RESET), so
// that none of them keeps old's address among the replicas it watches. A
// sentinel that finds a server at that address again makes it a replica of
// the new primary, some 10s later (+convert-to-slave): on a machine where
// other test runs start servers on free ports, that is another process's
// server, which took the port, and it loses its data. The same done to ours
// by another run's sentinels turns a primary into a replica of a stranger's:
// a second failover under load, lost holds, fence counters seeded again.
func (s *Sentinel) forget(t testing.TB, old *Server) {
	t.Helper()
	s.Await(t, "+failover-end", fmt.Sprintf("master %s 127.0.0.1 %d", SentinelMaster, old.Port()))
	ctx := adminCtx(t)
	for _, sn := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr()})
		err := sc.Reset(ctx, SentinelMaster).Err()
		_ = sc.Close()
		if err != nil {
			t.Fatalf("SENTINEL RESET %s on %v: %v", SentinelMaster, sn.Addr(), err)
		}
	}
}

// AwaitSettled waits until the three sentinels name one primary and every
// running data server besides it replicates it, and the harness read the
// announcement of its promotion; it returns that primary and when the
// harness read the last +switch-master to it (zero if none: the first
// primary, never failed over). A primary that came back after a failover
// is made a replica some 8s later (+convert-to-slave), or at once by a
// second failover's reconfiguration: on a loaded machine a newly promoted
// primary that stalls for DownAfter is failed over in turn, and the
// deployment settles on the last one.
func (s *Sentinel) AwaitSettled(t testing.TB) (*Server, time.Time) {
	t.Helper()
	ctx := adminCtx(t)
	var scs []*redis.SentinelClient
	for _, sn := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr()})
		t.Cleanup(func() { _ = sc.Close() })
		scs = append(scs, sc)
	}
	rdbs := map[*Server]*redis.Client{}
	for _, srv := range s.Servers {
		rdbs[srv] = newRDB(t, srv.Addr())
	}
	var port string
	WaitFor(t, hangGuard, "the sentinels to agree on a primary that every other server replicates", func() bool {
		port = ""
		for _, sc := range scs {
			addr, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
			if err != nil || len(addr) != 2 || (port != "" && addr[1] != port) {
				return false
			}
			port = addr[1]
		}
		if port != strconv.Itoa(s.Servers[0].Port()) && s.events.lastSwitchTo(port).IsZero() {
			return false // the announcement of its promotion not read yet
		}
		for _, srv := range s.Servers {
			if !srv.running() || strconv.Itoa(srv.Port()) == port {
				continue
			}
			info, err := rdbs[srv].Info(ctx, "replication").Result()
			if err != nil || !strings.Contains(info, "role:slave") || !strings.Contains(info, "master_port:"+port+"\r") {
				return false
			}
		}
		return true
	})
	return s.server(t, port), s.events.lastSwitchTo(port)
}

// SentinelEvent is one message a sentinel published: the channel is the
// event (+sdown, +odown, +switch-master, ...), the payload its details.
type SentinelEvent struct {
	Channel, Payload string
	At               time.Time // when the harness read it
}

// Await waits for the first event on channel whose payload contains part,
// and takes it, so that a later Await finds a later one. It fails the test
// after hangGuard.
func (s *Sentinel) Await(t testing.TB, channel, part string) SentinelEvent {
	t.Helper()
	deadline := time.NewTimer(hangGuard)
	defer deadline.Stop()
	for {
		if e, ok := s.events.take(channel, part); ok {
			return e
		}
		select {
		case <-s.events.kick:
		case <-deadline.C:
			t.Fatalf("no sentinel event %s %q within %v; events so far:\n%s", channel, part, hangGuard, s.events)
		}
	}
}

// sentinelEvents collects what the sentinels publish, from a goroutine per
// sentinel that the end of the test stops and joins.
type sentinelEvents struct {
	mu     sync.Mutex
	events []SentinelEvent
	all    []string // every event, for failure messages
	// switches are the +switch-master events, none taken.
	switches []SentinelEvent
	kick     chan struct{}
}

// watch subscribes to every channel of sentinel sn and collects its events
// from the moment it returns.
func (ev *sentinelEvents) watch(t testing.TB, sn *Server) {
	t.Helper()
	rdb := newRDB(t, sn.Addr())
	ps := rdb.PSubscribe(adminCtx(t), "*")
	if _, err := ps.Receive(adminCtx(t)); err != nil { // the confirmation
		t.Fatalf("PSUBSCRIBE * on sentinel %v: %v", sn.Addr(), err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for msg := range ps.Channel(redis.WithChannelSize(1000)) {
			ev.add(SentinelEvent{Channel: msg.Channel, Payload: msg.Payload, At: time.Now()})
		}
	}()
	t.Cleanup(func() {
		_ = ps.Close()
		<-done
	})
}

func (ev *sentinelEvents) add(e SentinelEvent) {
	ev.mu.Lock()
	ev.events = append(ev.events, e)
	ev.all = append(ev.all, e.At.Format("15:04:05.000")+" "+e.Channel+" "+e.Payload)
	if e.Channel == "+switch-master" {
		ev.switches = append(ev.switches, e)
	}
	ev.mu.Unlock()
	select {
	case ev.kick <- struct{}{}:
	default:
	}
}

// lastSwitchTo returns when the last +switch-master to the server on port
// was read (zero if none was).
func (ev *sentinelEvents) lastSwitchTo(port string) (at time.Time) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	for _, e := range ev.switches {
		if strings.HasSuffix(e.Payload, " "+port) {
			at = e.At
		}
	}
	return at
}

func (ev *sentinelEvents) take(channel, part string) (SentinelEvent, bool) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	for i, e := range ev.events {
		if e.Channel == channel && strings.Contains(e.Payload, part) {
			ev.events = append(ev.events[:i], ev.events[i+1:]...)
			return e, true
		}
	}
	return SentinelEvent{}, false
}

// count returns how many distinct events were read on channel, taken or
// not.
func (ev *sentinelEvents) count(channel string) int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	seen := map[string]bool{} // every sentinel announces the same event
	for _, e := range ev.all {
		if _, rest, _ := strings.Cut(e, " "); strings.HasPrefix(rest, channel+" ") {
			seen[rest] = true
		}
	}
	return len(seen)
}

func (ev *sentinelEvents) String() string {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return strings.Join(ev.all, "\n")
}
