package remutex

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	t.Parallel()
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
	plain := c.NewMutex(name+"-plain", NonReentrant()) // (any goroutine may unlock it)
	// A Client with no other call in flight: its Unlock's call goes on the
	// caller's goroutine when the go-redis client follows contexts.
	lone := clientOn(t, newRDB(t, o)).NewMutex(name+"-lone", NonReentrant())
	if s.check != nil {
		m.Lock() // warm up: connections, scripts
		m.Unlock()
		held.Lock()
		plain.Lock()
		lone.Lock()
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
	within(t, "Unlock", UnlockTimeout, func() error {
		plain.Unlock()
		return nil
	})
	within(t, "Unlock with nothing else in flight", UnlockTimeout, func() error {
		lone.Unlock()
		return nil
	})
	s.resume()
	// What the calls cut off may have done is undone once Redis answers.
	for _, key := range []string{m.spec.hash(), m.spec.Keys[2], held.spec.hash(), plain.spec.hash(), lone.spec.hash()} {
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
	t.Parallel()
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
	c := clientOn(t, newRDB(t, &redis.Options{Addr: fakeHTTP(t), MaxRetries: -1}))
	ctx := testCtx(t, hangGuard)
	if err := c.Check(ctx); !errors.Is(err, errNotRedis) {
		t.Errorf("Check of an HTTP server: got %v, want an error saying it is not Redis", err)
	}
	err := c.NewMutex(lockName(t)).LockContext(ctx)
	if !errors.Is(err, errNotRedis) || ctx.Err() != nil {
		t.Errorf("LockContext on an HTTP server: got %v, want at once an error saying it is not Redis", err)
	}
	if v := faultPanic(func() { c.NewMutex(lockName(t)).TryLock() }); v == nil {
		t.Errorf("TryLock on an HTTP server: no panic, want the documented panic for a server that is not Redis")
	}
}

// TestPostedReleaseRetried: the release posted behind an UnlockContext that
// its context cut off fails too (a connection cut, with go-redis's retries
// off). The node sends it again, so the lock is free once Redis answers,
// and before the goroutine's next Lock, which takes the lock with the same
// owner token: sent after it, it would end that new hold on the server.
func TestPostedReleaseRetried(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		var cut releaseCuts
		log := newCommandLog()
		rdb := b.rdb(t, func(o *redis.Options) { o.MaxRetries = -1 })
		rdb.AddHook(log)
		rdb.AddHook(cut.hook())
		c := clientOn(t, rdb)
		m := c.NewMutex(lockName(t))
		hash := m.spec.hash()
		check := rdbAt(t, b.addr)
		g := newFaultGoroutine(t)

		// cutUnlock takes the lock and cuts off its UnlockContext, then the
		// release posted behind it; it returns when they were cut.
		cutUnlock := func() time.Time {
			g.do(t, hangGuard, "Lock", m.Lock)
			armed := time.Now()
			cut.arm(t, hash)
			var err error
			g.do(t, hangGuard, "UnlockContext", func() {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				err = m.UnlockContext(ctx)
			})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("UnlockContext cut off: got %v, want DeadlineExceeded", err)
			}
			cut.unlockReturned()
			cut.awaitFailed(t)
			return armed
		}

		cutUnlock()
		waitFor(t, "the lock free after the posted release was sent again", func() bool {
			return check.Exists(context.Background(), hash).Val() == 0
		})

		// The next Lock first releases what the cut Unlock may have left (a
		// rollback of the same owner token): with the posted release sent
		// again, two releases reach Redis, both before its acquisition.
		armed := cutUnlock()
		g.do(t, hangGuard, "Lock after the cut Unlock", m.Lock)
		waitFor(t, "the posted release and the Lock's rollback sent", func() bool {
			return len(releasesOf(log.since(armed), hash)) >= 2
		})
		if fields := check.HLen(context.Background(), hash).Val(); fields != 1 {
			t.Errorf("fields of the hash after the next Lock: %d, want its hold's", fields)
		}
		acquired := false
		for _, cmd := range log.since(armed) {
			switch name, keys := scriptCallArgs(cmd.args); {
			case len(keys) == 0 || keys[0] != hash || cmd.err != nil:
			case name == "acquire":
				acquired = true
			case name == "release" && acquired:
				t.Errorf("a release of the lock sent after the next Lock's acquisition: %v", cmd.args)
			}
		}
		g.do(t, hangGuard, "Unlock", m.Unlock)
	})
}

// releasesOf returns the releases of hash among cmds that Redis answered.
func releasesOf(cmds []loggedCommand, hash string) []loggedCommand {
	var out []loggedCommand
	for _, cmd := range cmds {
		if name, keys := scriptCallArgs(cmd.args); name == "release" && len(keys) > 0 && keys[0] == hash && cmd.err == nil {
			out = append(out, cmd)
		}
	}
	return out
}

