package remutex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// Tests of the contract with the caller at the edges a service meets:
// shutdown while goroutines wait or hold, holds that end by a loss, the
// hold's context, and what errors and panics say.

// goHolder is a goroutine that holds a lock until told, then unlocks it with
// UnlockContext, and can be asked to run things on its goroutine meanwhile.
type goHolder struct {
	do       chan func()
	unlocked chan error
	once     sync.Once
}

// holdIn takes m (Lock) on a goroutine of its own and keeps it until
// release; it returns once m is held.
func holdIn(t *testing.T, m *DistMutex) *goHolder {
	t.Helper()
	h := &goHolder{do: make(chan func()), unlocked: make(chan error, 1)}
	locked := make(chan struct{})
	go func() {
		m.Lock()
		close(locked)
		for f := range h.do {
			f()
		}
		h.unlocked <- m.UnlockContext(context.Background())
	}()
	await(t, locked, "the holder to lock")
	t.Cleanup(h.release)
	return h
}

// run runs f on the holder's goroutine and waits for it.
func (h *goHolder) run(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	h.do <- func() { f(); close(done) }
	await(t, done, "a call on the holder's goroutine")
}

func (h *goHolder) release() { h.once.Do(func() { close(h.do) }) }

// waitersOf returns how many goroutines of c wait for m.
func waitersOf(c *Client, m *DistMutex) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.locks[m.spec.hash()]; st != nil {
		return len(st.waiters)
	}
	return 0
}

// TestFixedLeaseHoldEnds is the "hold for a fixed time" pattern: TryLock
// at each tick, never Unlock. When the fixed lease runs out the hold ends
// for the goroutine (HoldCount 0), the next TryLock takes the lock anew
// (with a new fencing token), and the ended hold's Unlock reports
// ErrLockLost after the new hold's, without blocking it.
func TestFixedLeaseHoldEnds(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		c, errs := clientWithErrors(t, b.rdb(t))
		m := c.NewMutex(lockName(t), WithLease(100*time.Millisecond), WithoutRenewal(), WithFencing())
		var fences []int64
		for tick := range 3 {
			if !m.TryLock() {
				t.Fatalf("tick %d: TryLock: got false, want true (the goroutine's own hold ended)", tick)
			}
			if got := m.HoldCount(); got != 1 {
				t.Errorf("tick %d: HoldCount after TryLock: got %d, want 1", tick, got)
			}
			fences = append(fences, m.Fence())
			await(t, m.Lost(), "the fixed lease to run out")
			b.fastForward(100 * time.Millisecond)
			if got := m.HoldCount(); got != 0 {
				t.Errorf("tick %d: HoldCount after the lease ran out: got %d, want 0", tick, got)
			}
		}
		if fences[0] >= fences[1] || fences[1] >= fences[2] {
			t.Errorf("fencing tokens of the ticks: %v, want strictly increasing", fences)
		}
		waitFor(t, "three losses reported (one per tick)", func() bool { return errs.count(ErrLockLost) == 3 })
		if !m.TryLock() {
			t.Fatalf("TryLock after three ended holds: got false, want true")
		}
		if err := m.UnlockContext(context.Background()); err != nil {
			t.Errorf("UnlockContext of the live hold: got %v, want nil (it comes first)", err)
		}
		for i := range 3 {
			if err := m.UnlockContext(context.Background()); !errors.Is(err, ErrLockLost) {
				t.Errorf("UnlockContext %d of an ended hold: got %v, want ErrLockLost", i, err)
			}
		}
		if err := m.UnlockContext(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("UnlockContext with every Unlock paid: got %v, want ErrNotHeld", err)
		}
	})
}

