package remutexotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/redistest"
	remutexotel "github.com/remutex/remutex/otel"
)

// The scripted workload of TestScriptedWorkload.
const (
	nFree       = 5                     // uncontended acquisitions
	nTimeouts   = 3                     // waits that time out
	waitTimeout = 20 * time.Millisecond // their timeout
)

// workload is what TestScriptedWorkload did, as the test measured it.
type workload struct {
	acquired, timeouts []bounded // waits, by outcome
	handoffs           int       // rounds of a holder releasing to a waiter
}

// maxHandoffs bounds the rounds of runWorkload's hand-off: a waiter whose
// subscription is not yet confirmed when the release comes takes the lock
// with its own next call (Event.Granted false, as it should be), so the
// round is run again until a grant was heard.
const maxHandoffs = 5

// TestScriptedWorkload runs a known workload under a caller's span and
// checks every metric against it, exactly, and the histogram of waits
// against the waits the test measured around its calls: nFree uncontended
// acquisitions, nTimeouts waits that time out, one cancelled, one that gets
// the lock handed over, one lease lost by FLUSHALL.
func TestScriptedWorkload(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		r := newRig(t)
		ctx, caller := r.tp.Tracer("test").Start(context.Background(), "caller")
		w := runWorkload(t, ctx, r, b)
		caller.End()

		ms := r.collect(t)
		l := func(name string) attribute.KeyValue { return attribute.String("remutex.lock.name", name) }
		outcome := func(o string) attribute.KeyValue { return attribute.String("remutex.lock.outcome", o) }
		end := func(e string) attribute.KeyValue { return attribute.String("remutex.lock.end", e) }
		acquisitions := nFree + 2*w.handoffs + 1 // + holders and waiters, the lost lease
		counts := []struct {
			metric string
			attrs  []attribute.KeyValue
			want   int
		}{
			{remutexotel.MetricAcquisitions, nil, acquisitions},
			{remutexotel.MetricAcquisitions, []attribute.KeyValue{l("free")}, nFree},
			{remutexotel.MetricAcquisitions, []attribute.KeyValue{attribute.String("remutex.lock.mode", "write")}, acquisitions},
			{remutexotel.MetricAcquisitions, []attribute.KeyValue{attribute.String("remutex.lock.handoff", "grant")}, r.grants},
			{remutexotel.MetricLosses, nil, 1},
			{remutexotel.MetricLosses, []attribute.KeyValue{l("lease"), attribute.String("remutex.lock.lost.reason", "denied")}, 1},
			{remutexotel.MetricRenewals, nil, r.count(remutex.EventRenewed)},
			{remutexotel.MetricRenewFailures, nil, r.count(remutex.EventRenewFailed)},
			{remutexotel.MetricHeld, nil, 0},
			{remutexotel.MetricWaiting, nil, 0},
		}
		for _, c := range counts {
			if got := sum(t, ms[c.metric], c.attrs...); got != int64(c.want) {
				t.Errorf("%s %v: got %d, want %d", c.metric, c.attrs, got, c.want)
			}
		}
		assert.Equal(t, 1, r.grants, "acquisitions by grant in %d rounds: the release hands the lock to the waiter", w.handoffs)
		wait := ms[remutexotel.MetricWaitDuration]
		checkBuckets(t, "waits acquired", histogram(t, wait, outcome("acquired")), w.acquired)
		checkBuckets(t, "waits timed out", histogram(t, wait, outcome("timeout")), w.timeouts)
		assert.Equal(t, uint64(1), histogram(t, wait, outcome("cancelled")).Count, "waits cancelled")
		hold := ms[remutexotel.MetricHoldDuration]
		assert.Equal(t, uint64(nFree+2*w.handoffs), histogram(t, hold, end("released")).Count, "holds released")
		assert.Equal(t, uint64(1), histogram(t, hold, end("lost")).Count, "holds lost")
		for _, m := range []string{remutexotel.MetricWaitDuration, remutexotel.MetricHoldDuration} {
			assert.Equal(t, "s", ms[m].Unit, "unit of %s", m)
		}
		checkSpans(t, r.spans.GetSpans(), caller.SpanContext(), acquisitions)
	})
}

