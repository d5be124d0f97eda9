package remutex

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fault-injection machinery: a TCP proxy that can blackhole, delay and reset
// connections; a fenced register that records every write attempt on a
// redis-server of its own; child holder processes (the test binary run
// again) that talk back over stdout; and small helpers for awaiting events.

// ---------------------------------------------------------------- proxy

// faultProxy forwards TCP connections from a loopback port to target. It can
// drop every byte (blackhole), delay what the server sends (latency), and
// cut a connection right after the server answered a chosen request, so
// that the request was applied but its reply never arrives.
type faultProxy struct {
	ln        net.Listener
	target    string
	latency   atomic.Int64 // server-to-client delay in ns
	blackhole atomic.Bool

	mu      sync.Mutex
	closed  bool
	links   map[*faultLink]struct{}
	pattern []byte // a request containing it has its reply cut
	armed   int    // how many more requests to cut
	cuts    int    // replies cut so far
	wg      sync.WaitGroup
}

// faultLink is one proxied connection.
type faultLink struct {
	client, server net.Conn
	cutReply       atomic.Bool
	once           sync.Once
	done           chan struct{}
}

func (l *faultLink) close() {
	l.once.Do(func() {
		close(l.done)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

// newFaultProxy starts a proxy to target on 127.0.0.1; it is closed, and its
// goroutines joined, at the end of the test.
func newFaultProxy(t testing.TB, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target, links: make(map[*faultLink]struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *faultProxy) Addr() string { return p.ln.Addr().String() }

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return
		}
		sc, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			_ = cc.Close()
			continue
		}
		l := &faultLink{client: cc, server: sc, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close()
			continue
		}
		p.links[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(l, cc, sc, true)
		go p.pump(l, sc, cc, false)
	}
}

// pump copies src to dst through a queue, so that chunks can be held back
// until their due time without stopping the reads.
func (p *faultProxy) pump(l *faultLink, src, dst net.Conn, up bool) {
	defer p.wg.Done()
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	type chunk struct {
		b   []byte
		due time.Time
	}
	queue := make(chan chunk, 1024)
	written := make(chan struct{})
	go func() {
		defer close(written)
		for c := range queue {
			if d := time.Until(c.due); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-l.done:
					t.Stop()
					return
				}
			}
			if _, err := dst.Write(c.b); err != nil {
				l.close()
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b := append([]byte(nil), buf[:n]...)
			if up {
				p.inspect(l, b)
			} else if l.cutReply.Load() {
				p.mu.Lock()
				p.cuts++
				p.mu.Unlock()
				l.close()
				break
			}
			if !p.blackhole.Load() {
				c := chunk{b: b}
				if !up {
					c.due = time.Now().Add(time.Duration(p.latency.Load()))
				}
				select {
				case queue <- c:
				case <-l.done:
				}
			}
		}
		if err != nil {
			break
		}
	}
	close(queue)
	<-written
}

func (p *faultProxy) inspect(l *faultLink, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed > 0 && bytes.Contains(b, p.pattern) {
		p.armed--
		l.cutReply.Store(true)
	}
}

// cutReplyTo makes the proxy pass the next request containing pattern to the
// server and then close that connection instead of passing the reply back.
func (p *faultProxy) cutReplyTo(pattern string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pattern, p.armed = []byte(pattern), 1
}

// replyCuts returns how many replies were cut so far.
func (p *faultProxy) replyCuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// setLatency delays every chunk the server sends by d.
func (p *faultProxy) setLatency(d time.Duration) { p.latency.Store(int64(d)) }

// setBlackhole drops every byte in both directions while on.
func (p *faultProxy) setBlackhole(on bool) { p.blackhole.Store(on) }

// heal ends blackholing and closes the connections that lost bytes, so that
// clients reconnect instead of reading a stream with holes.
func (p *faultProxy) heal() {
	p.blackhole.Store(false)
	p.latency.Store(0)
	p.mu.Lock()
	for l := range p.links {
		l.close()
	}
	p.mu.Unlock()
}

