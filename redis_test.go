package remutex

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/remutex/remutex/internal/redistest"
)

// Test infrastructure: every behaviour test runs on miniredis and on a real
// redis-server that the tests start themselves on a free loopback port (see
// internal/redistest). Without redis-server on PATH the real-server runs
// skip with a reason, unless REMUTEX_REQUIRE_REDIS=1, when they fail.

func TestMain(m *testing.M) {
	if role := redistest.ChildRole(); role != "" {
		os.Exit(runChild(role))
	}
	redistest.DefaultParallel(parallelTests)
	code := m.Run()
	redistest.StopShared()
	if code == 0 {
		// Lock calls on a closed Client block for good, by design (see
		// TestCloseWhileWaiting).
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/remutex/remutex.(*Client).blockClosed")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak after the suite:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// parallelTests is how many of the package's parallel tests run at once
// unless -parallel says otherwise (see redistest.DefaultParallel): six
// keep the package under one core of two, its parallel tests waiting on
// leases, failovers and servers of their own, and leave room for a
// hand-off's 750ms claim beside busy processes.
const parallelTests = 6

// testBackend is one Redis to run a behaviour test on.
type testBackend struct {
	name string
	addr string
	mr   *miniredis.Miniredis // set for miniredis
	srv  *redistest.Server    // set for a real server
}

func (b *testBackend) real() bool { return b.srv != nil }

// serverOnlyEnv, set to 1, leaves out eachBackend's miniredis subtests: a
// run of the suite against another server binary (see .ci/run) repeats
// only what that server can change.
const serverOnlyEnv = "REMUTEX_SERVER_ONLY"

// eachBackend runs f as a subtest on miniredis (unless serverOnlyEnv is
// set) and on the shared real redis-server.
func eachBackend(t *testing.T, f func(t *testing.T, b *testBackend)) {
	t.Helper()
	runBackends(t, false, f)
}

// eachBackendParallel is eachBackend for a test that touches no server-wide
// state (no SCRIPT FLUSH, CONFIG SET, FLUSHALL, KEYS or SCAN over all keys,
// no counting of commands or goroutines, no package-level hook), keeps to
// keys of its own (lockName) and asserts no timing that the load of other
// tests could break: it runs beside the package's other parallel tests
// (after every serial one), and its two backends at once.
func eachBackendParallel(t *testing.T, f func(t *testing.T, b *testBackend)) {
	t.Helper()
	t.Parallel()
	runBackends(t, true, f)
}

func runBackends(t *testing.T, parallel bool, f func(t *testing.T, b *testBackend)) {
	t.Helper()
	if os.Getenv(serverOnlyEnv) != "1" {
		t.Run("miniredis", func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			mr := miniredis.RunT(t)
			f(t, &testBackend{name: "miniredis", addr: mr.Addr(), mr: mr})
		})
	}
	t.Run("redis-server", func(t *testing.T) {
		if parallel {
			t.Parallel()
		}
		srv := redistest.Shared(t)
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
	return newRDB(t, o)
}

// client returns a remutex Client on a new connection pool, closed at the
// end of the test (before its pool).
func (b *testBackend) client(t testing.TB, opts ...Option) *Client {
	t.Helper()
	return clientOn(t, b.rdb(t), opts...)
}

// newRDB returns a go-redis client on opt, closed at the end of the test.
func newRDB(t testing.TB, opt *redis.Options) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// rdbAt returns a go-redis client for addr, closed at the end of the test.
func rdbAt(t testing.TB, addr string) *redis.Client {
	t.Helper()
	return newRDB(t, &redis.Options{Addr: addr})
}

// clientOn returns a remutex Client on rdb that logs to the test's log (a
// benchmark's: nowhere), closed at the end of the test, before rdb when rdb
// was made first. opts may override the logger.
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

// clientWithErrors is clientOn with an error handler that records into the
// returned errorLog.
func clientWithErrors(t testing.TB, rdb redis.UniversalClient, opts ...Option) (*Client, *errorLog) {
	t.Helper()
	errs := newErrorLog()
	return clientOn(t, rdb, append([]Option{WithErrorHandler(errs.handler)}, opts...)...), errs
}

// testLogger writes records of level Info and above to the test's log; a
// benchmark's logs nothing.
func testLogger(t testing.TB) *slog.Logger {
	if _, ok := t.(*testing.B); ok {
		return slog.New(slog.DiscardHandler)
	}
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

// skipShort skips t under -short, the quick loop of behaviour tests; why
// names the kind of test the loop leaves out (fault suites, soaks and
// failovers, which start topologies and wait out leases).
func skipShort(t *testing.T, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipped under -short: " + why)
	}
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
		srv := redistest.Start(t, extra...)
		f(t, &testBackend{name: "redis-server", addr: srv.Addr(), srv: srv})
	})
}

// restart loses every key, as a restart without persistence does. miniredis
// is closed, flushed and started again on the same address.
func (b *testBackend) restart(t testing.TB) {
	t.Helper()
	if b.real() {
		b.srv.Restart(t)
		return
	}
	b.mr.Close()
	b.mr.FlushAll()
	// The port may be taken meanwhile, for a while: a port of the system's
	// ephemeral range, which a Client's redial to it, finding nothing
	// listening, can take as its own end (TCP connects to itself).
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := b.mr.Restart()
		if err == nil {
			return
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
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
	redistest.WaitFor(t, hangGuard, what, cond)
}

// isClosed reports whether ch is closed, without waiting.

// lockKeyNames are the keys and channel of a lock under the default prefix.
type lockKeyNames struct {
	hash, fence, queue, channel string
}

func keysOf(name string) lockKeyNames {
	h := DefaultKeyPrefix + "{" + name + "}"
	return lockKeyNames{hash: h, fence: h + ":fence", queue: h + ":waiting", channel: h + ":released:"}
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

// commandLog is a go-redis hook that records the dials and every command
// (pipelined ones one by one) once it completed, with its arguments and
// error. The zero value is ready to use.
type commandLog struct {
	mu    sync.Mutex
	dials int
	cmds  []loggedCommand
	kick  chan struct{} // capacity 1: a command completed
}

type loggedCommand struct {
	at   time.Time
	args []interface{}
	err  error
}

func newCommandLog() *commandLog { return &commandLog{} }

func (h *commandLog) record(cmds ...redis.Cmder) {
	h.mu.Lock()
	now := time.Now()
	for _, c := range cmds {
		// (A copy: remutex reuses the arguments of its hot calls, see
		// docs/api.md.)
		h.cmds = append(h.cmds, loggedCommand{at: now, args: slices.Clone(c.Args()), err: c.Err()})
	}
	kick := h.kicks()
	h.mu.Unlock()
	select {
	case kick <- struct{}{}:
	default:
	}
}

// kicks returns the channel signalled after each record; h.mu is held.
func (h *commandLog) kicks() chan struct{} {
	if h.kick == nil {
		h.kick = make(chan struct{}, 1)
	}
	return h.kick
}

func (h *commandLog) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.mu.Lock()
		h.dials++
		h.mu.Unlock()
		return next(ctx, network, addr)
	}
}

func (h *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.record(cmd)
		return err
	}
}

