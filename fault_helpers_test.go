package remutex

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// Fault-injection helpers that need the package: the roles of child holder
// processes (the test binary run again, see redistest.StartChild), and a
// goroutine that owns the holds of a test. The proxy, the processes and the
// fenced register are in internal/redistest.

// ---------------------------------------------------------------- children

// childConfig is what a holder child is told (see redistest.HolderConfig).
type childConfig = redistest.HolderConfig

// startChild starts a child process in cfg's role; it is killed and reaped
// at the end of the test.
func startChild(t testing.TB, cfg childConfig) *redistest.Child {
	t.Helper()
	return redistest.StartHolder(t, cfg)
}

// startChildHolder starts a child that holds lock name on the Redis at addr
// with the given lease (the role "hold").
func startChildHolder(t testing.TB, addr, name string, lease time.Duration) *redistest.Child {
	t.Helper()
	return startChild(t, childConfig{Role: "hold", Addr: addr, Name: name, Lease: lease, ID: "holder"})
}

// runChild is the test binary run as a child (see TestMain): it reads its
// childConfig and plays role.
func runChild(role string) int {
	cfg := redistest.HolderFromEnv(role)
	switch role {
	case "hold":
		return holdRole(cfg)
	case "holder":
		return faultHolderRole(cfg)
	case "soak":
		return faultSoakRole(cfg)
	case "rw":
		return rwRole(cfg)
	case "sem":
		return semRole(cfg)
	case "once":
		return onceRole(cfg)
	case "elect":
		return electRole(cfg)
	}
	redistest.Emit("fatal", "unknown-role", role)
	return 2
}

// holdRole locks cfg.Name (WithFencing) and emits "locked <fence>"; when the
// hold is lost it unlocks and emits "lost <whether UnlockContext reported
// ErrLockLost>".
func holdRole(cfg childConfig) int {
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	defer rdb.Close()
	c := NewClient(rdb, WithLogger(slog.New(slog.DiscardHandler)))
	defer c.Close()
	m := c.NewMutex(cfg.Name, WithLease(cfg.Lease), WithFencing())
	if err := m.LockContext(context.Background()); err != nil {
		redistest.Emit("error", faultErrKind(err))
		return 1
	}
	redistest.Emit("locked", m.Fence())
	<-m.Lost()
	err := m.UnlockContext(context.Background())
	redistest.Emit("lost", errors.Is(err, ErrLockLost))
	return 0
}

// ---------------------------------------------------------------- goroutines

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

// testCtx returns a context that ends after d or with the test.
func testCtx(t testing.TB, d time.Duration) context.Context {
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

// faultLogBuffer keeps a Client's log (see logger) for the test to read.
type faultLogBuffer struct{ redistest.Buffer }

func (b *faultLogBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// ---------------------------------------------------------------- roles

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
func faultHolderRole(cfg childConfig) int {
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	c := NewClient(rdb, WithErrorHandler(func(err error) { redistest.Emit("handler", faultErrKind(err)) }))
	m := c.NewMutex(cfg.Name, WithLease(cfg.Lease), WithFencing())
	reg := redistest.OpenRegister(cfg.Register, cfg.RegisterKey)
	writer := "child" + cfg.ID + "." + strconv.Itoa(os.Getpid())
	ctx := context.Background()
	redistest.Emit("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "lock":
			m.Lock()
			if m.HoldCount() == 1 {
				lost := m.Lost()
				go func() {
					<-lost
					redistest.Emit("lost")
				}()
			}
			redistest.Emit("held", m.Fence(), m.HoldCount())
		case "begin":
			ok, err := reg.Begin(ctx, m.Fence(), writer)
			redistest.Emit("begin", faultBool(ok, err))
		case "end":
			ok, err := reg.End(ctx, m.Fence(), writer)
			redistest.Emit("end", faultBool(ok, err))
		case "unlockctx":
			uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := m.UnlockContext(uctx)
			cancel()
			redistest.Emit("unlockctx", faultErrKind(err))
		case "unlock":
			if p := faultPanic(m.Unlock); p != nil {
				redistest.Emit("unlock", strings.ReplaceAll(fmt.Sprint("panic:", p), " ", "_"))
			} else {
				redistest.Emit("unlock", "ok")
			}
		case "count":
			redistest.Emit("count", m.HoldCount())
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

// faultSoakRole runs cfg.Goroutines goroutines that lock, write to the
// register inside the lock, and unlock, until "stop" arrives on stdin. Each
// hold emits "h <fence>" when taken and "w <fence>" once its write and
// unlock succeeded; anything wrong is emitted as "bad <what>". At the end it
// emits "done <holds>".
func faultSoakRole(cfg childConfig) int {
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	c := NewClient(rdb, WithErrorHandler(func(err error) {
		if errors.Is(err, ErrLockLost) {
			redistest.Emit("bad", "handler", faultErrKind(err))
		}
	}))
	m := c.NewMutex(cfg.Name, WithLease(cfg.Lease), WithFencing())
	reg := redistest.OpenRegister(cfg.Register, cfg.RegisterKey)
	ctx, cancel := context.WithCancel(context.Background())
	var holds atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < cfg.Goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
				err := m.LockContext(lctx)
				lcancel()
				if err != nil {
					if ctx.Err() == nil {
						redistest.Emit("bad", "lock", faultErrKind(err))
					}
					continue
				}
				f := m.Fence()
				lost := m.Lost()
				redistest.Emit("h", f)
				writer := fmt.Sprintf("c%s.%d.g%d.h%d", cfg.ID, os.Getpid(), g, i)
				wctx := context.WithoutCancel(ctx)
				ok1, err1 := reg.Begin(wctx, f, writer)
				time.Sleep(time.Millisecond + rand.N(10*time.Millisecond))
				ok2, err2 := reg.End(wctx, f, writer)
				if isClosed(lost) {
					redistest.Emit("bad", "lost", f)
				}
				uerr := m.UnlockContext(wctx)
				switch {
				case err1 != nil || err2 != nil:
					redistest.Emit("bad", "register", faultBool(false, errors.Join(err1, err2)))
				case !ok1 || !ok2:
					redistest.Emit("bad", "stale", f)
				case uerr != nil:
					redistest.Emit("bad", "unlock", faultErrKind(uerr))
				default:
					holds.Add(1)
					redistest.Emit("w", f)
				}
			}
		}()
	}
	redistest.Emit("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() && sc.Text() != "stop" {
	}
	cancel()
	wg.Wait()
	_ = c.Close()
	_ = rdb.Close()
	_ = reg.Close()
	redistest.Emit("done", holds.Load())
	return 0
}