func (p *faultProxy) close() {
	p.mu.Lock()
	p.closed = true
	_ = p.ln.Close()
	for l := range p.links {
		l.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// ---------------------------------------------------------------- register

// faultRegisterLua is a fenced register: a write has a begin and an end, and
// each is accepted only if the writer's fence is at least the highest fence
// seen. Every attempt is appended to a log as
// "<ok|stale> <fence> <writer> <start µs> <end µs>" in server time, so
// overlapping writes and stale writers are visible afterwards.
// KEYS: highest fence, log, open writes. ARGV: begin|end, fence, writer.
const faultRegisterLua = `
local t = redis.call('time')
local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
local top = tonumber(redis.call('get', KEYS[1]) or '0')
local op, fence, writer = ARGV[1], ARGV[2], ARGV[3]
if op == 'begin' then
  if tonumber(fence) < top then
    redis.call('rpush', KEYS[2], 'stale ' .. fence .. ' ' .. writer .. ' ' .. now .. ' ' .. now)
    return 0
  end
  redis.call('set', KEYS[1], fence)
  redis.call('hset', KEYS[3], writer, fence .. ' ' .. now)
  return 1
end
local open = redis.call('hget', KEYS[3], writer)
redis.call('hdel', KEYS[3], writer)
local start = now
local ok = tonumber(fence) >= top
if open then
  local of, os = string.match(open, '^(%d+) (%d+)$')
  start = os
  if of ~= fence then ok = false end
else
  ok = false
end
local status = 'stale'
if ok then status = 'ok' end
redis.call('rpush', KEYS[2], status .. ' ' .. fence .. ' ' .. writer .. ' ' .. start .. ' ' .. now)
if ok then return 1 end
return 0
`

var faultRegisterScript = redis.NewScript(faultRegisterLua)

// faultRegister is the shared resource the holders of a lock write to.
type faultRegister struct {
	rdb  *redis.Client
	addr string
	key  string
}

// newFaultRegister starts a redis-server for the register (it outlives
// faults done to the lock's server) and returns the register on it.
func newFaultRegister(t testing.TB) *faultRegister {
	t.Helper()
	srv := startRedisServer(t)
	r := openFaultRegister(srv.Addr(), "register")
	t.Cleanup(func() { _ = r.rdb.Close() })
	return r
}

func openFaultRegister(addr, key string) *faultRegister {
	return &faultRegister{rdb: redis.NewClient(&redis.Options{Addr: addr}), addr: addr, key: key}
}

func (r *faultRegister) call(ctx context.Context, op string, fence int64, writer string) (bool, error) {
	keys := []string{r.key + ":top", r.key + ":log", r.key + ":open"}
	n, err := faultRegisterScript.Run(ctx, r.rdb, keys, op, fence, writer).Int64()
	return n == 1, err
}

// begin starts a write; it is accepted if fence is not below the highest seen.
func (r *faultRegister) begin(ctx context.Context, fence int64, writer string) (bool, error) {
	return r.call(ctx, "begin", fence, writer)
}

// end completes the write begun by writer; it is accepted if the begin was
// and fence is still not below the highest seen.
func (r *faultRegister) end(ctx context.Context, fence int64, writer string) (bool, error) {
	return r.call(ctx, "end", fence, writer)
}

// write is begin and end at once.
func (r *faultRegister) write(ctx context.Context, fence int64, writer string) (bool, error) {
	ok, err := r.begin(ctx, fence, writer)
	if err != nil || !ok {
		return ok, err
	}
	return r.end(ctx, fence, writer)
}

// faultWrite is one logged write attempt.
type faultWrite struct {
	ok         bool
	fence      int64
	writer     string
	start, end int64 // server µs
}

func (w faultWrite) String() string {
	s := "stale"
	if w.ok {
		s = "ok"
	}
	return fmt.Sprintf("%s fence=%d writer=%s [%d, %d]", s, w.fence, w.writer, w.start, w.end)
}

// log returns every write attempt in the order the register saw them.
func (r *faultRegister) log(t testing.TB) []faultWrite {
	t.Helper()
	lines, err := r.rdb.LRange(context.Background(), r.key+":log", 0, -1).Result()
	if err != nil {
		t.Fatalf("reading the register: %v", err)
	}
	ws := make([]faultWrite, 0, len(lines))
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) != 5 {
			t.Fatalf("register entry %q", l)
		}
		w := faultWrite{ok: f[0] == "ok", writer: f[2]}
		var e1, e2, e3 error
		w.fence, e1 = strconv.ParseInt(f[1], 10, 64)
		w.start, e2 = strconv.ParseInt(f[3], 10, 64)
		w.end, e3 = strconv.ParseInt(f[4], 10, 64)
		if err := errors.Join(e1, e2, e3); err != nil {
			t.Fatalf("register entry %q: %v", l, err)
		}
		ws = append(ws, w)
	}
	return ws
}

