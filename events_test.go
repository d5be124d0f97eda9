package remutex

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// eventLog is a hook that records every Event and tells of each as it comes.
type eventLog struct {
	mu     sync.Mutex
	events []Event
	kicks  chan EventKind
}

func newEventLog() *eventLog { return &eventLog{kicks: make(chan EventKind, 100)} }

func (l *eventLog) hook(ev Event) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
	l.kicks <- ev.Kind
}

// await waits for an event of kind k.
func (l *eventLog) await(t testing.TB, k EventKind) {
	t.Helper()
	for {
		if await(t, l.kicks, "event "+k.String()) == k {
			return
		}
	}
}

// of returns the events of kind k, in the order they came.
func (l *eventLog) of(k EventKind) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var evs []Event
	for _, ev := range l.events {
		if ev.Kind == k {
			evs = append(evs, ev)
		}
	}
	return evs
}

type ctxKey struct{}

// TestEventFields: the fields a hook needs to follow a hold and relate it to
// its caller: the caller's context, one Hold number from acquisition to
// release or loss, why a wait ended, why a hold was lost.
func TestEventFields(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		log := newEventLog()
		c := b.client(t, WithHook(log.hook))
		name := lockName(t)
		m := c.NewMutex(name)
		ctx := context.WithValue(context.Background(), ctxKey{}, "caller")
		require.NoError(t, m.LockContext(ctx))

		// A second goroutine waits, and is cancelled.
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- m.LockContext(wctx) }()
		log.await(t, EventWaiting)
		cancel()
		require.ErrorIs(t, await(t, done, "the cancelled LockContext"), context.Canceled)
		log.await(t, EventWaited)
		require.NoError(t, m.UnlockContext(ctx))

		acq, rel := log.of(EventAcquired), log.of(EventReleased)
		require.Len(t, acq, 1)
		require.Len(t, rel, 1)
		assert.NotZero(t, acq[0].Hold)
		assert.Equal(t, acq[0].Hold, rel[0].Hold, "Hold of the release: got %d, want the acquisition's %d", rel[0].Hold, acq[0].Hold)
		assert.Equal(t, "caller", acq[0].Context.Value(ctxKey{}), "EventAcquired.Context: not the caller's")
		assert.False(t, acq[0].Granted, "an uncontended acquisition reported as granted")
		assert.NoError(t, rel[0].Err)
		for _, k := range []EventKind{EventWaiting, EventWaited} {
			evs := log.of(k)
			require.Len(t, evs, 1, "%v events", k)
			assert.Equal(t, "caller", evs[0].Context.Value(ctxKey{}), "%v.Context: not the caller's", k)
			assert.Zero(t, evs[0].Hold, "%v.Hold", k)
		}
		waited := log.of(EventWaited)[0]
		assert.ErrorIs(t, waited.Err, context.Canceled)
		assert.GreaterOrEqual(t, waited.Duration, log.of(EventWaiting)[0].Duration, "Waited.Duration counts from the Lock call, as Waiting's does")

		// Lost: a nested Lock finds the key gone (and takes the lock anew);
		// then Close ends a hold.
		require.NoError(t, m.LockContext(ctx))
		require.NoError(t, b.rdb(t).Del(ctx, keysOf(name).hash).Err())
		require.NoError(t, m.LockContext(ctx))
		require.NoError(t, m.UnlockContext(ctx))
		require.ErrorIs(t, m.UnlockContext(ctx), ErrLockLost)
		m2 := c.NewMutex(name + "-2")
		require.NoError(t, m2.LockContext(ctx))
		require.NoError(t, c.Close())

		acq, lost := log.of(EventAcquired), log.of(EventLost)
		require.Len(t, acq, 4)
		require.Len(t, lost, 2)
		assert.Len(t, log.of(EventReleased), 2, "released events: a lost hold ends with EventLost alone")
		for i, want := range []LossReason{LossGone, LossClosed} {
			assert.Equal(t, want, lost[i].Reason, "Reason of loss %d", i)
			assert.Equal(t, acq[2*i+1].Hold, lost[i].Hold, "Hold of loss %d", i)
			assert.True(t, errors.Is(lost[i].Err, ErrLockLost), "Err of loss %d: %v", i, lost[i].Err)
			assert.NotNil(t, lost[i].Context)
		}
		assert.NotEqual(t, acq[1].Hold, acq[2].Hold, "two holds, one Hold number")
	})
}

// TestEventsOfACutOffFirstCall: a LockContext whose context ends during its
// first call (which may have queued it) reports a wait that ended at once,
// so that a hook counts the timeout.
func TestEventsOfACutOffFirstCall(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		log := newEventLog()
		rdb := b.rdb(t)
		rdb.AddHook(hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if s, _ := scriptCall(cmd); s == "acquire" {
				<-ctx.Done() // the reply does not come in time
				return ctx.Err()
			}
			return next(ctx, cmd)
		}})
		m := clientOn(t, rdb, WithHook(log.hook)).NewMutex(lockName(t))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, m.LockContext(ctx), context.DeadlineExceeded)
		require.Len(t, log.of(EventWaiting), 1)
		waited := log.of(EventWaited)
		require.Len(t, waited, 1)
		assert.ErrorIs(t, waited[0].Err, context.DeadlineExceeded)
		assert.Empty(t, log.of(EventAcquired))
	})
}
