package transport

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// An Unlock's call (UnlockCtx) is sent on its caller's goroutine, as a Lock's
// is, when the node's go-redis client follows contexts (ContextTimeoutEnabled,
// off by default): then every wait of the call (a pooled connection, a dial,
// a write, a read, a retry's backoff) ends with a context that ends after
// UnlockTimeout. Without it go-redis waits for a reply as long as its
// ReadTimeout (3s by default), and the call goes through the drainer (see
// batcher.wait), which answers its caller after UnlockTimeout whatever
// go-redis does, at the cost of a hand-over between goroutines each way.
// (A copy of the client made with ContextTimeoutEnabled would not do: the
// copy would not run the hooks the application added to its client.)

// boundedTarget returns rdb if a call on it ends with its context, else nil.
func boundedTarget(rdb redis.UniversalClient) target {
	switch c := rdb.(type) {
	case *redis.Client:
		if c.Options().ContextTimeoutEnabled {
			return c
		}
	case *redis.ClusterClient:
		if c.Options().ContextTimeoutEnabled {
			return c
		}
	}
	return nil
}

// unlockBound is the context of an Unlock's call on its caller's goroutine:
// it ends UnlockTimeout after it is taken. Pooled with its timer, so that an
// uncontended Unlock allocates nothing for it.
type unlockBound struct {
	deadline time.Time
	done     chan struct{}
	timer    *time.Timer
}

var boundPool = sync.Pool{New: func() any {
	b := &unlockBound{done: make(chan struct{})}
	b.timer = time.AfterFunc(time.Hour, func() { close(b.done) })
	b.timer.Stop()
	return b
}}

// takeBound returns a context that ends UnlockTimeout from now.
func takeBound() *unlockBound {
	b := boundPool.Get().(*unlockBound)
	b.deadline = time.Now().Add(UnlockTimeout)
	b.timer.Reset(UnlockTimeout)
	return b
}

// put gives b back, and reports whether it had ended: one that ended is not
// reused (its done is closed).
func (b *unlockBound) put() (ended bool) {
	if !b.timer.Stop() {
		return true
	}
	boundPool.Put(b)
	return false
}

func (b *unlockBound) Deadline() (time.Time, bool) { return b.deadline, true }
func (b *unlockBound) Done() <-chan struct{}       { return b.done }
func (b *unlockBound) Value(any) any               { return nil }

func (b *unlockBound) Err() error {
	select {
	case <-b.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// Compile-time check.
var _ context.Context = (*unlockBound)(nil)