// check fails the test if accepted writes overlap in time, if their fences
// go back, or if two holds (writers) share a fence; it returns the accepted
// and the stale (rejected) writes.
func (r *faultRegister) check(t testing.TB) (accepted, stale []faultWrite) {
	t.Helper()
	for _, w := range r.log(t) {
		if w.ok {
			accepted = append(accepted, w)
		} else {
			stale = append(stale, w)
		}
	}
	sort.SliceStable(accepted, func(i, j int) bool { return accepted[i].start < accepted[j].start })
	for i := 1; i < len(accepted); i++ {
		a, b := accepted[i-1], accepted[i]
		switch {
		case b.fence < a.fence:
			t.Errorf("register: fence went back: %v then %v", a, b)
		case b.fence == a.fence && b.writer != a.writer:
			t.Errorf("register: two holders share a fence: %v and %v", a, b)
		case b.writer != a.writer && b.start < a.end:
			t.Errorf("register: overlapping writes: %v and %v", a, b)
		}
	}
	return accepted, stale
}

// ---------------------------------------------------------------- clients

// faultRDB returns a go-redis client on opt, closed at the end of the test.
func faultRDB(t testing.TB, opt *redis.Options) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// faultErrors collects what a Client's error handler hears.
type faultErrors struct {
	mu   sync.Mutex
	errs []error
	kick chan struct{} // capacity 1: an error arrived
}

func (e *faultErrors) handle(err error) {
	e.mu.Lock()
	e.errs = append(e.errs, err)
	e.mu.Unlock()
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// await waits until an error matching target was reported.
func (e *faultErrors) await(t testing.TB, target error, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for e.count(target) == 0 {
		select {
		case <-e.kick:
		case <-deadline.C:
			t.Fatalf("%s: the error handler heard nothing matching %v within %v (it heard %v)", what, target, timeout, e)
		}
	}
}

// count returns how many reported errors match target.
func (e *faultErrors) count(target error) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, err := range e.errs {
		if errors.Is(err, target) {
			n++
		}
	}
	return n
}

// len returns how many errors were reported.
func (e *faultErrors) len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.errs)
}

func (e *faultErrors) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return fmt.Sprint(e.errs)
}

// faultClient returns a remutex Client on rdb whose error handler records
// into the returned faultErrors; it is closed at the end of the test, before
// rdb.
func faultClient(t testing.TB, rdb redis.UniversalClient, opts ...Option) (*Client, *faultErrors) {
	t.Helper()
	errs := &faultErrors{kick: make(chan struct{}, 1)}
	log := slog.New(slog.NewTextHandler(faultTestWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := NewClient(rdb, append([]Option{WithErrorHandler(errs.handle), WithLogger(log)}, opts...)...)
	t.Cleanup(func() {
		if err := c.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return c, errs
}

// faultTestWriter writes a Client's log to the test's log.
type faultTestWriter struct{ t testing.TB }

func (w faultTestWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// faultGoroutine runs functions one after another on a goroutine of its own:
// holds belong to goroutines, so everything one hold does goes through one.
type faultGoroutine struct {
	work   chan func()
	done   chan struct{}
	mu     sync.Mutex
	panics []interface{}
}

// newFaultGoroutine starts the goroutine; it is stopped and joined at the end
// of the test, and a panic it met fails the test.
func newFaultGoroutine(t testing.TB) *faultGoroutine {
	t.Helper()
	g := &faultGoroutine{work: make(chan func()), done: make(chan struct{})}
	go func() {
		defer close(g.done)
		for f := range g.work {
			f()
		}
	}()
	t.Cleanup(func() {
		close(g.work)
		select {
		case <-g.done:
		case <-time.After(30 * time.Second):
			t.Errorf("a test goroutine is still busy 30s after the test")
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, p := range g.panics {
			t.Errorf("unexpected panic on a test goroutine: %v", p)
		}
	})
	return g
}

// async starts f on the goroutine and returns a channel closed when f returned.
func (g *faultGoroutine) async(f func()) <-chan struct{} {
	done := make(chan struct{})
	g.work <- func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				g.mu.Lock()
				g.panics = append(g.panics, r)
				g.mu.Unlock()
			}
		}()
		f()
	}
	return done
}

// do runs f on the goroutine and waits for it, failing the test after timeout.
func (g *faultGoroutine) do(t testing.TB, timeout time.Duration, what string, f func()) {
	t.Helper()
	faultAwait(t, g.async(f), timeout, what)
}

// faultAwait waits for ch to close and returns when it did, failing the
// test after timeout.
func faultAwait(t testing.TB, ch <-chan struct{}, timeout time.Duration, what string) time.Time {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-ch:
		return time.Now()
	case <-timer.C:
		t.Fatalf("%s: nothing after %v", what, timeout)
	}
	return time.Time{}
}

// faultClosed reports whether ch is closed.
func faultClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// faultEventually polls the state cond inspects (on a server: there is no
// event to wait for) until it returns nil, failing the test with its last
// error after timeout.
func faultEventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// faultCtx returns a context that ends after d or with the test.
func faultCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// faultPanic runs f and returns what it panicked with, or nil.
func faultPanic(f func()) (v interface{}) {
	defer func() { v = recover() }()
	f()
	return nil
}

// faultLogBuffer is an io.Writer for a slog handler, safe for concurrent use.
type faultLogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *faultLogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *faultLogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *faultLogBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// faultCommands records the commands a go-redis client sends (a hook).
type faultCommands struct {
	mu   sync.Mutex
	cmds []faultCommand
	kick chan struct{}
}

type faultCommand struct {
	at   time.Time
	args []interface{}
	err  error
}

func newFaultCommands() *faultCommands { return &faultCommands{kick: make(chan struct{}, 1)} }

func (h *faultCommands) record(cmds ...redis.Cmder) {
	h.mu.Lock()
	now := time.Now()
	for _, c := range cmds {
		h.cmds = append(h.cmds, faultCommand{at: now, args: c.Args(), err: c.Err()})
	}
	h.mu.Unlock()
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

func (h *faultCommands) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *faultCommands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.record(cmd)
		return err
	}
}

func (h *faultCommands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.record(cmds...)
		return err
	}
}

