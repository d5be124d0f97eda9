package remutex

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
	"github.com/remutex/remutex/internal/transport"
)

// Tests of Client.Check and Client.Servers on every server remutex
// supports: PATH's redis-server (Debian's 7.0 in CI) and each one in
// ../shared/servers (Redis 6.2 and 7.4, Valkey 8.0), where that folder is.

// sharedServers is the folder of the extra server builds (see its README).
const sharedServers = "../shared/servers"

// testedServer is a redis-server binary and what it says it is.
type testedServer struct {
	bin           string
	name, version string // "Redis", "7.0.15", from --version
}

// testedServers returns PATH's redis-server and those of sharedServers.
func testedServers(t *testing.T) []testedServer {
	t.Helper()
	bins := []string{redistest.Require(t, "redis-server")}
	dirs, _ := filepath.Glob(filepath.Join(sharedServers, "*", "bin"))
	if len(dirs) == 0 {
		t.Logf("no server builds in %s: testing PATH's redis-server alone", sharedServers)
	}
	sort.Strings(dirs)
	for _, dir := range dirs {
		// Valkey's folder names its binary valkey-server (its redis-server
		// may be a link, or a file naming it where links were not kept).
		for _, name := range []string{"redis-server", "valkey-server"} {
			if bin := filepath.Join(dir, name); isExecutable(bin) {
				bins = append(bins, bin)
				break
			}
		}
	}
	var out []testedServer
	seen := map[string]bool{}
	for _, bin := range bins {
		if abs, err := filepath.Abs(bin); err == nil {
			if seen[abs] {
				continue // PATH's is one of them
			}
			seen[abs] = true
		}
		v, err := exec.Command(bin, "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", bin, err)
		}
		// "Redis server v=7.4.1 sha=...", "Valkey server v=8.0.1 sha=..."
		f := strings.Fields(string(v))
		if len(f) < 3 || !strings.HasPrefix(f[2], "v=") {
			t.Fatalf("%s --version: %q", bin, v)
		}
		out = append(out, testedServer{bin: bin, name: f[0], version: strings.TrimPrefix(f[2], "v=")})
	}
	return out
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// eachServer runs f as a subtest per tested server, on a server of its own
// started from that binary (stopped at the end).
func eachServer(t *testing.T, f func(t *testing.T, ts testedServer, srv *redistest.Server)) {
	t.Helper()
	for _, ts := range testedServers(t) {
		t.Run(ts.name+"-"+ts.version, func(t *testing.T) {
			srv, err := redistest.Launch(ts.bin, t.TempDir())
			if err != nil {
				t.Fatalf("%s: %v", ts.bin, err)
			}
			t.Cleanup(srv.Stop)
			f(t, ts, srv)
		})
	}
}

// lockUserOn sets up the ACL user "locker" with rules on srv and returns a
// go-redis client logged in as it.
func lockUserOn(t *testing.T, srv *redistest.Server, rules ...string) *redis.Client {
	t.Helper()
	args := append([]interface{}{"acl", "setuser", "locker", "reset"}, toArgs(rules)...)
	if err := rdbAt(t, srv.Addr()).Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %v: %v", rules, err)
	}
	return newRDB(t, &redis.Options{Addr: srv.Addr(), Username: "locker", Password: "pw"})
}

// aclWith is the documented lock user's ACL with rule without replaced by
// the rules with (none: removed).
func aclWith(without string, with ...string) []string {
	var rules []string
	for _, r := range lockUserACL {
		if r == without {
			rules = append(rules, with...)
			continue
		}
		rules = append(rules, r)
	}
	return rules
}

// TestCheckBoundedByContext: against a paused server, Check and Servers
// with a 500ms context return within it (and deadlineSlack), whatever the
// go-redis options, before and after the Client's first call, with the
// context's error naming the server; and Check passes again once the
// server answers. (What bounds Check is the Client's side: every option
// set runs on the first server, the defaults on the others.)
func TestCheckBoundedByContext(t *testing.T) {
	skipShort(t, "a fault suite (paused servers)")
	t.Parallel()
	const bound = 500 * time.Millisecond
	first := true
	eachServer(t, func(t *testing.T, _ testedServer, srv *redistest.Server) {
		sets, warmth := optionSets, []bool{false, true}
		if !first {
			sets, warmth = optionSets[:1], []bool{true}
		}
		first = false
		for _, opts := range sets {
			for _, warm := range warmth {
				o := &redis.Options{Addr: srv.Addr()}
				opts.set(o)
				c := clientOn(t, newRDB(t, o))
				if warm {
					if err := c.Check(testCtx(t, hangGuard)); err != nil {
						t.Fatalf("%s: Check before the pause: %v", opts.name, err)
					}
				}
				what := fmt.Sprintf("%s (warm %v)", opts.name, warm)
				srv.Signal(t, syscall.SIGSTOP)
				within(t, "Check(500ms) "+what, bound, func() error {
					ctx, cancel := context.WithTimeout(context.Background(), bound)
					defer cancel()
					return wantNoAnswer(c.Check(ctx), srv.Addr())
				})
				within(t, "Servers(500ms) "+what, bound, func() error {
					ctx, cancel := context.WithTimeout(context.Background(), bound)
					defer cancel()
					_, err := c.Servers(ctx)
					return wantNoAnswer(err, srv.Addr())
				})
				srv.Signal(t, syscall.SIGCONT)
				if err := c.Check(testCtx(t, hangGuard)); err != nil {
					t.Errorf("%s: Check once the server answers again: %v", what, err)
				}
			}
		}
	})
}

