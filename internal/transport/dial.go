package transport

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// dialWatch hears of the connections the redis client is refused (nothing
// listens at the address), as each dial fails: go-redis retries a refused
// dial several times, with pauses (DialerRetries), before the call that
// needed it fails, which takes seconds. A TryLock is answered at the first
// refusal instead (see batcher.wait): a refused connection is an answer,
// not silence.
type dialWatch struct {
	mu     sync.Mutex
	next   chan struct{} // closed at the next refusal, then replaced
	last   error
	closed atomic.Bool // the Client closed: the hook stays on the redis client, inert
}

// watchDials adds a hook to rdb that tells the returned dialWatch of every
// refused dial; it changes nothing else (commands pass it untouched).
func watchDials(rdb redis.UniversalClient) *dialWatch {
	w := &dialWatch{next: make(chan struct{})}
	rdb.AddHook(dialHook{w})
	return w
}

// refusal returns a channel that is closed when a dial is next refused.
func (w *dialWatch) Refusal() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next
}

// refused returns the error of the latest refusal.
func (w *dialWatch) Refused() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

func (w *dialWatch) saw(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = err
	close(w.next)
	w.next = make(chan struct{})
}

type dialHook struct{ w *dialWatch }

func (h dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil && !h.w.closed.Load() && errors.Is(err, syscall.ECONNREFUSED) {
			h.w.saw(err)
		}
		return conn, err
	}
}

func (dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
