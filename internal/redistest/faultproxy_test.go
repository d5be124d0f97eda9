package redistest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Tests of FaultProxy, each against a redis-server of its own: the faults
// are observed from a client through the proxy and from a direct connection
// to the server.

// TestFaultProxyParse: requests and replies are told apart however the
// stream is cut.
func TestFaultProxyParse(t *testing.T) {
	reqs := []struct {
		in   string
		args []string
		n    int
		ok   bool
	}{
		{"*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n*1\r\n", []string{"INCR", "k"}, 21, true},
		{"*2\r\n$4\r\nINCR\r\n$1\r\nk\r", nil, 0, true},
		{"*2\r\n$4\r\nIN", nil, 0, true},
		{"*2\r", nil, 0, true},
		{"*2\r\n$4\r\nINCRxx", nil, 0, false},
		{"*1\r\n:4\r\n", nil, 0, false},
		{"*0\r\nPING\r\n", nil, 4, true},
		{"PING  x\r\n", []string{"PING", "x"}, 9, true},
		{"PING", nil, 0, true},
	}
	for _, c := range reqs {
		args, n, ok := parseRequest([]byte(c.in))
		got := make([]string, len(args))
		for i, a := range args {
			got[i] = string(a)
		}
		if n != c.n || ok != c.ok || fmt.Sprint(got) != fmt.Sprint(c.args) && len(c.args) > 0 {
			t.Errorf("parseRequest(%q): got (%q, %d, %v), want (%q, %d, %v)", c.in, got, n, ok, c.args, c.n, c.ok)
		}
	}
	replies := []struct {
		in string
		n  int
		ok bool
	}{
		{"+OK\r\n:1\r\n", 5, true},
		{"$-1\r\n", 5, true},
		{"$3\r\nabc\r\n+", 9, true},
		{"$3\r\nab", 0, true},
		{"*2\r\n:1\r\n$1\r\nx\r\n", 15, true},
		{"*2\r\n:1\r\n", 0, true},
		{"%1\r\n+a\r\n:1\r\n", 12, true},
		{">3\r\n+message\r\n+c\r\n+m\r\n", 22, true},
		{"|1\r\n+k\r\n+v\r\n:7\r\n", 16, true},
		{"_\r\n", 3, true},
		{"?\r\n", 0, false},
	}
	for _, c := range replies {
		if n, ok := replyLen([]byte(c.in)); n != c.n || ok != c.ok {
			t.Errorf("replyLen(%q): got (%d, %v), want (%d, %v)", c.in, n, ok, c.n, c.ok)
		}
	}
}

// faultProxied starts a redis-server (with extra arguments) and a
// FaultProxy to it, and returns them with a client of the server itself and
// a key of the test's.
func faultProxied(t *testing.T, extra ...string) (*FaultProxy, *redis.Client, string) {
	t.Helper()
	srv := Start(t, extra...)
	return NewFaultProxy(t, srv.Addr()), newRDB(t, srv.Addr()), "fp:" + t.Name()
}