func (h *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.record(cmds...)
		return err
	}
}

// counts returns the dials and the names of the commands so far.
func (h *commandLog) counts() (dials int, names []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.cmds {
		if len(c.args) > 0 {
			names = append(names, strings.ToLower(fmt.Sprint(c.args[0])))
		}
	}
	return h.dials, names
}

// since returns the commands completed at or after t.
func (h *commandLog) since(t time.Time) []loggedCommand {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []loggedCommand
	for _, c := range h.cmds {
		if !c.at.Before(t) {
			out = append(out, c)
		}
	}
	return out
}

// await waits until match accepts a command completed at or after t.
func (h *commandLog) await(tb testing.TB, t time.Time, timeout time.Duration, what string, match func(loggedCommand) bool) {
	tb.Helper()
	h.mu.Lock()
	kick := h.kicks()
	h.mu.Unlock()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		for _, c := range h.since(t) {
			if match(c) {
				return
			}
		}
		select {
		case <-kick:
		case <-deadline.C:
			tb.Fatalf("%s: not seen within %v", what, timeout)
		}
	}
}

// errorLog collects what a Client's error handler hears.
type errorLog struct {
	mu   sync.Mutex
	errs []error
	ch   chan error    // every error (the first 1000), for tests that await one
	kick chan struct{} // capacity 1: an error arrived
}