// runWorkload runs the workload of TestScriptedWorkload under ctx.
func runWorkload(t *testing.T, ctx context.Context, r *rig, b *backend) workload {
	var w workload
	c, other := r.client(t, b.rdb(t)), r.client(t, b.rdb(t))
	timed := func(lo time.Duration, f func() error) bounded {
		t.Helper()
		start := time.Now()
		require.NoError(t, f())
		return bounded{lo, time.Since(start)}
	}

	m := c.NewMutex("free")
	for range nFree {
		w.acquired = append(w.acquired, timed(0, func() error { return m.LockContext(ctx) }))
		require.NoError(t, m.UnlockContext(ctx))
	}

	holder := other.NewMutex("busy")
	w.acquired = append(w.acquired, timed(0, func() error { return holder.LockContext(ctx) }))
	busy := c.NewMutex("busy")
	for i := range nTimeouts {
		tctx, cancel := context.WithTimeout(ctx, waitTimeout)
		start := time.Now()
		err := busy.LockContext(tctx)
		hi := time.Since(start)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		r.await(t, remutex.EventWaiting, i+1)
		deadline, _ := tctx.Deadline()
		// The wait began before its EventWaiting and ended after the deadline.
		w.timeouts = append(w.timeouts, bounded{deadline.Sub(r.lastWaiting()), hi})
	}

	cctx, cancel := context.WithCancel(ctx)
	cancelled := goLock(ctx, busy, cctx)
	r.await(t, remutex.EventWaiting, nTimeouts+1)
	cancel()
	require.ErrorIs(t, <-cancelled.locked, context.Canceled)

	for w.handoffs < maxHandoffs && r.grantCount() == 0 {
		if w.handoffs > 0 {
			w.acquired = append(w.acquired, timed(0, func() error { return holder.LockContext(ctx) }))
		}
		w.handoffs++
		waiter := goLock(ctx, busy, ctx)
		r.await(t, remutex.EventWaiting, nTimeouts+1+w.handoffs)
		unlocked := time.Now()
		require.NoError(t, holder.UnlockContext(ctx))
		require.NoError(t, <-waiter.locked)
		w.acquired = append(w.acquired, bounded{unlocked.Sub(r.lastWaiting()), waiter.took})
		require.NoError(t, waiter.unlock())
	}

	lease := c.NewMutex("lease", remutex.WithLease(300*time.Millisecond))
	w.acquired = append(w.acquired, timed(0, func() error { return lease.LockContext(ctx) }))
	require.NoError(t, b.rdb(t).FlushAll(ctx).Err())
	r.await(t, remutex.EventLost, 1)
	require.ErrorIs(t, lease.UnlockContext(ctx), remutex.ErrLockLost)
	return w
}

// locker is a LockContext on a goroutine of its own, which unlocks when
// told.
type locker struct {
	locked   chan error
	took     time.Duration // the LockContext call, measured around it; read after locked
	release  chan struct{}
	unlocked chan error
}

func goLock(ctx context.Context, m *remutex.DistMutex, lctx context.Context) *locker {
	l := &locker{locked: make(chan error, 1), release: make(chan struct{}), unlocked: make(chan error, 1)}
	start := time.Now()
	go func() {
		err := m.LockContext(lctx)
		l.took = time.Since(start)
		l.locked <- err
		if err != nil {
			return
		}
		<-l.release
		l.unlocked <- m.UnlockContext(ctx)
	}()
	return l
}

func (l *locker) unlock() error {
	close(l.release)
	return <-l.unlocked
}