// proxiedRDB returns a go-redis client of p with opt's settings.
func proxiedRDB(t *testing.T, p *FaultProxy, opt redis.Options) *redis.Client {
	t.Helper()
	opt.Addr = p.Addr()
	rdb := redis.NewClient(&opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// awaitEvent waits for a fault's event, failing the test after hangGuard.
func awaitEvent(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(hangGuard):
		t.Fatalf("%s: nothing after %v", what, hangGuard)
	}
}

// wantValue checks key's integer value on the server.
func wantValue(t *testing.T, direct *redis.Client, key string, want int, when string) {
	t.Helper()
	got, err := direct.Get(ctx(t), key).Int()
	if errors.Is(err, redis.Nil) {
		got, err = 0, nil
	}
	if err != nil || got != want {
		t.Errorf("%s: %s is (%d, %v), want (%d, nil)", when, key, got, err, want)
	}
}

// TestFaultProxyDelay: an INCR is held on its connection; the client (read
// timeout 100ms) gives up, sends it again on a new connection, which passes,
// and closes. The held copy still arrives, after its delay, and the proxy
// then closes the server's side.
func TestFaultProxyDelay(t *testing.T) {
	const delay = time.Second
	p, direct, key := faultProxied(t)
	rdb := proxiedRDB(t, p, redis.Options{ReadTimeout: 100 * time.Millisecond})
	if err := rdb.Ping(ctx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	f := p.Delay(Match{Args: []string{"incr", key}, Times: 1}, delay)
	start := time.Now()
	if n, err := rdb.Incr(ctx(t), key).Result(); err != nil || n != 1 {
		t.Fatalf("INCR resent after a read timeout: got (%d, %v), want (1, nil)", n, err)
	}
	if matched, _ := f.Counts(); matched != 1 {
		t.Errorf("requests the Delay took: got %d, want 1 (the resend passes)", matched)
	}
	wantValue(t, direct, key, 1, "before the delay ended")
	_ = rdb.Close() // the client is gone; the held copy is not

	awaitEvent(t, f.Done(1), "the held INCR answered")
	if took := time.Since(start); took < delay {
		t.Errorf("the held INCR was answered after %v, before its delay of %v", took, delay)
	}
	wantValue(t, direct, key, 2, "after the held copy arrived")
	WaitFor(t, hangGuard, "the proxy's server connections closed", func() bool {
		list, err := direct.ClientList(ctx(t)).Result()
		return err == nil && strings.Count(list, "\n") == 1 // this one
	})
}

// rawConn is a connection through p that speaks RESP by hand.
func rawConn(t *testing.T, p *FaultProxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// request encodes a request as a RESP array of bulk strings.
func request(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

// readFull reads len(want) bytes from c and checks them.
func readFull(t *testing.T, c net.Conn, want, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	got := make([]byte, len(want))
	if n, err := io.ReadFull(c, got); err != nil || string(got) != want {
		t.Fatalf("%s: read %q (%v), want %q", what, got[:n], err, want)
	}
}

// readNothing checks that nothing more arrives on c for a while (or, if
// closed, that c is closed).
func readNothing(t *testing.T, c net.Conn, closed bool, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := c.Read(make([]byte, 64))
	var ne net.Error
	switch {
	case closed && (n != 0 || !errors.Is(err, io.EOF)):
		t.Errorf("%s: read %d bytes (%v), want the connection closed", what, n, err)
	case !closed && (n != 0 || !errors.As(err, &ne) || !ne.Timeout()):
		t.Errorf("%s: read %d bytes (%v), want nothing", what, n, err)
	}
}

// TestFaultProxyDelayPipeline: in a pipeline cut across two writes, the
// requests before the matching one pass; it and those after it are held,
// and delivered in order by Heal.
func TestFaultProxyDelayPipeline(t *testing.T) {
	p, direct, key := faultProxied(t)
	c := rawConn(t, p)
	f := p.Delay(Match{Args: []string{"INCR"}}, time.Minute)
	pipeline := request("PING") + request("INCR", key) + request("PING")
	cut := len(request("PING")) + 7
	for _, part := range []string{pipeline[:cut], pipeline[cut:]} {
		if _, err := c.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
	}
	readFull(t, c, "+PONG\r\n", "the request before the held one")
	awaitEvent(t, f.Matched(1), "the INCR taken")
	readNothing(t, c, false, "while held")
	wantValue(t, direct, key, 0, "while held")
	p.Heal()
	readFull(t, c, ":1\r\n+PONG\r\n", "the held requests, after Heal")
	awaitEvent(t, f.Done(1), "the held INCR answered")
}

// TestFaultProxyDropReply: a request in a pipeline is applied and its reply
// dropped, with what follows it; the connection stays silent (DropReply) or
// is closed (CutReply), once the replies before it passed.
func TestFaultProxyDropReply(t *testing.T) {
	p, direct, key := faultProxied(t)
	pipeline := request("PING") + request("INCR", key) + request("PING")
	for i, c := range []struct {
		name  string
		arm   func(Match) *Fault
		close bool
	}{{"DropReply", p.DropReply, false}, {"CutReply", p.CutReply, true}} {
		t.Run(c.name, func(t *testing.T) {
			f := c.arm(Match{Args: []string{"incr", key}, Times: 1})
			conn := rawConn(t, p)
			if _, err := conn.Write([]byte(pipeline)); err != nil {
				t.Fatal(err)
			}
			readFull(t, conn, "+PONG\r\n", "the reply before the dropped one")
			awaitEvent(t, f.Done(1), "the INCR's reply dropped")
			readNothing(t, conn, c.close, "after the dropped reply")
			wantValue(t, direct, key, i+1, "after the INCR whose reply was dropped")
		})
	}
}

// TestFaultProxyDuplicate: a request is applied twice, the second copy on a
// connection of the proxy's own that authenticates as the client's did: at
// once, or after a delay.
func TestFaultProxyDuplicate(t *testing.T) {
	const delay = time.Second
	p, _, key := faultProxied(t, "--requirepass", "pw")
	rdb := proxiedRDB(t, p, redis.Options{Password: "pw"})
	direct := redis.NewClient(&redis.Options{Addr: p.target, Password: "pw"})
	t.Cleanup(func() { _ = direct.Close() })

	f := p.Duplicate(Match{Args: []string{"incr", key}, Times: 1}, 0)
	if n, err := rdb.Incr(ctx(t), key).Result(); err != nil || n < 1 || n > 2 {
		t.Fatalf("INCR duplicated at once: got (%d, %v), want 1 or 2", n, err)
	}
	awaitEvent(t, f.Done(1), "the second copy answered")
	wantValue(t, direct, key, 2, "after the second copy")

	f = p.Duplicate(Match{Args: []string{"incr", key}, Times: 1}, delay)
	start := time.Now()
	if n, err := rdb.Incr(ctx(t), key).Result(); err != nil || n != 3 {
		t.Fatalf("INCR duplicated later: got (%d, %v), want (3, nil)", n, err)
	}
	if n, err := rdb.Incr(ctx(t), key).Result(); err != nil || n != 4 {
		t.Fatalf("INCR after the fault's one time: got (%d, %v), want (4, nil)", n, err)
	}
	awaitEvent(t, f.Done(1), "the late second copy answered")
	if took := time.Since(start); took < delay {
		t.Errorf("the second copy was answered after %v, before its delay of %v", took, delay)
	}
	wantValue(t, direct, key, 5, "after the late second copy")
	if matched, _ := f.Counts(); matched != 1 {
		t.Errorf("requests the Duplicate took: got %d, want 1", matched)
	}
}

// TestFaultProxyDirections: one direction paused holds what it carries
// until Heal delivers it; blackholed, drops it, and Heal closes the
// connection that lost it. The other direction flows.
func TestFaultProxyDirections(t *testing.T) {
	for _, c := range []struct {
		name     string
		dir      Direction
		hole     bool
		applied  int // the INCR's effect before Heal
		afterAll int // the key after Heal and a second INCR
	}{
		{"Pause/ClientToServer", ClientToServer, false, 0, 2},
		{"Pause/ServerToClient", ServerToClient, false, 1, 2},
		{"Blackhole/ClientToServer", ClientToServer, true, 0, 1},
		{"Blackhole/ServerToClient", ServerToClient, true, 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, direct, key := faultProxied(t)
			opt := redis.Options{ReadTimeout: hangGuard} // held: waits for Heal
			if c.hole {
				opt = redis.Options{ReadTimeout: 100 * time.Millisecond, MaxRetries: -1}
			}
			rdb := proxiedRDB(t, p, opt)
			if err := rdb.Ping(ctx(t)).Err(); err != nil {
				t.Fatal(err)
			}
			arm := p.Pause
			if c.hole {
				arm = p.Blackhole
			}
			f := arm(c.dir)
			done := make(chan error, 1)
			go func() { done <- rdb.Incr(context.Background(), key).Err() }()
			awaitEvent(t, f.Matched(1), "the INCR (or its reply) taken")
			if c.hole {
				awaitEvent(t, f.Done(1), "the INCR (or its reply) dropped")
				if err := <-done; err == nil {
					t.Errorf("INCR through a blackhole: got an answer, want a timeout")
				}
			}
			wantValue(t, direct, key, c.applied, "before Heal")
			select {
			case err := <-done:
				if !c.hole {
					t.Fatalf("INCR while paused: got %v, want no answer before Heal", err)
				}
			default:
			}
			p.Heal()
			if !c.hole {
				if err := <-done; err != nil {
					t.Errorf("INCR held until Heal: got %v, want nil", err)
				}
				awaitEvent(t, f.Done(1), "the held INCR (or its reply) delivered")
			}
			if err := rdb.Incr(ctx(t), key).Err(); err != nil {
				t.Errorf("INCR after Heal: got %v, want nil", err)
			}
			wantValue(t, direct, key, c.afterAll, "after Heal")
		})
	}
}

// TestFaultProxyClose: Close joins the proxy's goroutines at once, while a
// request is held for a minute, and the held request is never delivered.
func TestFaultProxyClose(t *testing.T) {
	p, direct, key := faultProxied(t)
	rdb := proxiedRDB(t, p, redis.Options{ReadTimeout: 100 * time.Millisecond, MaxRetries: -1})
	f := p.Delay(Match{Args: []string{"incr", key}}, time.Minute)
	if err := rdb.Incr(ctx(t), key).Err(); err == nil {
		t.Fatal("INCR held for a minute: got an answer, want a timeout")
	}
	awaitEvent(t, f.Matched(1), "the INCR taken")
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	awaitEvent(t, closed, "Close with a request held")
	wantValue(t, direct, key, 0, "after Close")
	if _, done := f.Counts(); done != 0 {
		t.Errorf("held requests delivered: got %d, want 0", done)
	}
}
