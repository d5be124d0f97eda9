package remutex

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestCutOffCallKeepsItsArguments cuts an acquisition off while its call is
// in flight, then runs acquisitions of another Client meanwhile. Calls and
// their command's arguments are pooled (evalPooled, quickRelease); one cut off
// must not go back to the pool while the drainer may still send it, or
// another acquisition would write its own arguments into it. The call held
// in flight must go out as it was built: on its own lock's key.
func TestCutOffCallKeepsItsArguments(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		rdb := b.rdb(t)
		m := clientOn(t, rdb).NewMutex(name)
		held, open, sent := make(chan struct{}, 1), make(chan struct{}), make(chan []interface{}, 1)
		var first atomic.Bool
		rdb.AddHook(hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if _, keys := scriptCall(cmd); len(keys) > 0 && keys[0] == m.spec.hash() && first.CompareAndSwap(false, true) {
				held <- struct{}{}
				<-open
				sent <- slices.Clone(cmd.Args())
			}
			return next(ctx, cmd)
		}})

		ctx, cancel := context.WithCancel(testCtx(t, hangGuard))
		res := make(chan error, 1)
		go func() { res <- m.LockContext(ctx) }()
		await(t, held, "the acquisition's call to be held in flight")
		cancel()
		if err := await(t, res, "the cut-off LockContext"); !errors.Is(err, context.Canceled) {
			t.Fatalf("LockContext cut off in flight: got %v, want context.Canceled", err)
		}

		churnPool(t, b, name)
		close(open)
		args := await(t, sent, "the held call to go out")
		if _, keys := scriptCallArgs(args); len(keys) == 0 || keys[0] != m.spec.hash() {
			t.Fatalf("the call cut off went out as %v, want a call on %s", args, m.spec.hash())
		}
	})
}

// TestCutOffReleaseKeepsItsArguments is the same for the final release of a
// lock seen contended (a hand-off's): HDEL and wake.lua in one pipeline,
// whose calls are pooled as an acquisition's is.
func TestCutOffReleaseKeepsItsArguments(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		rdb := b.rdb(t)
		m := clientOn(t, rdb).NewMutex(name)
		m.Lock()
		held, open, sent := make(chan struct{}, 1), make(chan struct{}), make(chan [][]interface{}, 1)
		var first atomic.Bool
		rdb.AddHook(hookFuncs{pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			for _, cmd := range cmds {
				if s, keys := scriptCall(cmd); s == "wake" && keys[0] == m.spec.hash() && first.CompareAndSwap(false, true) {
					held <- struct{}{}
					<-open
					var args [][]interface{}
					for _, c := range cmds {
						args = append(args, slices.Clone(c.Args()))
					}
					sent <- args
				}
			}
			return next(ctx, cmds)
		}})

		ctx, cancel := context.WithCancel(testCtx(t, hangGuard))
		defer cancel()
		stop, cut := make(chan struct{}), make(chan struct{})
		go func() { // cuts the release off once it is held in flight
			defer close(cut)
			select {
			case <-held:
				cancel()
			case <-stop:
			}
		}()
		m.spec.Quick.Contended() // HDEL and wake.lua, not the uncontended HDEL and EXISTS
		err := m.UnlockContext(ctx)
		close(stop)
		<-cut
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("UnlockContext cut off in flight: got %v, want context.Canceled", err)
		}

		churnPool(t, b, name)
		close(open)
		cmds := await(t, sent, "the held release to go out")
		var names []string
		for _, args := range cmds {
			if s, keys := scriptCallArgs(args); s != "" && len(keys) > 0 && keys[0] == m.spec.hash() {
				names = append(names, s)
			}
		}
		if !slices.Equal(names, []string{"release", "wake"}) {
			t.Fatalf("the release cut off went out as %v, want HDEL and wake.lua on %s", cmds, m.spec.hash())
		}
	})
}

// churnPool runs acquisitions on every P of another Client while a call is
// held in flight: each takes a pooled call, and would take the held one had
// it gone back.
func churnPool(t *testing.T, b *testBackend, name string) {
	t.Helper()
	other := clientOn(t, b.rdb(t)).NewMutex(name + ".other")
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 32 {
				other.Lock()
				other.Unlock()
			}
		}()
	}
	wg.Wait()
}