// checkSpans checks the spans of the workload: a wait span per Lock call and
// a hold span per acquisition, all children of the caller's span, the lost
// lease's hold span with its span event.
func checkSpans(t *testing.T, spans tracetest.SpanStubs, caller trace.SpanContext, acquisitions int) {
	t.Helper()
	byName := map[string][]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
	}
	assert.Len(t, byName["caller"], 1)
	waits, holds := byName[remutexotel.SpanWait], byName[remutexotel.SpanHold]
	assert.Len(t, waits, acquisitions+nTimeouts+1, "wait spans: one per Lock call")
	assert.Len(t, holds, acquisitions, "hold spans: one per acquisition")
	assert.Len(t, byName, 3, "span names: caller, wait, hold (none per renewal)")
	outcomes := map[string]int{}
	lost := 0
	for _, s := range append(waits, holds...) {
		if s.Parent.SpanID() != caller.SpanID() || s.SpanContext.TraceID() != caller.TraceID() {
			t.Errorf("span %s %v: parent %v, want the caller's %v", s.Name, s.Attributes, s.Parent.SpanID(), caller.SpanID())
		}
		for _, kv := range s.Attributes {
			if kv.Key == "remutex.lock.outcome" {
				outcomes[kv.Value.AsString()]++
			}
		}
		if s.Name == remutexotel.SpanHold && s.Status.Code == codes.Error {
			lost++
			require.Len(t, s.Events, 1, "events of the lost hold's span")
			assert.Equal(t, remutexotel.EventLost, s.Events[0].Name)
			assert.Contains(t, s.Events[0].Attributes, attribute.String("remutex.lock.lost.reason", "denied"))
		}
		if s.Name == remutexotel.SpanHold {
			assert.Len(t, s.Links, 1, "hold span linked to its wait span")
		}
	}
	assert.Equal(t, 1, lost, "hold spans with an error status")
	assert.Equal(t, map[string]int{"acquired": acquisitions, "timeout": nTimeouts, "cancelled": 1}, outcomes, "wait spans by outcome")
}

// TestRenewalFailures stops the server under a hold: the watchdog's
// renewals fail until the lease's validity ends, and the hold is lost.
func TestRenewalFailures(t *testing.T) {
	srv := redistest.Start(t)
	r := newRig(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	c := r.client(t, rdb)
	ctx := context.Background()
	m := c.NewMutex("renew", remutex.WithLease(600*time.Millisecond))
	require.NoError(t, m.LockContext(ctx))
	srv.Stop()
	r.await(t, remutex.EventLost, 1)
	require.ErrorIs(t, m.UnlockContext(ctx), remutex.ErrLockLost)

	ms := r.collect(t)
	failed := r.count(remutex.EventRenewFailed)
	assert.GreaterOrEqual(t, failed, 1, "renewals failed")
	assert.Equal(t, int64(failed), sum(t, ms[remutexotel.MetricRenewFailures]), "renewal failures recorded")
	assert.Equal(t, int64(1), sum(t, ms[remutexotel.MetricLosses], attribute.String("remutex.lock.lost.reason", "expired")))
	holds := 0
	for _, s := range r.spans.GetSpans() {
		if s.Name != remutexotel.SpanHold {
			continue
		}
		holds++
		var names []string
		for _, e := range s.Events {
			names = append(names, e.Name)
		}
		require.Len(t, names, failed+1, "span events of the hold")
		assert.Equal(t, remutexotel.EventLost, names[failed], "last span event")
		assert.Equal(t, remutexotel.EventRenewFailure, names[0], "first span event")
	}
	assert.Equal(t, 1, holds, "hold spans")
}

// TestReadHolds: the holds of a DistRWMutex are recorded by mode, and a
// reader waiting behind a writer is counted as waiting in read mode.
func TestReadHolds(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		r := newRig(t)
		ctx := context.Background()
		writer := r.client(t, b.rdb(t)).NewRWMutex("config")
		reader := r.client(t, b.rdb(t)).NewRWMutex("config")
		require.NoError(t, writer.LockContext(ctx))
		done := make(chan error, 1)
		go func() {
			err := reader.RLockContext(ctx)
			if err == nil {
				err = reader.RUnlockContext(ctx)
			}
			done <- err
		}()
		r.await(t, remutex.EventWaiting, 1)
		ms := r.collect(t)
		read := attribute.String("remutex.lock.mode", "read")
		write := attribute.String("remutex.lock.mode", "write")
		assert.Equal(t, int64(1), sum(t, ms[remutexotel.MetricWaiting], read), "readers waiting")
		assert.Equal(t, int64(1), sum(t, ms[remutexotel.MetricHeld], write), "write holds")
		require.NoError(t, writer.UnlockContext(ctx))
		require.NoError(t, <-done)

		ms = r.collect(t)
		for _, c := range []struct {
			metric string
			mode   attribute.KeyValue
			want   int64
		}{
			{remutexotel.MetricAcquisitions, read, 1},
			{remutexotel.MetricAcquisitions, write, 1},
			{remutexotel.MetricHeld, read, 0},
			{remutexotel.MetricWaiting, read, 0},
		} {
			assert.Equal(t, c.want, sum(t, ms[c.metric], c.mode), "%s %v", c.metric, c.mode)
		}
	})
}