// wantNoAnswer says what is wrong with err, the error of a Check whose
// context ended while the server at addr did not answer.
func wantNoAnswer(err error, addr string) error {
	switch {
	case !errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("got %v, want context.DeadlineExceeded", err)
	case !strings.Contains(err.Error(), addr):
		return fmt.Errorf("got %v, want it to name the server %s", err, addr)
	case errors.Is(err, ErrDegraded):
		return fmt.Errorf("got %v, matching ErrDegraded: a server that does not answer is broken", err)
	}
	return nil
}

// TestCheckTellsKeysFromScripts: a user that may not use the keys under the
// prefix, or may not run scripts, or a command the scripts run, is told
// which, on every server, although each words its refusal differently:
// Check tells them apart by the reply's code, not by its text.
func TestCheckTellsKeysFromScripts(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, _ testedServer, srv *redistest.Server) {
		for _, tc := range []struct {
			name         string
			rules        []string
			want, reject string
		}{
			{"other keys", aclWith("~remutex:*", "~other:*"), `may not use keys under the key prefix "remutex:" (the ACL needs ~remutex:*)`, "scripts"},
			{"no keys", aclWith("~remutex:*"), `may not use keys under the key prefix "remutex:"`, "scripts"},
			{"no scripting", aclWith("+@scripting"), "may not run the lock scripts (EVALSHA and EVAL", "key prefix"},
			{"no EVAL", aclWith("+@scripting", "+@scripting", "-eval"), "may not run the lock scripts (EVAL;", "key prefix"},
			{"no TIME", aclWith("+time"), "the lock scripts may not run time", "may not use keys"},
		} {
			err := clientOn(t, lockUserOn(t, srv, tc.rules...)).Check(testCtx(t, hangGuard))
			switch {
			case err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.reject):
				t.Errorf("%s: got %v, want an error naming %q (and not %q)", tc.name, err, tc.want, tc.reject)
			case errors.Is(err, ErrDegraded):
				t.Errorf("%s: got %v, matching ErrDegraded: the locks do not work", tc.name, err)
			}
		}
	})
}

// TestCheckDegraded: a user without channel access, or without pub/sub at
// all, gets an error that matches ErrDegraded and names what it lacks, and
// its locks work (by polling); one that also lacks a command gets one that
// does not match it; the documented user gets nil.
func TestCheckDegraded(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, _ testedServer, srv *redistest.Server) {
		ctx := testCtx(t, hangGuard)
		if err := clientOn(t, lockUserOn(t, srv, lockUserACL...)).Check(ctx); err != nil {
			t.Errorf("the documented lock user: %v", err)
		}
		for _, tc := range []struct {
			name  string
			rules []string
		}{
			{"other channels", aclWith("&remutex:*", "&other:*")},
			{"no channels", aclWith("&remutex:*")},
			{"no pub/sub", aclWith("+@pubsub")},
		} {
			rdb := lockUserOn(t, srv, tc.rules...)
			c := clientOn(t, rdb)
			err := c.Check(ctx)
			if !errors.Is(err, ErrDegraded) || !strings.Contains(err.Error(), "SUBSCRIBE") || !strings.Contains(err.Error(), "poll") {
				t.Errorf("%s: got %v, want ErrDegraded naming SUBSCRIBE and polling", tc.name, err)
			}
			m := c.NewMutex(lockName(t))
			if err := m.LockContext(ctx); err != nil {
				t.Errorf("%s: LockContext of a degraded user: %v", tc.name, err)
			} else if err := m.UnlockContext(ctx); err != nil {
				t.Errorf("%s: UnlockContext of a degraded user: %v", tc.name, err)
			}
		}
		// Without PUBSUB, a release cannot ask whether a queued waiter's
		// Client listens (told.lua): it hands the lock on to gone ones too.
		noCountRDB := lockUserOn(t, srv, append(append([]string{}, lockUserACL...), "-pubsub")...)
		noCount := clientOn(t, noCountRDB)
		if err := noCount.Check(ctx); !errors.Is(err, ErrDegraded) || !strings.Contains(err.Error(), "PUBSUB NUMSUB") {
			t.Errorf("no PUBSUB: got %v, want ErrDegraded naming PUBSUB NUMSUB", err)
		}
		handOffWorks(t, noCount)
		// A quorum's releases only wake waiters: they count no listeners.
		q := NewQuorumClient([]redis.UniversalClient{noCountRDB, noCountRDB, noCountRDB}, WithLogger(testLogger(t)))
		t.Cleanup(func() { _ = q.Close() })
		if err := q.Check(ctx); err != nil {
			t.Errorf("no PUBSUB, a quorum's Client: got %v, want nil", err)
		}
		rules := aclWith("+time")
		rules = aclWith2(rules, "&remutex:*")
		err := clientOn(t, lockUserOn(t, srv, rules...)).Check(ctx)
		if errors.Is(err, ErrDegraded) || err == nil || !strings.Contains(err.Error(), "time") || !strings.Contains(err.Error(), "SUBSCRIBE") {
			t.Errorf("no channels and no TIME: got %v, want an error naming both that does not match ErrDegraded", err)
		}
	})
}