// TestNestedLockAfterLoss: a nested Lock that finds its hold gone (the key
// was deleted) takes the lock anew instead of reporting a hold Redis does
// not have; the Unlocks pair with the Locks last-in first-out.
func TestNestedLockAfterLoss(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		c, errs := clientWithErrors(t, b.rdb(t))
		m := c.NewMutex(lockName(t))
		check := b.rdb(t)
		ctx := context.Background()
		m.Lock()
		m.Lock()
		if err := check.Del(ctx, m.spec.hash()).Err(); err != nil {
			t.Fatal(err)
		}
		m.Lock() // finds the hold gone: takes the lock anew
		if got := m.HoldCount(); got != 1 {
			t.Errorf("HoldCount after a nested Lock found the hold gone: got %d, want 1 (a new hold)", got)
		}
		if got := check.HGet(ctx, m.spec.hash(), ownerString(m.current().owner)).Val(); got != "1" {
			t.Errorf("the new hold in Redis: count %q, want \"1\"", got)
		}
		errs.await(t, ErrLockLost, hangGuard, "the loss to be reported")
		if err := m.UnlockContext(ctx); err != nil {
			t.Errorf("UnlockContext of the new hold: got %v, want nil", err)
		}
		if n := check.Exists(ctx, m.spec.hash()).Val(); n != 0 {
			t.Errorf("the new hold's key after its Unlock: EXISTS got %d, want 0", n)
		}
		for i := range 2 {
			if err := m.UnlockContext(ctx); !errors.Is(err, ErrLockLost) {
				t.Errorf("UnlockContext %d of the lost hold: got %v, want ErrLockLost", i, err)
			}
		}
		if v := faultPanic(m.Unlock); v == nil {
			t.Errorf("Unlock with every Unlock paid: no panic, want unlock of unlocked mutex")
		}
	})
}

// TestExpiredReadHoldNoUpgrade: a goroutine whose read hold expired holds
// nothing: its write Lock takes the lock (no ErrUpgrade), and its RUnlock
// reports the loss.
func TestExpiredReadHoldNoUpgrade(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		c := b.client(t)
		rw := c.NewRWMutex(lockName(t), WithLease(100*time.Millisecond), WithoutRenewal())
		rw.RLock()
		await(t, rw.Lost(), "the read hold's fixed lease to run out")
		b.fastForward(100 * time.Millisecond)
		if !rw.TryLock() {
			t.Fatalf("write TryLock after the read hold ended: got false, want true")
		}
		rw.Unlock()
		if err := rw.RUnlockContext(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("RUnlockContext of the ended read hold: got %v, want ErrLockLost", err)
		}
	})
}

// TestHoldContext: the hold's context ends when the hold is lost (cause
// ErrLockLost) or released (ErrReleased), is done at once without a hold
// (ErrNotHeld), and works from any goroutine.
func TestHoldContext(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		c := b.client(t)
		m := c.NewMutex(lockName(t), WithLease(150*time.Millisecond))
		ctx := m.HoldContext(context.Background())
		if !errors.Is(context.Cause(ctx), ErrNotHeld) {
			t.Errorf("HoldContext without a hold: cause %v, want ErrNotHeld", context.Cause(ctx))
		}

		m.Lock()
		ctx = m.HoldContext(context.Background())
		seen := make(chan error, 1)
		go func() { <-ctx.Done(); seen <- context.Cause(ctx) }() // another goroutine
		if err := b.rdb(t).Del(context.Background(), m.spec.hash()).Err(); err != nil {
			t.Fatal(err)
		}
		var le *LockError
		if err := await(t, seen, "the hold's context to end at the loss"); !errors.Is(err, ErrLockLost) || !errors.As(err, &le) || le.Lock != m.Name() {
			t.Errorf("cause of a lost hold's context: got %v, want a *LockError of %q matching ErrLockLost", err, m.Name())
		}
		_ = m.UnlockContext(context.Background())

		m.Lock()
		ctx = m.HoldContext(context.Background())
		m.Unlock()
		if !errors.Is(context.Cause(ctx), ErrReleased) {
			t.Errorf("cause of a released hold's context: got %v, want ErrReleased", context.Cause(ctx))
		}
	})
}

