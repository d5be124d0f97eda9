package remutex

// A once's runner that dies or is paused past its lease: exactly one of its
// waiters takes over, never while the runner still holds, checked with a
// fenced register; the paused runner, resumed, finds its hold lost, its
// write refused, and records nothing.

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// onceRole runs Do of cfg.Name (WithFencing) with an f that begins a write
// of the register with its fence, emits "running <fence> <accepted>", waits
// for its context to end (the hold lost), and ends the write; then it emits
// "done <Do's error kind>".
func onceRole(cfg childConfig) int {
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	defer rdb.Close()
	c := NewClient(rdb, WithLogger(slog.New(slog.DiscardHandler)))
	defer c.Close()
	reg := redistest.OpenRegister(cfg.Register, cfg.RegisterKey)
	defer reg.Close()
	o := c.NewOnce(cfg.Name, WithLease(cfg.Lease), WithFencing())
	err := o.Do(context.Background(), func(ctx context.Context) error {
		fence := o.Fence()
		ok, err := reg.Begin(context.Background(), fence, "runner")
		redistest.Emit("running", fence, ok && err == nil)
		<-ctx.Done()
		_, _ = reg.End(context.Background(), fence, "runner")
		return context.Cause(ctx)
	})
	redistest.Emit("done", faultErrKind(err))
	return 0
}

func mustInt(t testing.TB, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

// TestOnceRunnerDies: a runner process is SIGKILLed, or SIGSTOPped past its
// lease, while callers of three Clients wait: exactly one of them runs f,
// after the runner was cut, with a higher fence; the others return nil
// with it. A paused runner, resumed, finds its hold lost: Do reports
// ErrLockLost, and its write is refused by the register.
func TestOnceRunnerDies(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
		t.Run(sig.String(), func(t *testing.T) {
			const lease, waiters = 1500 * time.Millisecond, 3 // the runner's renewals keep its hold on a busy machine
			srv := redistest.Shared(t)
			b := &testBackend{name: "redis-server", addr: srv.Addr(), srv: srv}
			reg := redistest.NewRegisterOn(t, srv)
			rdb := b.rdb(t)
			name := lockName(t)
			ctx := testCtx(t, 2*hangGuard)
			child := startChild(t, childConfig{Role: "once", Addr: b.addr, Name: name, Lease: lease,
				Register: reg.Addr(), RegisterKey: reg.Key(), ID: "runner"})
			ev := child.Expect(t, "running", hangGuard)
			require.Equal(t, "true", ev[1], "the runner's write accepted")

			var cut atomic.Bool
			var runs atomic.Int32
			res := make([]<-chan error, waiters)
			for i := range res {
				o := b.client(t).NewOnce(name, WithLease(lease), WithFencing())
				res[i] = doAsync(t, ctx, o, func(context.Context) error {
					if !cut.Load() {
						return errors.New("f ran while the runner held the once")
					}
					runs.Add(1)
					reg.Enter("waiter", o.Fence())()
					return nil
				})
			}
			onceWaiters(t, rdb, name, waiters)
			cut.Store(true)
			if sig == syscall.SIGKILL {
				child.Kill()
			} else {
				child.Signal(t, sig)
			}
			for i, r := range res {
				require.NoError(t, await(t, r, "a waiter's Do"), "waiter %d", i)
			}
			assert.Equal(t, int32(1), runs.Load(), "runs of f by the waiters")
			if sig == syscall.SIGSTOP {
				child.Signal(t, syscall.SIGCONT)
				assert.Equal(t, []string{"lost"}, child.Expect(t, "done", hangGuard), "the resumed runner's Do")
			}
			accepted, stale := reg.Check(t)
			require.Len(t, accepted, 1, "accepted writes: the waiter's")
			assert.Greater(t, accepted[0].Fence, mustInt(t, ev[0]), "the waiter's fence above the runner's")
			if sig == syscall.SIGSTOP {
				require.Len(t, stale, 1, "refused writes: the resumed runner's")
				assert.Less(t, stale[0].Fence, accepted[0].Fence, "the runner's fence below the waiter's")
			}
			done, err := b.client(t).NewOnce(name).Done(ctx)
			require.NoError(t, err)
			assert.True(t, done, "Done after the takeover")
		})
	}
}

// TestOnceRunnerCutOff: a runner whose connection goes dark (a proxy
// blackholes it) learns of its lost lease before the lock can expire on
// the server: f's context ends and f stops, and only then does one of the
// two waiters run f, with a higher fence. The register shows both runs'
// writes, one after the other; the cut runner's Do reports ErrLockLost and
// records nothing, and the waiter's run makes the once done.
func TestOnceRunnerCutOff(t *testing.T) {
	t.Parallel()
	// The register sees the runner's section end when its goroutine runs
	// after the hold's context ended: within the lease's drift margin
	// (lease/40 + 5ms), which a 3s lease makes 80ms on a busy machine.
	const lease = 3 * time.Second
	srv := redistest.Shared(t)
	reg := redistest.NewRegisterOn(t, srv)
	name := lockName(t)
	ctx := testCtx(t, 2*hangGuard)
	p := redistest.NewProxy(t, srv.Addr())
	cut := clientOn(t, rdbAt(t, p.Addr()))
	t.Cleanup(p.Heal) // before the Client closes: a blackholed call would hold Close up
	runnerOnce := cut.NewOnce(name, WithLease(lease), WithFencing())
	started := make(chan struct{})
	runner := doAsync(t, ctx, runnerOnce, func(ctx context.Context) error {
		fence := runnerOnce.Fence()
		exit := reg.Enter("runner", fence)
		close(started)
		<-ctx.Done()
		exit()
		return context.Cause(ctx)
	})
	<-started
	var runs atomic.Int32
	var res []<-chan error
	for range 2 {
		o := clientOn(t, rdbAt(t, srv.Addr())).NewOnce(name, WithLease(lease), WithFencing())
		res = append(res, doAsync(t, ctx, o, func(context.Context) error {
			runs.Add(1)
			reg.Enter("waiter", o.Fence())()
			return nil
		}))
	}
	onceWaiters(t, rdbAt(t, srv.Addr()), name, 2)
	p.SetBlackhole(true)
	assert.ErrorIs(t, await(t, runner, "the cut runner's Do"), ErrLockLost)
	for i, r := range res {
		require.NoError(t, await(t, r, "a waiter's Do"), "waiter %d", i)
	}
	assert.Equal(t, int32(1), runs.Load(), "runs of f by the waiters")
	reg.CheckSections(t, 2)
	done, err := clientOn(t, rdbAt(t, srv.Addr())).NewOnce(name).Done(ctx)
	require.NoError(t, err)
	assert.True(t, done, "Done after the waiter's run")
}
