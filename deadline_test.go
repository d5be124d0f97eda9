package remutex

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// Tests of deadlines against a Redis that does not answer: whatever the
// go-redis options, the context forms return promptly after their
// context's end, TryLock within TryLockTimeout, Unlock within its bound,
// and nothing is left behind once Redis answers again. The bounds are
// generous (deadlineSlack): what they catch is a call that waits for
// go-redis's own timeouts and retries (seconds).

// deadlineSlack is how long after its bound a call may return here: a
// loaded machine's scheduling, never go-redis's timeouts.
const deadlineSlack = 500 * time.Millisecond

// optionSets are go-redis options users pick: the README's (defaults: no
// ContextTimeoutEnabled, 3 retries, 3s ReadTimeout, dial retries) and the
// variations that measured worst.
var optionSets = []struct {
	name string
	set  func(*redis.Options)
}{
	{"defaults", func(*redis.Options) {}},
	{"ContextTimeoutEnabled", func(o *redis.Options) { o.ContextTimeoutEnabled = true }},
	{"MaxRetries-1", func(o *redis.Options) { o.MaxRetries = -1 }},
	{"ReadTimeout1s", func(o *redis.Options) { o.ReadTimeout = time.Second }},
}

// stalled is a Redis that stops answering: stall makes it so (after a
// warm-up through addr), resume undoes it, and clean says whether it can
// show what was left behind (a refusing address has nothing to show).
type stalled struct {
	addr          string
	stall, resume func()
	check         *redis.Client // reads the server directly; nil if none
}

// stalls are the ways Redis stops answering: a paused server (SIGSTOP), a
// connection that drops every byte, an address that refuses connections.
func stalls() map[string]func(t *testing.T) stalled {
	return map[string]func(t *testing.T) stalled{
		"paused": func(t *testing.T) stalled {
			srv := redistest.Start(t)
			return stalled{addr: srv.Addr(), check: rdbAt(t, srv.Addr()),
				stall:  func() { srv.Signal(t, syscall.SIGSTOP) },
				resume: func() { srv.Signal(t, syscall.SIGCONT) }}
		},
		"blackholed": func(t *testing.T) stalled {
			srv := redistest.Start(t)
			p := redistest.NewProxy(t, srv.Addr())
			return stalled{addr: p.Addr(), check: rdbAt(t, srv.Addr()),
				stall: func() { p.SetBlackhole(true) }, resume: p.Heal}
		},
		"refusing": func(t *testing.T) stalled {
			port, err := redistest.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			return stalled{addr: fmt.Sprintf("127.0.0.1:%d", port), stall: func() {}, resume: func() {}}
		},
	}
}

// TestDeadlinesHonoured runs the lock calls against each kind of stalled
// Redis with each option set.
func TestDeadlinesHonoured(t *testing.T) {
	for kind, start := range stalls() {
		for _, opts := range optionSets {
			t.Run(kind+"/"+opts.name, func(t *testing.T) {
				t.Parallel()
				testDeadlines(t, start(t), opts.set)
			})
		}
	}
}