// since returns the commands completed at or after t.
func (h *faultCommands) since(t time.Time) []faultCommand {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []faultCommand
	for _, c := range h.cmds {
		if !c.at.Before(t) {
			out = append(out, c)
		}
	}
	return out
}

// await waits until match accepts a command completed at or after t.
func (h *faultCommands) await(tb testing.TB, t time.Time, timeout time.Duration, what string, match func(faultCommand) bool) {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		for _, c := range h.since(t) {
			if match(c) {
				return
			}
		}
		select {
		case <-h.kick:
		case <-deadline.C:
			tb.Fatalf("%s: not seen within %v", what, timeout)
		}
	}
}

// ---------------------------------------------------------------- children

// Child processes are this test binary run again with -test.run=^TestFaultChild$
// and the role in faultRoleEnv. They write events to stdout as lines
// "FAULT <kind> <fields...>" and read commands from stdin.
const (
	faultRoleEnv  = "REMUTEX_FAULT_ROLE"
	faultAddrEnv  = "REMUTEX_FAULT_ADDR"
	faultNameEnv  = "REMUTEX_FAULT_NAME"
	faultLeaseEnv = "REMUTEX_FAULT_LEASE"
	faultRegEnv   = "REMUTEX_FAULT_REGISTER"
	faultIDEnv    = "REMUTEX_FAULT_ID"
	faultGEnv     = "REMUTEX_FAULT_GOROUTINES"
)

// faultChildConfig is what a child is told through its environment.
type faultChildConfig struct {
	role       string
	addr       string
	name       string
	lease      time.Duration
	register   string // address of the register's server
	id         string
	goroutines int
}

func (c faultChildConfig) env() []string {
	return []string{
		faultRoleEnv + "=" + c.role,
		faultAddrEnv + "=" + c.addr,
		faultNameEnv + "=" + c.name,
		faultLeaseEnv + "=" + c.lease.String(),
		faultRegEnv + "=" + c.register,
		faultIDEnv + "=" + c.id,
		faultGEnv + "=" + strconv.Itoa(c.goroutines),
	}
}

// faultChild is a running child process seen from the parent.
type faultChild struct {
	cfg    faultChildConfig
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr faultLogBuffer
	exited chan struct{} // closed once stdout hit EOF and the process was reaped

	mu     sync.Mutex
	events [][]string // not yet consumed
	kick   chan struct{}
	killed bool
}