// handOffWorks checks that a waiter of c is handed the lock its holder
// releases.
func handOffWorks(t *testing.T, c *Client) {
	t.Helper()
	ctx := testCtx(t, hangGuard)
	name := lockName(t)
	holder := c.NewMutex(name)
	if err := holder.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: %v", err)
	}
	w := lockAsync(t, c.NewMutex(name), nil, "the waiter")
	waitFor(t, "the waiter queued", func() bool {
		return transport.Redis(c.be).Exists(ctx, keysOf(name).queue).Val() == 1
	})
	if err := holder.UnlockContext(ctx); err != nil {
		t.Fatalf("UnlockContext: %v", err)
	}
	if r := await(t, w.locked, "the waiter's LockContext"); r.err != nil {
		t.Fatalf("the waiter's LockContext: %v", r.err)
	}
	w.unlock()
	if err := await(t, w.unlocked, "the waiter's UnlockContext"); err != nil {
		t.Errorf("the waiter's UnlockContext: %v", err)
	}
}

// aclWith2 is aclWith on rules other than lockUserACL: without removed.
func aclWith2(rules []string, without string) []string {
	var out []string
	for _, r := range rules {
		if r != without {
			out = append(out, r)
		}
	}
	return out
}

// TestCheckNamesServer: Servers names each server and its version as its
// binary does, for the default user and for the documented lock user
// (who may not run INFO), and Check passes on each.
func TestCheckNamesServer(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, ts testedServer, srv *redistest.Server) {
		ctx := testCtx(t, hangGuard)
		want := ServerInfo{Addr: srv.Addr(), Name: ts.name, Version: ts.version}
		for user, rdb := range map[string]*redis.Client{
			"default":   rdbAt(t, srv.Addr()),
			"lock user": lockUserOn(t, srv, lockUserACL...),
		} {
			c := clientOn(t, rdb)
			got, err := c.Servers(ctx)
			if err != nil || len(got) != 1 || got[0] != want {
				t.Errorf("Servers as the %s: got %v, %v; want [%v]", user, got, err, want)
			}
			if err := c.Check(ctx); err != nil {
				t.Errorf("Check as the %s: %v", user, err)
			}
		}
		if s := want.String(); s != ts.name+" "+ts.version+" at "+srv.Addr() {
			t.Errorf("ServerInfo.String: got %q", s)
		}
	})
}