func testDeadlines(t *testing.T, s stalled, opt func(*redis.Options)) {
	o := &redis.Options{Addr: s.addr}
	opt(o)
	c, errs := clientWithErrors(t, newRDB(t, o))
	name := lockName(t)
	m := c.NewMutex(name)
	held := c.NewMutex(name+"-held", NonReentrant())
	if s.check != nil {
		m.Lock() // warm up: connections, scripts
		m.Unlock()
		held.Lock()
	}
	s.stall()
	defer s.resume()

	within(t, "LockContext(100ms)", 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		return wantDeadline(m.LockContext(ctx))
	})
	within(t, "TryLock", TryLockTimeout, func() error {
		if m.TryLock() {
			return errors.New("TryLock: got true, want false (Redis does not answer)")
		}
		return nil
	})
	within(t, "TryLockContext(100ms)", 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		ok, err := m.TryLockContext(ctx)
		switch {
		case ok:
			return errors.New("TryLockContext: got true, want false")
		case s.check == nil && transient(err):
			return nil // refused before the deadline: one attempt, one error
		}
		return wantDeadline(err)
	})
	if s.check == nil {
		return
	}
	errs.await(t, context.DeadlineExceeded, hangGuard, "TryLock to report that Redis did not answer")
	within(t, "UnlockContext(100ms)", 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		return wantDeadline(held.UnlockContext(ctx))
	})
	s.resume()
	// What the calls cut off may have done is undone once Redis answers.
	for _, key := range []string{m.spec.hash(), m.spec.keys[2], held.spec.hash()} {
		waitFor(t, "no key "+key+" left behind", func() bool { return s.check.Exists(context.Background(), key).Val() == 0 })
	}
}

// within runs f, which must return within bound (and deadlineSlack).
func within(t *testing.T, what string, bound time.Duration, f func() error) {
	t.Helper()
	start := time.Now()
	err := f()
	took := time.Since(start)
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
	if took > bound+deadlineSlack {
		t.Errorf("%s returned after %v, want within %v (+%v slack)", what, took.Round(time.Millisecond), bound, deadlineSlack)
	}
}

// wantDeadline says what is wrong with err, the error of a call whose
// context's deadline passed while Redis did not answer.
func wantDeadline(err error) error {
	var le *LockError
	switch {
	case !errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("got %v, want context.DeadlineExceeded", err)
	case !errors.As(err, &le):
		return fmt.Errorf("got %T, want a *LockError", err)
	}
	return nil
}

// TestTryLockBesideStalledLockNeverPanics: TryLock runs beside a
// LockContext of the same mutex against a paused Redis, with a client
// whose ContextTimeoutEnabled lets a shared pipeline's timer fire a moment
// before TryLock's own: TryLock says false, every time, and never panics.
func TestTryLockBesideStalledLockNeverPanics(t *testing.T) {
	srv := redistest.Start(t)
	rdb := newRDB(t, &redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	c := clientOn(t, rdb)
	m := c.NewMutex(lockName(t))
	m.Lock()
	m.Unlock()
	srv.Signal(t, syscall.SIGSTOP)
	defer srv.Signal(t, syscall.SIGCONT)
	for i := range 6 {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), TryLockTimeout-time.Millisecond)
			defer cancel()
			done <- m.LockContext(ctx)
		}()
		if v := faultPanic(func() {
			if m.TryLock() {
				t.Errorf("round %d: TryLock against a paused Redis: got true", i)
			}
		}); v != nil {
			t.Fatalf("round %d: TryLock panicked: %v", i, v)
		}
		if err := await(t, done, "LockContext beside TryLock"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("round %d: LockContext: got %v, want context.DeadlineExceeded", i, err)
		}
	}
}

// TestNotRedis: a port that answers with something other than Redis (an
// HTTP server) makes Check fail naming it, and LockContext return a
// permanent error that says so.
func TestNotRedis(t *testing.T) {
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
	c := clientOn(t, newRDB(t, &redis.Options{Addr: ln.Addr().String(), MaxRetries: -1}))
	ctx := testCtx(t, hangGuard)
	if err := c.Check(ctx); !errors.Is(err, errNotRedis) {
		t.Errorf("Check of an HTTP server: got %v, want an error saying it is not Redis", err)
	}
	err = c.NewMutex(lockName(t)).LockContext(ctx)
	if !errors.Is(err, errNotRedis) || ctx.Err() != nil {
		t.Errorf("LockContext on an HTTP server: got %v, want at once an error saying it is not Redis", err)
	}
	if v := faultPanic(func() { c.NewMutex(lockName(t)).TryLock() }); v == nil {
		t.Errorf("TryLock on an HTTP server: no panic, want the documented panic for a server that is not Redis")
	}
}