// TestDo: Do runs f under the lock with the hold's context and unlocks
// after; a loss while f runs ends f's context and is reported.
func TestDo(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		c := b.client(t)
		m := c.NewMutex(lockName(t), WithLease(150*time.Millisecond))
		ctx := testCtx(t, hangGuard)
		want := errors.New("f's error")
		err := m.Do(ctx, func(ctx context.Context) error {
			if m.HoldCount() != 1 {
				t.Errorf("HoldCount in Do's f: got %d, want 1", m.HoldCount())
			}
			return want
		})
		if !errors.Is(err, want) || m.HoldCount() != 0 {
			t.Errorf("Do: got %v (HoldCount %d after), want f's error and the lock released", err, m.HoldCount())
		}
		err = m.Do(ctx, func(hctx context.Context) error {
			if err := b.rdb(t).Del(ctx, m.spec.hash()).Err(); err != nil {
				return err
			}
			<-hctx.Done()
			return context.Cause(hctx)
		})
		if !errors.Is(err, ErrLockLost) {
			t.Errorf("Do with the hold lost in f: got %v, want ErrLockLost", err)
		}
	})
}

// TestUnlockFromOtherGoroutineMessage: the panic of an Unlock by a
// goroutine that holds nothing says so, names the lock, and points at
// NonReentrant.
func TestUnlockFromOtherGoroutineMessage(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		m := b.client(t).NewMutex(lockName(t))
		m.Lock()
		defer m.Unlock()
		v := make(chan interface{}, 1)
		go func() { v <- faultPanic(m.Unlock) }()
		msg := fmt.Sprint(await(t, v, "Unlock from another goroutine"))
		for _, want := range []string{"remutex: unlock of unlocked mutex", fmt.Sprintf("%q", m.Name()), "this goroutine holds nothing", "another goroutine of this Client holds it", "NonReentrant"} {
			if !strings.Contains(msg, want) {
				t.Errorf("panic of Unlock from another goroutine: %q, want it to contain %q", msg, want)
			}
		}
	})
}

// TestErrorHandlerGetsLockError: what the error handler hears names the
// lock and the operation.
func TestErrorHandlerGetsLockError(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		c, errs := clientWithErrors(t, b.rdb(t))
		m := c.NewMutex(lockName(t), WithLease(100*time.Millisecond), WithoutRenewal())
		m.Lock()
		errs.await(t, ErrLockLost, hangGuard, "the fixed lease to run out")
		var le *LockError
		if err := errs.matching(ErrLockLost)[0]; !errors.As(err, &le) || le.Lock != m.Name() || le.Op != "hold" {
			t.Errorf("error handler: got %#v, want a *LockError of lock %q, op \"hold\"", err, m.Name())
		}
		_ = m.UnlockContext(context.Background())
	})
}

// TestRetryWarningsRateLimited: a Lock that retries against an address
// where nothing listens logs one line for its retries, not one per retry;
// the error handler hears each.
func TestRetryWarningsRateLimited(t *testing.T) {
	t.Parallel()
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	var buf lockedBuffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	rdb := newRDB(t, &redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
	c, errs := clientWithErrors(t, rdb, WithLogger(logger))
	m := c.NewMutex(lockName(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.LockContext(ctx) }()
	waitFor(t, "five retried errors", func() bool { return errs.len() >= 5 })
	cancel()
	await(t, done, "LockContext")
	if n := strings.Count(buf.String(), "retrying after transient error"); n != 1 {
		t.Errorf("log lines for %d retried errors: got %d, want 1:\n%s", errs.len(), n, buf.String())
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestForeignHashWithoutExpiry: a hash under the lock's name with no TTL
// (nothing remutex writes) is reported at once as held by its owner with no
// expiry, not as a deadline that passed; Lock panics with it.
func TestForeignHashWithoutExpiry(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		m := b.client(t).NewMutex(lockName(t))
		if err := b.rdb(t).HSet(context.Background(), m.spec.hash(), "some owner", "1").Err(); err != nil {
			t.Fatal(err)
		}
		ctx := testCtx(t, hangGuard)
		err := m.LockContext(ctx)
		var ne *NoExpiryError
		if !errors.As(err, &ne) || ne.Key != m.spec.hash() || ne.Owner != "some owner" || ctx.Err() != nil {
			t.Errorf("LockContext of a hash without expiry: got %v, want at once a *NoExpiryError of %q held by %q", err, m.spec.hash(), "some owner")
		}
		if v := faultPanic(m.Lock); !errors.As(asError(v), &ne) {
			t.Errorf("Lock of a hash without expiry: panic %v, want a *NoExpiryError", v)
		}
	})
}

func asError(v interface{}) error {
	err, _ := v.(error)
	return err
}
