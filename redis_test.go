package remutex

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
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
	if os.Getenv(childHolderEnv) != "" {
		os.Exit(runChildHolder())
	}
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
	dieWithParent(cmd)
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

// testBackend is one Redis to run a behaviour test on.
type testBackend struct {
	name string
	addr string
	mr   *miniredis.Miniredis // set for miniredis
	srv  *redisServer         // set for a real server
}

func (b *testBackend) real() bool { return b.srv != nil }

// eachBackend runs f as a subtest on miniredis and on the shared real
// redis-server.
func eachBackend(t *testing.T, f func(t *testing.T, b *testBackend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		f(t, &testBackend{name: "miniredis", addr: mr.Addr(), mr: mr})
	})
	t.Run("redis-server", func(t *testing.T) {
		srv := sharedServer.get(t)
		f(t, &testBackend{name: "redis-server", addr: srv.Addr(), srv: srv})
	})
}

// rdb returns a new go-redis client (its own connection pool, standing for a
// separate process), closed at the end of the test.
func (b *testBackend) rdb(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
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
func (b *testBackend) client(t testing.TB, opts ...Option) *Client {
	t.Helper()
	return clientOn(t, b.rdb(t), opts...)
}

// clientOn returns a remutex Client on rdb that logs to the test's log,
// closed at the end of the test. opts may override the logger.
func clientOn(t testing.TB, rdb redis.UniversalClient, opts ...Option) *Client {
	t.Helper()
	c := NewClient(rdb, append([]Option{WithLogger(testLogger(t))}, opts...)...)
	t.Cleanup(func() {
		if err := c.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// testLogger writes records of level Info and above to the test's log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// lockName returns a lock name unique to the test, so tests on the shared
// server never meet each other's keys.
func lockName(t testing.TB) string {
	return strings.NewReplacer("/", ".", " ", "_").Replace(t.Name()) + "." + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// eachFreshBackend is eachBackend with a redis-server of the test's own
// instead of the shared one, for tests that restart or reconfigure it.
func eachFreshBackend(t *testing.T, f func(t *testing.T, b *testBackend), extra ...string) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		f(t, &testBackend{name: "miniredis", addr: mr.Addr(), mr: mr})
	})
	t.Run("redis-server", func(t *testing.T) {
		srv := startRedisServer(t, extra...)
		f(t, &testBackend{name: "redis-server", addr: srv.Addr(), srv: srv})
	})
}

// restart loses every key, as a restart without persistence does. miniredis
// is closed, flushed and started again on the same address.
func (b *testBackend) restart(t testing.TB) {
	t.Helper()
	if b.real() {
		b.srv.restart(t)
		return
	}
	b.mr.Close()
	b.mr.FlushAll()
	if err := b.mr.Restart(); err != nil {
		t.Fatal(err)
	}
}

// fastForward makes d pass for the TTLs of miniredis, whose keys do not
// expire in real time; on a real server it does nothing (time passes there
// by itself).
func (b *testBackend) fastForward(d time.Duration) {
	if b.mr != nil {
		b.mr.FastForward(d)
	}
}

// elapse lets d of real time pass, and as much of miniredis's TTL time.
func (b *testBackend) elapse(d time.Duration) {
	time.Sleep(d)
	b.fastForward(d)
}

// hangGuard bounds every wait for an event: it only turns a hang into a
// failure and is never a performance target.
const hangGuard = 20 * time.Second

// await receives from ch, failing the test if nothing comes within hangGuard.
func await[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(hangGuard)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("got nothing after %v, want %s", hangGuard, what)
		panic("unreachable")
	}
}

// waitFor polls cond until it holds, failing the test after hangGuard.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition still false after %v, want %s", hangGuard, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// isClosed reports whether ch is closed, without waiting.

// lockKeyNames are the keys and channel of a lock under the default prefix.
type lockKeyNames struct {
	hash, fence, queue, alive, channel string
}

func keysOf(name string) lockKeyNames {
	h := DefaultKeyPrefix + "{" + name + "}"
	return lockKeyNames{hash: h, fence: h + ":fence", queue: h + ":queue", alive: h + ":queue:alive", channel: h + ":released:"}
}

// hookFuncs is a go-redis hook made of optional functions; a nil one passes
// calls through.
type hookFuncs struct {
	dial     func(ctx context.Context, network, addr string, next redis.DialHook) (net.Conn, error)
	process  func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error
	pipeline func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error
}

func (h hookFuncs) DialHook(next redis.DialHook) redis.DialHook {
	if h.dial == nil {
		return next
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return h.dial(ctx, network, addr, next)
	}
}

func (h hookFuncs) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	if h.process == nil {
		return next
	}
	return func(ctx context.Context, cmd redis.Cmder) error { return h.process(ctx, cmd, next) }
}

func (h hookFuncs) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	if h.pipeline == nil {
		return next
	}
	return func(ctx context.Context, cmds []redis.Cmder) error { return h.pipeline(ctx, cmds, next) }
}

// commandCounter is a hook that counts dials and commands (pipelined ones
// one by one).
type commandCounter struct {
	mu    sync.Mutex
	dials int
	cmds  []string
}