// TestCheckRefusesOldServers: Check refuses a server older than Redis 6.2
// (or Valkey 7.2) with a message that names it and the oldest supported,
// whether the server tells its version by HELLO or (before Redis 6) by INFO
// alone; Servers names it all the same.
func TestCheckRefusesOldServers(t *testing.T) {
	for _, tc := range []struct {
		name, hello, info string
		want              ServerInfo
		refused           string
	}{
		{"Redis 5.0 (no HELLO)", "", "# Server\r\nredis_version:5.0.14\r\nredis_mode:standalone\r\n",
			ServerInfo{Name: "Redis", Version: "5.0.14"}, "Redis 5.0.14 is older than Redis 6.2, the oldest remutex supports"},
		{"Redis 6.0", "redis 6.0.20", "", ServerInfo{Name: "Redis", Version: "6.0.20"}, "Redis 6.0.20 is older than Redis 6.2"},
		{"Valkey 7.0", "valkey 7.0.0", "", ServerInfo{Name: "Valkey", Version: "7.0.0"}, "Valkey 7.0.0 is older than Valkey 7.2"},
		{"Redis 6.2", "redis 6.2.0", "", ServerInfo{Name: "Redis", Version: "6.2.0"}, ""},
		{"Valkey 7.2 (INFO)", "", "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:7.2.5\r\n", ServerInfo{Name: "Valkey", Version: "7.2.5"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := fakeRedis(t, func(args []string) string {
				switch strings.ToLower(args[0]) {
				case "hello":
					if len(args) == 1 && tc.hello != "" {
						name, version, _ := strings.Cut(tc.hello, " ")
						return fmt.Sprintf("*6\r\n$6\r\nserver\r\n%s$7\r\nversion\r\n%s$5\r\nproto\r\n:2\r\n", bulk(name), bulk(version))
					}
				case "info":
					if tc.info != "" {
						return bulk(tc.info)
					}
				case "ping":
					return "+PONG\r\n"
				}
				return "-ERR unknown command '" + args[0] + "'\r\n"
			})
			c := clientOn(t, newRDB(t, &redis.Options{Addr: addr, Protocol: 2, MaxRetries: -1}))
			ctx := testCtx(t, hangGuard)
			want := tc.want
			want.Addr = addr
			got, err := c.Servers(ctx)
			if len(got) != 1 || got[0] != want {
				t.Errorf("Servers: got %v, want [%v]", got, want)
			}
			if tc.refused == "" {
				if err != nil {
					t.Errorf("Servers of a supported server: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.refused) {
				t.Errorf("Servers: got error %v, want one saying %q", err, tc.refused)
			}
			err = c.Check(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.refused) || !strings.Contains(err.Error(), addr) || errors.Is(err, ErrDegraded) {
				t.Errorf("Check: got %v, want an error naming %s and saying %q", err, addr, tc.refused)
			}
		})
	}
}

func bulk(s string) string { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }

// fakeRedis serves the Redis protocol on a loopback port, answering each
// command (its arguments) with the raw reply answer gives; it stops at the
// end of the test.
func fakeRedis(t *testing.T, answer func(args []string) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := bufio.NewReader(conn)
				for {
					args, err := readCommand(r)
					if err != nil || len(args) == 0 {
						return
					}
					if _, err := io.WriteString(conn, answer(args)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// readCommand reads one command, an array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("not a command: %q (%v)", line, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		return nil, err
	}
	args := make([]string, n)
	for i := range args {
		if line, err = r.ReadString('\n'); err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil {
			return nil, err
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:size])
	}
	return args, nil
}

// TestCheckSaysRemutexOnce: no line of a Check error repeats "remutex:",
// for a server that is not Redis, an address where nothing listens, a
// paused server, a degraded user, and the same as members of a quorum.
func TestCheckSaysRemutexOnce(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, hangGuard)
	http := fakeHTTP(t)
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	refusing := "127.0.0.1:" + strconv.Itoa(port)
	ok := redistest.Start(t)
	degraded := lockUserOn(t, ok, aclWith("&remutex:*")...)
	rdb := func(addr string) *redis.Client {
		return newRDB(t, &redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	}
	cases := map[string]*Client{
		"not Redis": clientOn(t, rdb(http)),
		"refusing":  clientOn(t, rdb(refusing)),
		"degraded":  clientOn(t, degraded),
		"quorum": NewQuorumClient([]redis.UniversalClient{rdb(http), rdb(refusing),
			newRDB(t, &redis.Options{Addr: ok.Addr(), Username: "locker", Password: "pw"})}, WithLogger(testLogger(t))),
	}
	t.Cleanup(func() { _ = cases["quorum"].Close() })
	for name, c := range cases {
		err := c.Check(ctx)
		if err == nil {
			t.Errorf("%s: Check: got nil, want an error", name)
			continue
		}
		// (Key and channel names begin "remutex:{", the key prefix.)
		for _, line := range strings.Split(err.Error(), "\n") {
			if n := strings.Count(line, "remutex: "); n != 1 || !strings.HasPrefix(line, "remutex: ") {
				t.Errorf("%s: a line of Check's error with %d \"remutex: \": %q", name, n, line)
			}
		}
	}
	if err := cases["not Redis"].Check(ctx); !errors.Is(err, errNotRedis) || !strings.HasPrefix(err.Error(), "remutex: server "+http+": not a Redis server") {
		t.Errorf("Check of a server that is not Redis: got %v, want it to read remutex: server %s: not a Redis server...", err, http)
	}
}

// fakeHTTP is an HTTP-ish server that answers anything with a 400 and
// closes the connection; it stops at the end of the test.
func fakeHTTP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = conn.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			_ = conn.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}