// startFaultChild starts a child in the given role; it is killed and reaped
// at the end of the test.
func startFaultChild(t testing.TB, cfg faultChildConfig) *faultChild {
	t.Helper()
	c := &faultChild{cfg: cfg, exited: make(chan struct{}), kick: make(chan struct{}, 1)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestFaultChild$", "-test.count=1")
	dieWithParent(c.cmd)
	c.cmd.Env = append(os.Environ(), cfg.env()...)
	c.cmd.Stderr = &c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go c.read(stdout)
	t.Cleanup(func() {
		c.kill()
		_ = c.stdin.Close()
	})
	return c
}

func (c *faultChild) read(stdout io.Reader) {
	defer close(c.exited)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "FAULT ")
		if !ok {
			continue
		}
		c.mu.Lock()
		c.events = append(c.events, strings.Fields(rest))
		c.mu.Unlock()
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	_ = c.cmd.Wait()
}

func (c *faultChild) pid() int { return c.cmd.Process.Pid }

// send writes one command line to the child.
func (c *faultChild) send(t testing.TB, line string) {
	t.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		t.Fatalf("child %s: sending %q: %v", c.cfg.id, line, err)
	}
}

// take removes and returns the first pending event of kind, if any.
func (c *faultChild) take(kind string) ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.events {
		if len(e) > 0 && e[0] == kind {
			c.events = append(c.events[:i], c.events[i+1:]...)
			return e[1:], true
		}
	}
	return nil, false
}

// has reports whether an event of kind is pending.
func (c *faultChild) has(kind string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.events {
		if len(e) > 0 && e[0] == kind {
			return true
		}
	}
	return false
}

// drop discards the pending events of kind.
func (c *faultChild) drop(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.events[:0]
	for _, e := range c.events {
		if len(e) == 0 || e[0] != kind {
			kept = append(kept, e)
		}
	}
	c.events = kept
}

// expect waits for the next event of kind and returns its fields, failing
// the test after timeout or when the child exits first.
func (c *faultChild) expect(t testing.TB, kind string, timeout time.Duration) []string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if f, ok := c.take(kind); ok {
			return f
		}
		select {
		case <-c.kick:
		case <-c.exited:
			if f, ok := c.take(kind); ok {
				return f
			}
			t.Fatalf("child %s exited before %q; stderr:\n%s", c.cfg.id, kind, c.stderr.String())
		case <-deadline.C:
			c.mu.Lock()
			pending := fmt.Sprint(c.events)
			c.mu.Unlock()
			t.Fatalf("child %s: no %q within %v (pending %s); stderr:\n%s", c.cfg.id, kind, timeout, pending, c.stderr.String())
		}
	}
}

// signal sends sig to the child.
func (c *faultChild) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("child %s: %v: %v", c.cfg.id, sig, err)
	}
}

// kill SIGKILLs the child and waits until it is reaped.
func (c *faultChild) kill() {
	c.mu.Lock()
	c.killed = true
	c.mu.Unlock()
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// TestFaultChild is the entry point of child processes; run normally it
// returns at once.
func TestFaultChild(t *testing.T) {
	role := os.Getenv(faultRoleEnv)
	if role == "" {
		return
	}
	cfg := faultChildConfig{
		role:     role,
		addr:     os.Getenv(faultAddrEnv),
		name:     os.Getenv(faultNameEnv),
		register: os.Getenv(faultRegEnv),
		id:       os.Getenv(faultIDEnv),
	}
	cfg.lease, _ = time.ParseDuration(os.Getenv(faultLeaseEnv))
	cfg.goroutines, _ = strconv.Atoi(os.Getenv(faultGEnv))
	out := &faultOut{}
	var code int
	switch role {
	case "holder":
		code = faultHolderRole(cfg, out)
	case "soak":
		code = faultSoakRole(cfg, out)
	default:
		out.emit("fatal", "unknown-role", role)
		code = 2
	}
	os.Exit(code)
}

// faultOut writes event lines from any goroutine of a child.
type faultOut struct{ mu sync.Mutex }

func (o *faultOut) emit(fields ...interface{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintln(os.Stdout, append([]interface{}{"FAULT"}, fields...)...)
}

// faultErrKind names an error for the event protocol.
func faultErrKind(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, ErrLockLost):
		return "lost"
	case errors.Is(err, ErrNotHeld):
		return "notheld"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "ctx"
	}
	return "other:" + strings.ReplaceAll(err.Error(), " ", "_")
}

