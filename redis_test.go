package remutex

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Test infrastructure: every behaviour test runs on miniredis and on a real
// redis-server that the tests start themselves on a free loopback port.
// Without redis-server on PATH the real-server runs skip with a reason,
// unless REMUTEX_REQUIRE_REDIS=1, when they fail.

func TestMain(m *testing.M) {
	code := m.Run()
	sharedServer.stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak after the suite:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// redisServer is a redis-server child process on 127.0.0.1.
type redisServer struct {
	mu   sync.Mutex
	bin  string
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
	exit chan struct{}
}

// requireRedisServer returns the path of redis-server, skipping (or failing
// with REMUTEX_REQUIRE_REDIS=1) when there is none.
func requireRedisServer(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("REMUTEX_REQUIRE_REDIS") == "1" {
			t.Fatalf("redis-server not on PATH and REMUTEX_REQUIRE_REDIS=1: %v", err)
		}
		t.Skip("redis-server not on PATH (install it, e.g. apt-get install redis-server, to run the real-server tests)")
	}
	return bin
}

// startRedisServer starts a redis-server without persistence on a free
// loopback port, with extra arguments (e.g. "--maxmemory", "1mb"), and stops
// it at the end of the test.
func startRedisServer(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	s, err := launchRedisServer(requireRedisServer(t), t.TempDir(), extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

func launchRedisServer(bin, dir string, extra ...string) (*redisServer, error) {
	s := &redisServer{bin: bin, dir: dir, args: extra}
	var err error
	for try := 0; try < 5; try++ {
		if s.port, err = freePort(); err != nil {
			continue
		}
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("starting redis-server: %w", err)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *redisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// start launches the process and waits until it answers PING.
func (s *redisServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	args := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
	}, s.args...)
	cmd := exec.Command(s.bin, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	exit := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exit) }()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			s.cmd, s.exit = cmd, exit
			return nil
		}
		select {
		case <-exit:
			return fmt.Errorf("redis-server exited: %s", out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exit
			return fmt.Errorf("redis-server did not answer PING: %v; output: %s", err, out.String())
		}
	}
}

// stop kills the process (SIGKILL: no persistence, nothing to save) and
// waits for it.
func (s *redisServer) stop() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused server must be able to die
	_ = s.cmd.Process.Kill()
	<-s.exit
	s.cmd = nil
}

// restart kills the server and starts a fresh one (empty, since nothing is
// persisted) on the same port.
func (s *redisServer) restart(t testing.TB) {
	t.Helper()
	s.stop()
	var err error
	for try := 0; try < 50; try++ { // the port may linger briefly
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal(err)
}

// signal sends sig (SIGSTOP, SIGCONT) to the server process.
func (s *redisServer) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		t.Fatal("redis-server not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// sharedServer is one redis-server for the ordinary tests of this package;
// each test uses its own lock names. Tests that kill, pause or reconfigure a
// server start their own.
var sharedServer lazyServer

type lazyServer struct {
	once sync.Once
	srv  *redisServer
	err  error
}

func (l *lazyServer) get(t testing.TB) *redisServer {
	t.Helper()
	bin := requireRedisServer(t)
	l.once.Do(func() {
		dir, err := os.MkdirTemp("", "remutex-redis-")
		if err != nil {
			l.err = err
			return
		}
		l.srv, l.err = launchRedisServer(bin, dir)
	})
	if l.err != nil {
		t.Fatal(l.err)
	}
	return l.srv
}

func (l *lazyServer) stop() {
	if l.srv != nil {
		l.srv.stop()
		_ = os.RemoveAll(l.srv.dir)
	}
}

// backend is one Redis to run a behaviour test on.
type backend struct {
	name string
	addr string
	mr   *miniredis.Miniredis // set for miniredis
	srv  *redisServer         // set for a real server
}

func (b *backend) real() bool { return b.srv != nil }

// eachBackend runs f as a subtest on miniredis and on the shared real
// redis-server.
func eachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		f(t, &backend{name: "miniredis", addr: mr.Addr(), mr: mr})
	})
	t.Run("redis-server", func(t *testing.T) {
		srv := sharedServer.get(t)
		f(t, &backend{name: "redis-server", addr: srv.Addr(), srv: srv})
	})
}

// rdb returns a new go-redis client (its own connection pool, standing for a
// separate process), closed at the end of the test.
func (b *backend) rdb(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: b.addr}
	for _, f := range opts {
		f(o)
	}
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// client returns a remutex Client on a new connection pool, closed at the
// end of the test (before its pool).
func (b *backend) client(t testing.TB, opts ...Option) *Client {
	t.Helper()
	rdb := b.rdb(t)
	c := NewClient(rdb, opts...)
	t.Cleanup(func() {
		if err := c.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// lockName returns a lock name unique to the test, so tests on the shared
// server never meet each other's keys.
func lockName(t testing.TB) string {
	return strings.NewReplacer("/", ".", " ", "_").Replace(t.Name()) + "." + strconv.FormatInt(time.Now().UnixNano(), 36)
}
