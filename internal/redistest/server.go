package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RequireEnv is the environment variable that, set to 1, makes a missing
// redis-server or redis-cli fail the tests instead of skipping them. CI sets
// it.
const RequireEnv = "REMUTEX_REQUIRE_REDIS"

// packages names the Debian package that provides each program.
var packages = map[string]string{"redis-server": "redis-server", "redis-cli": "redis-tools"}

// Require returns the path of program (redis-server, redis-cli), skipping
// the test with the reason when it is not on PATH, or failing it when
// REMUTEX_REQUIRE_REDIS=1.
func Require(t testing.TB, program string) string {
	t.Helper()
	path, err := exec.LookPath(program)
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s not on PATH and %s=1: %v", program, RequireEnv, err)
		}
		t.Skipf("%s not on PATH (install it, e.g. apt-get install %s, to run this test)", program, packages[program])
	}
	return path
}

// Server is a redis-server child process on 127.0.0.1, without persistence.
type Server struct {
	bin  string
	port int
	dir  string
	conf string      // a configuration file, given first; "" for none
	args []string    // extra arguments
	tls  *tls.Config // a client's, for a TLS-only server; nil for plain text
	host string      // the address it binds; "" for 127.0.0.1
	unix string      // a unix socket it listens on too (only, with port 0); "" for none
	wrap []string    // a command that runs it (ip netns exec NS); nil for none

	mu   sync.Mutex
	cmd  *exec.Cmd // nil while stopped
	exit chan struct{}
}