func (c *commandCounter) hook() redis.Hook {
	return hookFuncs{
		dial: func(ctx context.Context, network, addr string, next redis.DialHook) (net.Conn, error) {
			c.mu.Lock()
			c.dials++
			c.mu.Unlock()
			return next(ctx, network, addr)
		},
		process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			c.mu.Lock()
			c.cmds = append(c.cmds, cmd.Name())
			c.mu.Unlock()
			return next(ctx, cmd)
		},
		pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			c.mu.Lock()
			for _, cmd := range cmds {
				c.cmds = append(c.cmds, cmd.Name())
			}
			c.mu.Unlock()
			return next(ctx, cmds)
		},
	}
}

// counts returns the dials and the commands seen so far.
func (c *commandCounter) counts() (dials int, cmds []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dials, append([]string(nil), c.cmds...)
}

// scriptNames maps the SHA1 of each of the library's scripts to its name.
var scriptNames = map[string]string{
	acquireScript.Hash(): "acquire",
	releaseScript.Hash(): "release",
	leaveScript.Hash():   "leave",
	renewScript.Hash():   "renew",
}

// scriptCall reports which of the library's scripts cmd runs (EVALSHA or
// EVAL) and the keys it passes; name is "" for any other command.
func scriptCall(cmd redis.Cmder) (name string, keys []string) {
	args := cmd.Args()
	if len(args) < 3 {
		return "", nil
	}
	switch strings.ToLower(fmt.Sprint(args[0])) {
	case "evalsha":
		name = scriptNames[fmt.Sprint(args[1])]
	case "eval":
		sum := sha1.Sum([]byte(fmt.Sprint(args[1])))
		name = scriptNames[hex.EncodeToString(sum[:])]
	}
	if name == "" {
		return "", nil
	}
	n, err := strconv.Atoi(fmt.Sprint(args[2]))
	if err != nil || 3+n > len(args) {
		return name, nil
	}
	for _, k := range args[3 : 3+n] {
		keys = append(keys, fmt.Sprint(k))
	}
	return name, keys
}

// tcpProxy passes bytes between its clients and a Redis server on 127.0.0.1
// until it is paused: then it holds every byte it reads, as a network that
// stopped delivering does, without closing any connection.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	paused bool
	gate   chan struct{} // closed while passing bytes
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// startProxy starts a proxy in front of target, closed at the end of the
// test (after the cleanups registered later, such as the clients using it).
func startProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, gate: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.gate)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

// pause stops passing bytes; resume passes them again, those held first.
func (p *tcpProxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		p.paused = true
		p.gate = make(chan struct{})
	}
}

func (p *tcpProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
		close(p.gate)
	}
}

func (p *tcpProxy) close() {
	p.mu.Lock()
	p.closed = true
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.resume()
	p.wg.Wait()
}

// track registers c for closing; false if the proxy is closed already.
func (p *tcpProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = down.Close()
			continue
		}
		if !p.track(down) || !p.track(up) {
			_ = down.Close()
			_ = up.Close()
			return
		}
		p.wg.Add(2)
		go p.pump(down, up)
		go p.pump(up, down)
	}
}

// pump copies src to dst, waiting at the gate before every write.
func (p *tcpProxy) pump(src, dst net.Conn) {
	defer p.wg.Done()
	defer func() { _ = src.Close(); _ = dst.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			<-gate
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// childHolderEnv, when set, makes the test binary a lock holder process (see
// runChildHolder) instead of running tests: holders that must die or pause
// are child processes.
const childHolderEnv = "REMUTEX_TEST_CHILD_HOLDER"

// runChildHolder locks the lock named by the environment (WithFencing) and
// prints "locked <fence>"; when the hold is lost it unlocks and prints
// "lost <whether UnlockContext reported ErrLockLost>".
func runChildHolder() int {
	lease, err := time.ParseDuration(os.Getenv("REMUTEX_TEST_CHILD_LEASE"))
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REMUTEX_TEST_CHILD_ADDR")})
	defer rdb.Close()
	c := NewClient(rdb, WithLogger(slog.New(slog.DiscardHandler)))
	defer c.Close()
	m := c.NewMutex(os.Getenv(childHolderEnv), WithLease(lease), WithFencing())
	if err := m.LockContext(context.Background()); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Printf("locked %d\n", m.Fence())
	<-m.Lost()
	err = m.UnlockContext(context.Background())
	fmt.Printf("lost %v\n", errors.Is(err, ErrLockLost))
	return 0
}

// childHolder is a test binary re-executed as a lock holder.
type childHolder struct {
	cmd   *exec.Cmd
	lines chan string // its output, line by line
	exit  chan struct{}
}

// startChildHolder starts a process that holds lock name on the Redis at
// addr with the given lease; it is killed at the end of the test.
func startChildHolder(t testing.TB, addr, name string, lease time.Duration) *childHolder {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childHolderEnv+"="+name, "REMUTEX_TEST_CHILD_ADDR="+addr, "REMUTEX_TEST_CHILD_LEASE="+lease.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &childHolder{cmd: cmd, lines: make(chan string, 16), exit: make(chan struct{})}
	go func() {
		defer close(ch.exit)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch.lines <- sc.Text()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-ch.exit
	})
	return ch
}

// signal sends sig to the child.
func (ch *childHolder) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := ch.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// kill kills the child and waits until it is gone.
func (ch *childHolder) kill(t testing.TB) {
	t.Helper()
	ch.signal(t, syscall.SIGKILL)
	await(t, ch.exit, "the child to exit")
}