// releaseCuts is a go-redis hook that, once armed for a lock's hash, cuts
// the next two round trips with a release of it: the first is held until
// the test says its caller returned, then fails as a connection reset after
// sending would (Redis never got it here); the second fails at once. Later
// ones pass.
type releaseCuts struct {
	mu       sync.Mutex
	key      string
	seen     int
	returned chan struct{} // closed once the cut-off caller returned
	failed   chan struct{} // closed once the second round trip failed
	// unlockReturned closes returned: the test calls it once the cut-off
	// caller returned.
	unlockReturned func()
}

// arm cuts the next two round trips with a release of key. A test that
// ends before it called unlockReturned lets the held round trip go at its
// end, before its Client closes (which waits for it).
func (f *releaseCuts) arm(t *testing.T, key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.key, f.seen = key, 0
	returned := make(chan struct{})
	f.returned, f.failed = returned, make(chan struct{})
	f.unlockReturned = sync.OnceFunc(func() { close(returned) })
	t.Cleanup(f.unlockReturned)
}

func (f *releaseCuts) awaitFailed(t *testing.T) {
	t.Helper()
	select {
	case <-f.failed:
	case <-time.After(hangGuard):
		t.Fatal("the posted release was never sent")
	}
}

// cuts says which cut cmds get: 0 none, 1 or 2.
func (f *releaseCuts) cuts(cmds []redis.Cmder) (int, chan struct{}, chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, cmd := range cmds {
		if name, keys := scriptCall(cmd); f.key != "" && name == "release" && len(keys) > 0 && keys[0] == f.key {
			f.seen++
			if f.seen == 2 {
				f.key = ""
			}
			return f.seen, f.returned, f.failed
		}
	}
	return 0, nil, nil
}

func (f *releaseCuts) hook() redis.Hook {
	fail := func(cmds []redis.Cmder, next func() error) error {
		n, returned, failed := f.cuts(cmds)
		switch n {
		case 0:
			return next()
		case 1:
			<-returned
		case 2:
			defer close(failed)
		}
		err := transientErr()
		for _, cmd := range cmds {
			cmd.SetErr(err)
		}
		return err
	}
	return hookFuncs{
		process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			return fail([]redis.Cmder{cmd}, func() error { return next(ctx, cmd) })
		},
		pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			return fail(cmds, func() error { return next(ctx, cmds) })
		},
	}
}

// writerFunc is an io.Writer of a function.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestTryLockRefusedPromptly: against an address that refuses connections,
// TryLock and TryLockContext (without a deadline) answer within half a
// second (the bound is all slack: a refused dial is an answer), naming the
// refusal, whatever the go-redis options: go-redis's own dial retries take
// seconds.
func TestTryLockRefusedPromptly(t *testing.T) {
	eachRefusing(t, func(t *testing.T, rdb *redis.Client) {
		c, errs := clientWithErrors(t, rdb)
		m := c.NewMutex(lockName(t))
		for i := range 3 {
			within(t, fmt.Sprintf("TryLockContext #%d", i), 0, func() error {
				ok, err := m.TryLockContext(context.Background())
				if ok || !errors.Is(err, syscall.ECONNREFUSED) {
					return fmt.Errorf("got (%v, %v), want false and the refusal", ok, err)
				}
				return nil
			})
		}
		within(t, "TryLock", 0, func() error {
			if m.TryLock() {
				return errors.New("TryLock: got true")
			}
			return nil
		})
		errs.await(t, syscall.ECONNREFUSED, hangGuard, "TryLock to report the refusal")
	})
}

// TestLockContextNamesTheRefusal: a LockContext against an address that
// refuses connections, whose deadline ends while its call still waits for
// go-redis's dial retries, names the refusal as its last error.
func TestLockContextNamesTheRefusal(t *testing.T) {
	eachRefusing(t, func(t *testing.T, rdb *redis.Client) {
		m := clientOn(t, rdb).NewMutex(lockName(t))
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := m.LockContext(ctx); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("LockContext(100ms) against a refusing address: got %v, want the deadline and the refusal", err)
		}
	})
}

// eachRefusing runs f, in parallel, with a redis client of each option set
// on an address that refuses connections.
func eachRefusing(t *testing.T, f func(t *testing.T, rdb *redis.Client)) {
	for _, opts := range optionSets {
		t.Run(opts.name, func(t *testing.T) {
			t.Parallel()
			o := &redis.Options{Addr: stalls()["refusing"](t).addr}
			opts.set(o)
			f(t, newRDB(t, o))
		})
	}
}