func newErrorLog() *errorLog {
	return &errorLog{ch: make(chan error, 1000), kick: make(chan struct{}, 1)}
}

// handler is the error handler (WithErrorHandler).
func (l *errorLog) handler(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
	select {
	case l.ch <- err:
	default:
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// all returns the errors heard so far.
func (l *errorLog) all() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

// matching returns the errors heard that match target with errors.Is.
func (l *errorLog) matching(target error) []error {
	var out []error
	for _, err := range l.all() {
		if errors.Is(err, target) {
			out = append(out, err)
		}
	}
	return out
}

// count returns how many errors heard match target.
func (l *errorLog) count(target error) int { return len(l.matching(target)) }

// len returns how many errors were heard.
func (l *errorLog) len() int { return len(l.all()) }

func (l *errorLog) String() string { return fmt.Sprint(l.all()) }

// await waits until an error matching target was heard.
func (l *errorLog) await(t testing.TB, target error, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for l.count(target) == 0 {
		select {
		case <-l.kick:
		case <-deadline.C:
			t.Fatalf("%s: the error handler heard nothing matching %v within %v (it heard %v)", what, target, timeout, l)
		}
	}
}

// scriptNames maps the SHA1 of each of the library's scripts to its name.
// The uncontended cycle's quick_lock.lua is the free path of acquire.lua
// and counts as it; its release, a plain HDEL (ZREM of a reader) with an
// EXISTS, counts as release (see scriptCall), and wake.lua, which a release
// that found somebody queued sends after it, as wake.
var scriptNames = map[string]string{
	mutexScripts.acquire.Hash(): "acquire",
	quickLock.Hash():            "acquire",
	mutexScripts.release.Hash(): "release",
	mutexScripts.leave.Hash():   "leave",
	renewScript.Hash():          "renew",
	wakeScript.Hash():           "wake",
}

// quickCall says whether cmd runs one of the uncontended cycle's scripts.
func quickCall(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	sha := fmt.Sprint(args[1])
	switch strings.ToLower(fmt.Sprint(args[0])) {
	case "eval":
		sum := sha1.Sum([]byte(sha))
		sha = hex.EncodeToString(sum[:])
	case "evalsha":
	case "hdel", "zrem": // the uncontended release
		return true
	default:
		return false
	}
	for _, s := range []*luaScript{quickLock, quickRLock} {
		if s.Hash() == sha {
			return true
		}
	}
	return false
}

// plainRelease names an uncontended final release: HDEL of a lock hash
// (release) or ZREM of a readers key (runlock), with its key.
func plainRelease(args []interface{}) (string, []string) {
	key := fmt.Sprint(args[1])
	if strings.HasSuffix(key, ":readers") {
		return "runlock", []string{key}
	}
	return "release", []string{key}
}

// scriptCall reports which of the library's scripts cmd runs (EVALSHA or
// EVAL) and the keys it passes; name is "" for any other command.
func scriptCall(cmd redis.Cmder) (name string, keys []string) { return scriptCallArgs(cmd.Args()) }

// scriptCallArgs is scriptCall for a command's arguments.
func scriptCallArgs(args []interface{}) (name string, keys []string) {
	if len(args) < 3 {
		return "", nil
	}
	switch strings.ToLower(fmt.Sprint(args[0])) {
	case "hdel", "zrem": // the uncontended final release (see quick.go)
		return plainRelease(args)
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