// faultHolderRole holds a lock under the parent's commands, one per stdin
// line, all run on the role's goroutine (holds belong to goroutines):
//
//	lock       Lock; emits "held <fence> <count>" (and "lost" once the hold is lost)
//	begin|end  a register write with the hold's fence; emits "begin|end <1|0>"
//	unlockctx  UnlockContext; emits "unlockctx <error kind>"
//	unlock     Unlock; emits "unlock ok" or "unlock panic:<value>"
//	count      emits "count <HoldCount>"
//
// The error handler's reports are emitted as "handler <error kind>".
func faultHolderRole(cfg faultChildConfig, out *faultOut) int {
	rdb := redis.NewClient(&redis.Options{Addr: cfg.addr})
	c := NewClient(rdb, WithErrorHandler(func(err error) { out.emit("handler", faultErrKind(err)) }))
	m := c.NewMutex(cfg.name, WithLease(cfg.lease), WithFencing())
	reg := openFaultRegister(cfg.register, "register")
	writer := "child" + cfg.id + "." + strconv.Itoa(os.Getpid())
	ctx := context.Background()
	out.emit("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "lock":
			m.Lock()
			if m.HoldCount() == 1 {
				lost := m.Lost()
				go func() {
					<-lost
					out.emit("lost")
				}()
			}
			out.emit("held", m.Fence(), m.HoldCount())
		case "begin":
			ok, err := reg.begin(ctx, m.Fence(), writer)
			out.emit("begin", faultBool(ok, err))
		case "end":
			ok, err := reg.end(ctx, m.Fence(), writer)
			out.emit("end", faultBool(ok, err))
		case "unlockctx":
			uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := m.UnlockContext(uctx)
			cancel()
			out.emit("unlockctx", faultErrKind(err))
		case "unlock":
			if p := faultPanic(m.Unlock); p != nil {
				out.emit("unlock", strings.ReplaceAll(fmt.Sprint("panic:", p), " ", "_"))
			} else {
				out.emit("unlock", "ok")
			}
		case "count":
			out.emit("count", m.HoldCount())
		case "exit":
			_ = c.Close()
			_ = rdb.Close()
			return 0
		}
	}
	return 0
}

func faultBool(ok bool, err error) string {
	switch {
	case err != nil:
		return "error:" + strings.ReplaceAll(err.Error(), " ", "_")
	case ok:
		return "1"
	}
	return "0"
}

// faultSoakRole runs cfg.goroutines goroutines that lock, write to the
// register inside the lock, and unlock, until "stop" arrives on stdin. Each
// hold emits "h <fence>" when taken and "w <fence>" once its write and
// unlock succeeded; anything wrong is emitted as "bad <what>". At the end it
// emits "done <holds>".
func faultSoakRole(cfg faultChildConfig, out *faultOut) int {
	rdb := redis.NewClient(&redis.Options{Addr: cfg.addr})
	c := NewClient(rdb, WithErrorHandler(func(err error) {
		if errors.Is(err, ErrLockLost) {
			out.emit("bad", "handler", faultErrKind(err))
		}
	}))
	m := c.NewMutex(cfg.name, WithLease(cfg.lease), WithFencing())
	reg := openFaultRegister(cfg.register, "register")
	ctx, cancel := context.WithCancel(context.Background())
	var holds atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < cfg.goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
				err := m.LockContext(lctx)
				lcancel()
				if err != nil {
					if ctx.Err() == nil {
						out.emit("bad", "lock", faultErrKind(err))
					}
					continue
				}
				f := m.Fence()
				lost := m.Lost()
				out.emit("h", f)
				writer := fmt.Sprintf("c%s.%d.g%d.h%d", cfg.id, os.Getpid(), g, i)
				wctx := context.WithoutCancel(ctx)
				ok1, err1 := reg.begin(wctx, f, writer)
				time.Sleep(time.Millisecond + rand.N(10*time.Millisecond))
				ok2, err2 := reg.end(wctx, f, writer)
				if faultClosed(lost) {
					out.emit("bad", "lost", f)
				}
				uerr := m.UnlockContext(wctx)
				switch {
				case err1 != nil || err2 != nil:
					out.emit("bad", "register", faultBool(false, errors.Join(err1, err2)))
				case !ok1 || !ok2:
					out.emit("bad", "stale", f)
				case uerr != nil:
					out.emit("bad", "unlock", faultErrKind(uerr))
				default:
					holds.Add(1)
					out.emit("w", f)
				}
			}
		}()
	}
	out.emit("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() && sc.Text() != "stop" {
	}
	cancel()
	wg.Wait()
	_ = c.Close()
	_ = rdb.Close()
	_ = reg.rdb.Close()
	out.emit("done", holds.Load())
	return 0
}
