package remutexotel

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/remutex/remutex"
)

// Span and span event names.
const (
	SpanWait          = "remutex.lock.wait"
	SpanHold          = "remutex.lock.hold"
	EventLost         = "remutex.lock.lost"
	EventRenewFailure = "remutex.lock.renewal.failed"
)

// spans makes the wait spans, and keeps the hold spans open from their
// acquisition to their release or loss.
type spans struct {
	tracer trace.Tracer
	hold   bool // make hold spans

	mu    sync.Mutex
	holds map[holdKey]trace.Span // open holds: their span, or nil
	// early are the ends of holds that came before their acquisition:
	// events of different goroutines may reach the hook out of order.
	early map[holdKey]remutex.Event
}

// holdKey names a hold: Event.Hold is unique within a Client, whose id
// starts the owner token.
type holdKey struct {
	owner string
	hold  uint64
}

func keyOf(ev remutex.Event) holdKey { return holdKey{ev.Owner, ev.Hold} }

func newSpans(t trace.Tracer, hold bool) *spans {
	return &spans{tracer: t, hold: hold, holds: map[holdKey]trace.Span{}, early: map[holdKey]remutex.Event{}}
}

// spanKind is the kind of every span: internal, as a lock is no request.
var spanKind = trace.WithSpanKind(trace.SpanKindInternal)

// start starts a span of ev at t, with ev's attributes if it records: the
// lock's own name (spans are not aggregated, so they carry it unmapped),
// the mode, the fence if any.
func (s *spans) start(ctx context.Context, name string, ev remutex.Event, t time.Time, opts ...trace.SpanStartOption) trace.Span {
	_, sp := s.tracer.Start(ctx, name, append(opts, trace.WithTimestamp(t), spanKind)...)
	if sp.IsRecording() {
		mode := modeWrite
		if ev.Read {
			mode = modeRead
		}
		sp.SetAttributes(attrName.String(ev.Lock), attrMode.String(mode))
		if ev.Fence != 0 {
			sp.SetAttributes(attrFence.Int64(ev.Fence))
		}
	}
	return sp
}

// acquired makes the wait span of an acquisition, and opens its hold span
// if the wait span records. Every hold gets an entry in holds, so that its
// end can tell an acquisition yet to come from one without a span.
func (s *spans) acquired(ctx context.Context, ev remutex.Event) {
	now := time.Now()
	w := s.start(ctx, SpanWait, ev, now.Add(-ev.Duration))
	var h trace.Span
	if w.IsRecording() {
		handoff := handoffFree
		if ev.Granted {
			handoff = handoffGrant
		}
		w.SetAttributes(attrOutcome.String(outcomeAcquired), attrHandoff.String(handoff))
		if s.hold {
			h = s.start(ctx, SpanHold, ev, now, trace.WithLinks(trace.Link{SpanContext: w.SpanContext()}))
		}
	}
	w.End(trace.WithTimestamp(now))
	if !s.hold {
		return
	}
	k := keyOf(ev)
	s.mu.Lock()
	end, ended := s.early[k]
	if ended {
		delete(s.early, k)
	} else {
		s.holds[k] = h
	}
	s.mu.Unlock()
	if ended && h != nil {
		finish(h, end)
	}
}

// gaveUp makes the wait span of a Lock that gave up.
func (s *spans) gaveUp(ctx context.Context, ev remutex.Event, outcome string) {
	now := time.Now()
	w := s.start(ctx, SpanWait, ev, now.Add(-ev.Duration))
	if w.IsRecording() {
		w.SetAttributes(attrOutcome.String(outcome))
		w.RecordError(ev.Err, trace.WithTimestamp(now))
		w.SetStatus(codes.Error, outcome)
	}
	w.End(trace.WithTimestamp(now))
}

// ended ends the hold span of ev, an EventReleased or EventLost.
func (s *spans) ended(ev remutex.Event) {
	if !s.hold {
		return
	}
	k := keyOf(ev)
	s.mu.Lock()
	h, ok := s.holds[k]
	if ok {
		delete(s.holds, k)
	} else {
		s.early[k] = ev // for acquired, which is yet to come
	}
	s.mu.Unlock()
	if h != nil {
		finish(h, ev)
	}
}

// finish ends hold span h as ev, an EventReleased or EventLost, says: a
// loss with a span event saying why.
func finish(h trace.Span, ev remutex.Event) {
	switch {
	case ev.Kind == remutex.EventLost:
		reason := reasonOf(ev.Reason)
		h.AddEvent(EventLost, trace.WithAttributes(attrReason.String(reason), attribute.String("exception.message", errText(ev.Err))))
		h.SetStatus(codes.Error, "lock lost: "+reason)
	case ev.Err != nil:
		h.RecordError(ev.Err)
		h.SetStatus(codes.Error, endReleaseFailed)
	}
	h.End()
}

// renewFailed adds a span event to the hold span of a failed renewal.
func (s *spans) renewFailed(ev remutex.Event) {
	if !s.hold {
		return
	}
	s.mu.Lock()
	h := s.holds[keyOf(ev)]
	s.mu.Unlock()
	if h != nil {
		h.AddEvent(EventRenewFailure)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
