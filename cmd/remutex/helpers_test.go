//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// The tests build the remutex binary and run it as a user would, against a
// redis-server they start themselves on a free loopback port. Without
// redis-server on PATH those tests skip with the reason, unless
// REMUTEX_REQUIRE_REDIS=1, when they fail.

// buildFlags are extra flags for building the binary under test; race_test.go
// adds -race when the tests run with it.
var buildFlags []string

var (
	binDir string // holds the binary; removed by TestMain
	bin    struct {
		once sync.Once
		path string
		err  error
	}
)

func TestMain(m *testing.M) {
	var err error
	if binDir, err = os.MkdirTemp("", "remutex-cli-test"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	redistest.StopShared()
	_ = os.RemoveAll(binDir)
	os.Exit(code)
}

// binary returns the path of the remutex binary, building it on first use.
// It is built once for all tests (into a directory TestMain removes), since
// every test runs it many times.
func binary(t testing.TB) string {
	t.Helper()
	bin.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		path := filepath.Join(binDir, "remutex")
		args := append([]string{"build", "-o", path}, buildFlags...)
		out, err := exec.Command(goBin, append(args, ".")...).CombinedOutput()
		if err != nil {
			bin.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		bin.path = path
	})
	if bin.err != nil {
		t.Fatal(bin.err)
	}
	return bin.path
}

// The Redis servers of the tests come from internal/redistest; these
// functions give them the names the tests here use.

// requireRedisServer returns the path of redis-server, skipping (or failing
// with REMUTEX_REQUIRE_REDIS=1) when there is none.
func requireRedisServer(t testing.TB) string {
	t.Helper()
	return redistest.Require(t, "redis-server")
}

// redisServer is a redis-server child process on 127.0.0.1.
type redisServer struct{ *redistest.Server }

func (s *redisServer) addr() string { return s.Addr() }

// stop kills the server (nothing to save) and waits for it.
func (s *redisServer) stop() {
	if s != nil {
		s.Stop()
	}
}

// startRedis starts a redis-server without persistence on a free loopback
// port, with extra arguments, and stops it when the test ends.
func startRedis(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	return &redisServer{redistest.Start(t, extra...)}
}

// launchRedis starts a redis-server in dir on a free port; the caller stops
// it.
func launchRedis(path, dir string, extra ...string) (*redisServer, error) {
	s, err := redistest.Launch(path, dir, extra...)
	if err != nil {
		return nil, err
	}
	return &redisServer{s}, nil
}

func freePort() (int, error) { return redistest.FreePort() }

// startRedisOn launches redis-server on port and waits until it answers PING.
func startRedisOn(path, dir string, port int, extra []string) (*redisServer, error) {
	s, err := redistest.LaunchOn(path, dir, port, extra...)
	if err != nil {
		return nil, err
	}
	return &redisServer{s}, nil
}

// sharedRedis returns one redis-server for the tests that need nothing
// special; each test uses lock names of its own.
func sharedRedis(t testing.TB) *redisServer {
	t.Helper()
	return &redisServer{redistest.Shared(t)}
}

// rdbFor returns a redis client for addr, closed when the test ends.
func rdbFor(t testing.TB, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// lockName returns a lock name unique to the test.
func lockName(t testing.TB, suffix string) string {
	return strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()) + ":" + suffix
}

// cliEnv is the environment the binary runs in: this process's, without the
// variables remutex reads, plus extra.
func cliEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "REDIS_ADDR" || k == "REDIS_URL" || strings.HasPrefix(k, "REMUTEX_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// proc is a running remutex process. Its output goes to files, not pipes, so
// that waiting for it never waits for a command's own children too.
type proc struct {
	t        testing.TB
	cmd      *exec.Cmd
	out, err string // paths of stdout and stderr
	done     chan struct{}
}

// start runs the binary with args in env (see cliEnv), stdin from stdin (nil:
// none), and kills it at the end of the test if it still runs.
func start(t testing.TB, env []string, stdin string, args ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	p := &proc{t: t, out: filepath.Join(dir, "stdout"), err: filepath.Join(dir, "stderr"), done: make(chan struct{})}
	stdout, err := os.Create(p.out)
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(p.err)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	p.cmd = exec.Command(binary(t), args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = stdout, stderr
	if stdin != "" {
		p.cmd.Stdin = strings.NewReader(stdin)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGCONT) // a stopped process must be able to die
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait waits up to d for the process to exit and returns its exit status
// (-1 if a signal killed it). It fails the test if it is still running.
func (p *proc) wait(d time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		p.t.Fatalf("remutex %v still running after %v; stderr:\n%s", p.cmd.Args[1:], d, p.stderr())
	}
	return p.cmd.ProcessState.ExitCode()
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

func (p *proc) stdout() string { return readFile(p.t, p.out) }
func (p *proc) stderr() string { return readFile(p.t, p.err) }

// run runs the binary to completion (at most 30s) and returns its exit
// status, stdout and stderr.
func run(t testing.TB, env []string, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := start(t, env, stdin, args...)
	code = p.wait(30 * time.Second)
	return code, p.stdout(), p.stderr()
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

// await polls cond until it holds, failing the test after d.
func await(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	redistest.WaitFor(t, d, what, cond)
}

// fileHas reports whether the file at path exists and contains s.
func fileHas(t testing.TB, path, s string) bool {
	t.Helper()
	return strings.Contains(readFile(t, path), s)
}

// wantRunUsage runs "remutex run ARGS job -- true" (against an address it
// never reaches) and wants the usage exit status with one line of stderr
// that mentions want.
func wantRunUsage(t *testing.T, args []string, want string) {
	t.Helper()
	var stdout, stderr strings.Builder
	c := &cli{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr,
		getenv: func(k string) string { return map[string]string{"REDIS_ADDR": "127.0.0.1:1"}[k] }}
	args = append(append([]string{"run"}, args...), "job", "--", "true")
	code := c.main(args)
	if code != exitUsage || !strings.Contains(stderr.String(), want) || strings.Count(stderr.String(), "\n") != 1 {
		t.Errorf("remutex %q: exit status %d, want %d with one line mentioning %q; stderr:\n%s", args, code, exitUsage, want, stderr.String())
	}
}
