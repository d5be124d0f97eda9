package remutexotel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/remutex/remutex"
	remutexotel "github.com/remutex/remutex/otel"
)

// TestLockNames: names are mapped, then capped; read holds say so.
func TestLockNames(t *testing.T) {
	r := newRig(t,
		remutexotel.WithLockNames(func(n string) string { kind, _, _ := strings.Cut(n, ":"); return kind }),
		remutexotel.WithMaxLockNames(2))
	for i, name := range []string{"order:1", "order:2", "user:9", "job:a", "job:b", "order:3"} {
		r.hook.Record(remutex.Event{Kind: remutex.EventAcquired, Lock: name, Owner: "c:1", Hold: uint64(i + 1), Read: i == 0})
	}
	got := map[string]int64{}
	ms := r.collect(t)
	for _, dp := range ms[remutexotel.MetricAcquisitions].Data.(metricdata.Sum[int64]).DataPoints {
		name, _ := dp.Attributes.Value("remutex.lock.name")
		mode, _ := dp.Attributes.Value("remutex.lock.mode")
		got[name.AsString()+"/"+mode.AsString()] += dp.Value
	}
	want := map[string]int64{"order/read": 1, "order/write": 2, "user/write": 1, remutexotel.OtherLockName + "/write": 2}
	assert.Equal(t, want, got, "acquisitions by name and mode")
	// Spans are not aggregated: they carry the name unmapped.
	var names []string
	for _, s := range r.spans.GetSpans() {
		for _, kv := range s.Attributes {
			if kv.Key == "remutex.lock.name" && s.Name == remutexotel.SpanWait {
				names = append(names, kv.Value.AsString())
			}
		}
	}
	assert.Equal(t, []string{"order:1", "order:2", "user:9", "job:a", "job:b", "order:3"}, names, "wait spans' names")
}

// TestEndBeforeAcquired: the watchdog's EventLost of a hold may reach the
// hook before its goroutine's EventAcquired. The hold span still ends, and
// the gauges come back to zero.
func TestEndBeforeAcquired(t *testing.T) {
	r := newRig(t)
	lost := remutex.Event{Kind: remutex.EventLost, Lock: "l", Owner: "c:1", Hold: 7, Reason: remutex.LossClosed,
		Err: errors.Join(remutex.ErrLockLost, remutex.ErrClosed), Duration: time.Millisecond}
	acquired := remutex.Event{Kind: remutex.EventAcquired, Lock: "l", Owner: "c:1", Hold: 7, Context: context.Background()}
	r.hook.Record(lost)
	r.hook.Record(acquired)
	ms := r.collect(t)
	assert.Equal(t, int64(0), sum(t, ms[remutexotel.MetricHeld]), "held")
	assert.Equal(t, int64(1), sum(t, ms[remutexotel.MetricLosses], attribute.String("remutex.lock.lost.reason", "closed")), "losses")
	holds := 0
	for _, s := range r.spans.GetSpans() {
		if s.Name == remutexotel.SpanHold {
			holds++
			assert.False(t, s.EndTime.IsZero(), "hold span ended")
			if assert.Len(t, s.Events, 1, "span events of the hold") {
				assert.Equal(t, remutexotel.EventLost, s.Events[0].Name)
			}
		}
	}
	assert.Equal(t, 1, holds, "hold spans exported (ended)")
	// A hold of another Client with the same number is another hold.
	r.hook.Record(remutex.Event{Kind: remutex.EventAcquired, Lock: "l", Owner: "d:1", Hold: 7})
	r.hook.Record(remutex.Event{Kind: remutex.EventReleased, Lock: "l", Owner: "d:1", Hold: 7})
	assert.Len(t, r.spans.GetSpans(), 2*2, "wait and hold spans of both holds")
}

// TestOutcomes: how a wait that gave up is classified, from its error.
func TestOutcomes(t *testing.T) {
	r := newRig(t, remutexotel.WithoutHoldSpans())
	for _, err := range []error{
		fmt.Errorf("remutex: lock %q: %w", "l", context.DeadlineExceeded),
		fmt.Errorf("remutex: lock %q: %w (last error: %w)", "l", context.DeadlineExceeded, io.EOF),
		fmt.Errorf("remutex: lock %q: %w", "l", context.Canceled),
		fmt.Errorf("remutex: lock %q: %w", "l", remutex.ErrClosed),
	} {
		r.hook.Record(remutex.Event{Kind: remutex.EventWaiting, Lock: "l", Owner: "c:1"})
		r.hook.Record(remutex.Event{Kind: remutex.EventWaited, Lock: "l", Owner: "c:1", Err: err})
	}
	r.hook.Record(remutex.Event{Kind: remutex.EventAcquired, Lock: "l", Owner: "c:1", Hold: 1})
	r.hook.Record(remutex.Event{Kind: remutex.EventReleased, Lock: "l", Owner: "c:1", Hold: 1, Err: io.EOF})
	ms := r.collect(t)
	wait := ms[remutexotel.MetricWaitDuration]
	for outcome, want := range map[string]uint64{"timeout": 2, "cancelled": 1, "error": 1, "acquired": 1} {
		got := histogram(t, wait, attribute.String("remutex.lock.outcome", outcome)).Count
		assert.Equal(t, want, got, "waits with outcome %s", outcome)
	}
	assert.Equal(t, uint64(1), histogram(t, ms[remutexotel.MetricHoldDuration], attribute.String("remutex.lock.end", "release_failed")).Count)
	assert.Equal(t, int64(0), sum(t, ms[remutexotel.MetricWaiting]), "waiting")
	for _, s := range r.spans.GetSpans() {
		assert.Equal(t, remutexotel.SpanWait, s.Name, "WithoutHoldSpans: only wait spans")
	}
	assert.Len(t, r.spans.GetSpans(), 5, "wait spans")
}