// Start starts a redis-server on a free loopback port, in a directory of
// the test's, with extra arguments (e.g. "--maxmemory", "1mb"), and stops it
// at the end of the test.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := Launch(Require(t, "redis-server"), t.TempDir(), extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartTLS is Start for a server that speaks only TLS on its port: extra
// must name its certificate files (--tls-cert-file, --tls-key-file,
// --tls-ca-cert-file), and client is the configuration with which it is
// checked to answer. Where the server does not start and its binary was
// built without TLS (it does not link libssl), the test is skipped, saying
// so, even with REMUTEX_REQUIRE_REDIS=1.
func StartTLS(t testing.TB, client *tls.Config, extra ...string) *Server {
	t.Helper()
	s := &Server{bin: Require(t, "redis-server"), dir: t.TempDir(), args: extra, tls: client}
	if err := s.startOnFreePort(); err != nil {
		if !linksTLS(s.bin) {
			v, _ := BinaryVersion(s.bin)
			t.Skipf("%s (%v) was built without TLS (it does not link libssl; build it with make BUILD_TLS=yes to run this test): %v", s.bin, v, err)
		}
		t.Fatalf("starting a TLS redis-server: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// startOnFreePort starts s on a free port, trying up to five: a port found
// free may be taken before the server binds it.
func (s *Server) startOnFreePort() error {
	var err error
	for try := 0; try < 5; try++ {
		if s.port, err = FreePort(); err != nil {
			continue
		}
		if err = s.start(); err == nil {
			return nil
		}
	}
	return err
}

// Launch starts a redis-server like Start, in dir, for a caller that is not
// a test (or outlives one): the caller stops it, and removes dir.
func Launch(bin, dir string, extra ...string) (*Server, error) {
	var err error
	for try := 0; try < 5; try++ {
		var port int
		if port, err = FreePort(); err != nil {
			continue
		}
		var s *Server
		if s, err = LaunchOn(bin, dir, port, extra...); err == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("starting redis-server: %w", err)
}

// LaunchOn is Launch on a given port.
func LaunchOn(bin, dir string, port int, extra ...string) (*Server, error) {
	s := &Server{bin: bin, port: port, dir: dir, args: extra}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// FreePort returns a loopback TCP port that was free a moment ago: one the
// system picks, or, where PortsEnv names a range, the next free one of that
// range.
func FreePort() (int, error) {
	lo, hi, err := portRange()
	if err != nil {
		return 0, err
	}
	if lo == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port, nil
	}
	for range hi - lo + 1 {
		port := lo + int(nextPort.Add(1)-1)%(hi-lo+1)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			_ = l.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port in %s=%d-%d", PortsEnv, lo, hi)
}

// PortsEnv names a range of ports, "lo-hi", that the servers a test starts
// listen on. Suites that run at once on one machine (see .ci/run) each get
// a range of their own: a port one suite's server has left may otherwise
// be taken by another's, which the first one's sentinels or cluster nodes
// still know and then reconfigure. Ports are taken in turn through the
// range, so that a suite reuses none soon either. Unset, the system picks.
const PortsEnv = "REMUTEX_TEST_PORTS"

// nextPort is the offset in the PortsEnv range that FreePort tries next.
var nextPort atomic.Int64

// portRange reads PortsEnv: 0, 0 when it is unset.
func portRange() (lo, hi int, err error) {
	v := os.Getenv(PortsEnv)
	if v == "" {
		return 0, 0, nil
	}
	a, b, ok := strings.Cut(v, "-")
	lo, err1 := strconv.Atoi(a)
	hi, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || lo < 1 || hi > 65535 || lo > hi {
		return 0, 0, fmt.Errorf("%s=%q: want lo-hi, two ports", PortsEnv, v)
	}
	return lo, hi, nil
}

// Addr returns host:port.
func (s *Server) Addr() string { return net.JoinHostPort(s.bindHost(), strconv.Itoa(s.port)) }

func (s *Server) bindHost() string {
	if s.host == "" {
		return "127.0.0.1"
	}
	return s.host
}

// UnixSocket returns the path of the server's unix socket, "" if it has
// none.
func (s *Server) UnixSocket() string { return s.unix }

// StartUnix starts a redis-server, like Start, that listens on a unix socket
// only (its path is UnixSocket): one that no network fault reaches, in any
// network namespace.
func StartUnix(t testing.TB, extra ...string) *Server {
	t.Helper()
	dir := socketDir(t)
	s := &Server{bin: Require(t, "redis-server"), dir: dir, unix: dir + "/redis.sock", args: extra}
	if err := s.start(); err != nil {
		t.Fatalf("starting a redis-server on a unix socket: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// socketDir returns a directory of the test's whose path leaves room for a
// unix socket's name (at most 107 bytes in all): t.TempDir's, unless the
// test's name makes it too long.
func socketDir(t testing.TB) string {
	t.Helper()
	if dir := t.TempDir(); len(dir) < 90 {
		return dir
	}
	dir, err := os.MkdirTemp("", "rt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Port returns the port.
func (s *Server) Port() int { return s.port }

// Dir returns the server's working directory.
func (s *Server) Dir() string { return s.dir }

// start launches the process and waits until it answers PING (or asks for a
// password: it answers).
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ports := []string{"--port", strconv.Itoa(s.port)}
	if s.tls != nil {
		ports = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port)}
	}
	args := append(ports, "--bind", s.bindHost(), "--save", "", "--appendonly", "no", "--dir", s.dir)
	if s.unix != "" {
		args = append(args, "--unixsocket", s.unix, "--unixsocketperm", "700")
	}
	if s.conf != "" {
		args = append([]string{s.conf}, args...)
	}
	argv := append(append(append([]string(nil), s.wrap...), s.bin), append(args, s.args...)...)
	cmd := exec.Command(argv[0], argv[1:]...)
	DieWithParent(cmd)
	out := &Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	exit := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exit) }()
	if err := s.awaitPing(exit); err != nil {
		_ = cmd.Process.Kill()
		<-exit
		return fmt.Errorf("%w; output:\n%s", err, out)
	}
	s.cmd, s.exit = cmd, exit
	return nil
}

// awaitPing waits up to 10s until the server answers, or exit closes.
func (s *Server) awaitPing(exit <-chan struct{}) error {
	o := &redis.Options{Addr: s.Addr(), TLSConfig: s.tls, MaxRetries: -1}
	if s.unix != "" { // reachable from any network namespace
		o.Network, o.Addr = "unix", s.unix
	}
	rdb := redis.NewClient(o)
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil || redis.HasErrorPrefix(err, "NOAUTH") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server did not answer PING within 10s: %w", err)
		}
		select {
		case <-exit:
			return fmt.Errorf("redis-server exited")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Stop kills the server (SIGKILL: nothing is persisted, nothing to save)
// and waits for it; a paused server is resumed first, so that it can die.
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	resume(s.cmd.Process)
	_ = s.cmd.Process.Kill()
	<-s.exit
	s.cmd = nil
}

// running reports whether the server was started and not stopped since.
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Restart kills the server and starts a fresh one on the same port: empty,
// since nothing is persisted.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	// The port may linger briefly, or be taken for a while: a port of the
	// system's ephemeral range, which a client's redial to it, finding
	// nothing listening, can take as its own end (TCP connects to itself).
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal(err)
}

// Signal sends sig (SIGSTOP, SIGCONT) to the server process.
func (s *Server) Signal(t testing.TB, sig os.Signal) {
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

// shared is the server Shared returns.
var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Shared returns one redis-server for the ordinary tests of a test binary,
// started on first use; each test uses keys of its own. Tests that kill,
// pause or reconfigure a server Start their own. TestMain calls StopShared
// after the tests.
func Shared(t testing.TB) *Server {
	t.Helper()
	bin := Require(t, "redis-server")
	shared.once.Do(func() {
		dir, err := os.MkdirTemp("", "redistest-")
		if err != nil {
			shared.err = err
			return
		}
		if shared.srv, shared.err = Launch(bin, dir); shared.err != nil {
			_ = os.RemoveAll(dir)
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.srv
}

// StopShared stops the shared server, if one was started, and removes its
// directory.
func StopShared() {
	if shared.srv != nil {
		shared.srv.Stop()
		_ = os.RemoveAll(shared.srv.dir)
	}
}

// Buffer is an io.Writer safe for concurrent use, e.g. a process's output or
// a log, read while it is written.
type Buffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
