//go:build race

package transport

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestRoundContextOutlivesItsRound: when Close stops the drainer's calls,
// the context package hears of the stop through the round context's
// AfterFunc and reads that context from a goroutine of its own, which may
// run after the round ended; the drainer's next round must not overwrite
// what it reads. (It did: the round context was one field, reused round
// after round, and a CI run's race detector caught a Close that stopped a
// round against a Redis that refused connections, with a posted release
// queued behind it.)
//
// The interleaving is made, not waited for: the first round is held in a
// hook until the context package's goroutine has read the round context and
// stalls in the caller's context's Value; then the round ends and the
// posted call behind it gets its round. Only the race detector can tell
// (hence the build tag).
func TestRoundContextOutlivesItsRound(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	held, release := make(chan struct{}), make(chan struct{})
	var holding atomic.Bool
	holding.Store(true)
	rdb.AddHook(holdFirst{holding: &holding, held: held, release: release})
	l := quietListener{done: make(chan struct{})}
	n := newNode(Config{Log: slog.New(slog.DiscardHandler), Listener: l}, rdb, true)

	base, cancel := context.WithTimeout(context.Background(), time.Minute) // a deadline: the round's context is made WithDeadline
	defer cancel()
	caller := &stallingCtx{Context: base, proceed: make(chan struct{})}
	first := make(chan error, 1)
	go func() { first <- n.batch.do(caller, &call{args: []interface{}{"ping"}}) }()
	<-held
	if err := n.batch.do(PostCtx(context.Background(), time.Minute), &call{args: []interface{}{"ping"}}); !errors.Is(err, errPosted) {
		t.Fatalf("a posted call: got %v, want errPosted", err)
	}

	caller.armed.Store(true)
	closed := make(chan struct{})
	go func() { // stops the round at once (its deadline is now)
		defer close(closed)
		n.Close(time.Now())
		close(l.done)
	}()
	awaitStack(t, "stallingCtx).Value", true) // the context package's goroutine read the round's context
	close(release)
	if err := <-first; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("the first call: %v", err)
	}
	<-closed
	close(caller.proceed)
	awaitStack(t, "stallingCtx).Value", false)
}

// holdFirst is a hook that holds the first command (or pipeline) until
// release closes.
type holdFirst struct {
	holding *atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (holdFirst) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h holdFirst) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.hold()
		return next(ctx, cmd)
	}
}

func (h holdFirst) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.hold()
		return next(ctx, cmds)
	}
}

func (h holdFirst) hold() {
	if h.holding.CompareAndSwap(true, false) {
		close(h.held)
		<-h.release
	}
}

// stallingCtx is a caller's context whose Value, once armed, stalls for
// the context package's own key (an *int): the goroutine that propagates a
// stop asks for it right after reading the parent's fields.
type stallingCtx struct {
	context.Context
	armed   atomic.Bool
	proceed chan struct{}
}

func (c *stallingCtx) Value(key any) any {
	if _, ok := key.(*int); ok && c.armed.Load() {
		<-c.proceed
	}
	return c.Context.Value(key)
}

// awaitStack waits until some goroutine's stack has (or, without want, no
// longer has) frame in it. Reading the stacks orders nothing for the race
// detector.
func awaitStack(t *testing.T, frame string, want bool) {
	t.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.Stack(buf, true)
		if bytes.Contains(buf[:n], []byte(frame)) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s, a goroutine in %s: got %v, want %v", frame, !want, want)
		}
		time.Sleep(time.Millisecond)
	}
}
