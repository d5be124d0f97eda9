package remutexotel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/remutex/remutex"
)

// ScopeName is the instrumentation scope of the meter and tracer.
const ScopeName = "github.com/remutex/remutex/otel"

// DefaultMaxLockNames is how many distinct lock names a Hook records by
// default before it records the others as OtherLockName.
const DefaultMaxLockNames = 100

// OtherLockName is the remutex.lock.name of the locks past the limit of
// WithMaxLockNames.
const OtherLockName = "_other"

// Hook records the Events of remutex Clients as OpenTelemetry metrics and
// spans. Create it with New and pass Option() (or Record, from a hook of
// your own) to remutex.NewClient; one Hook may serve several Clients. It is
// safe for concurrent use.
type Hook struct {
	inst  instruments
	spans *spans
	names *names
}

type config struct {
	mp       metric.MeterProvider
	tp       trace.TracerProvider
	mapName  func(string) string
	maxNames int
	noHold   bool
}

// Option configures a Hook.
type Option func(*config)

// WithMeterProvider sets where the metrics go. Default: the global
// MeterProvider (otel.GetMeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithTracerProvider sets where the spans go. Default: the global
// TracerProvider (otel.GetTracerProvider), which makes no spans until one is
// set.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithLockNames maps a lock's name to the value of the remutex.lock.name
// attribute, for locks whose names are unbounded: e.g. "order:1234" to
// "order". It is called for every event, so it must be quick; it may
// return one value for many names. Default: the name itself.
func WithLockNames(f func(name string) string) Option {
	return func(c *config) { c.mapName = f }
}

// WithMaxLockNames caps the distinct remutex.lock.name values (after
// WithLockNames) at n: the first n seen are recorded as they are, later
// ones as OtherLockName. Default DefaultMaxLockNames (100); n < 1 panics in
// New.
func WithMaxLockNames(n int) Option {
	return func(c *config) { c.maxNames = n }
}

// WithoutHoldSpans leaves out the remutex.lock.hold spans (one per hold,
// from acquisition to release or loss), keeping the wait spans. Default:
// both.
func WithoutHoldSpans() Option {
	return func(c *config) { c.noHold = true }
}

// New returns a Hook whose instruments are created on the MeterProvider's
// meter for ScopeName. It returns the error of an instrument that could
// not be created.
func New(opts ...Option) (*Hook, error) {
	cfg := config{maxNames: DefaultMaxLockNames}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.maxNames < 1 {
		panic(fmt.Sprintf("remutexotel: WithMaxLockNames(%d): must be at least 1", cfg.maxNames))
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	h := &Hook{names: newNames(cfg.mapName, cfg.maxNames)}
	if err := h.inst.init(cfg.mp.Meter(ScopeName)); err != nil {
		return nil, err
	}
	h.spans = newSpans(cfg.tp.Tracer(ScopeName), !cfg.noHold)
	return h, nil
}

// Option returns the remutex option that installs h as the Client's hook.
func (h *Hook) Option() remutex.Option { return remutex.WithHook(h.Record) }

// Record records ev. It is the hook function: call it from a hook of your
// own to combine it with others.
func (h *Hook) Record(ev remutex.Event) {
	ctx := ev.Context
	if ctx == nil {
		ctx = context.Background()
	}
	l := h.names.get(ev.Lock).mode(ev.Read)
	in := &h.inst
	switch ev.Kind {
	case remutex.EventAcquired:
		in.acquisitions.Add(ctx, 1, l.acquired[handoffOf(ev.Granted)].add...)
		in.held.Add(ctx, 1, l.base.add...)
		in.wait.Record(ctx, seconds(ev.Duration), l.waitAcquired.rec...)
		h.spans.acquired(ctx, ev)
	case remutex.EventWaiting:
		in.waiting.Add(ctx, 1, l.base.add...)
	case remutex.EventWaited:
		in.waiting.Add(ctx, -1, l.base.add...)
		if ev.Err != nil {
			outcome := outcomeOf(ev.Err)
			in.wait.Record(ctx, seconds(ev.Duration), l.with(attrOutcome.String(outcome)).rec...)
			h.spans.gaveUp(ctx, ev, outcome)
		}
	case remutex.EventReleased:
		in.held.Add(ctx, -1, l.base.add...)
		end := l.released
		if ev.Err != nil {
			end = l.releaseFailed
		}
		in.hold.Record(ctx, seconds(ev.Duration), end.rec...)
		h.spans.ended(ev)
	case remutex.EventLost:
		in.held.Add(ctx, -1, l.base.add...)
		in.hold.Record(ctx, seconds(ev.Duration), l.lost.rec...)
		in.losses.Add(ctx, 1, l.with(attrReason.String(reasonOf(ev.Reason))).add...)
		h.spans.ended(ev)
	case remutex.EventRenewed:
		in.renewals.Add(ctx, 1, l.base.add...)
	case remutex.EventRenewFailed:
		in.renewFailures.Add(ctx, 1, l.base.add...)
		h.spans.renewFailed(ev)
	}
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// Values of the attributes.
const (
	modeRead  = "read"
	modeWrite = "write"

	handoffFree  = "free"
	handoffGrant = "grant"

	outcomeAcquired  = "acquired"
	outcomeTimeout   = "timeout"
	outcomeCancelled = "cancelled"
	outcomeError     = "error"

	endReleased      = "released"
	endReleaseFailed = "release_failed"
	endLost          = "lost"
)

func handoffOf(granted bool) int {
	if granted {
		return 1
	}
	return 0
}

// outcomeOf classifies the error of a wait that gave up.
func outcomeOf(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return outcomeTimeout
	case errors.Is(err, context.Canceled):
		return outcomeCancelled
	}
	return outcomeError
}

// reasonOf is the remutex.lock.lost.reason of r: its String, "unknown" for
// a reason this package does not know.
func reasonOf(r remutex.LossReason) string {
	if r < remutex.LossExpired || r > remutex.LossClosed {
		return "unknown"
	}
	return r.String()
}
