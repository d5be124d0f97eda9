package main

import (
	"context"
	"fmt"
	"log/slog"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/remutex/remutex"
	remutexotel "github.com/remutex/remutex/otel"
)

// The cost of observing: remutex's uncontended Lock+Unlock cycle with no
// hook, with the OpenTelemetry adapter recording metrics (SDK with a manual
// reader), and recording metrics and spans (every span sampled).
func hookVariants() []variant {
	mk := func(name string, otel, spans bool) variant {
		return variant{name: name, lib: "remutex", remutex: true, connect: func(cfg config) (client, error) {
			rdb := goRedis(cfg)
			opts := []remutex.Option{remutex.WithLogger(slog.New(slog.DiscardHandler))}
			var stop func()
			if otel {
				opt, shutdown, err := otelOption(spans)
				if err != nil {
					return nil, err
				}
				opts, stop = append(opts, opt), shutdown
			}
			return &hookClient{remutexClient{rdb: rdb, c: remutex.NewClient(rdb, opts...)}, stop}, nil
		}}
	}
	return []variant{mk("no hook", false, false), mk("otel metrics", true, false), mk("otel metrics+spans", true, true)}
}

// otelOption is the adapter on SDK providers that keep what they record in
// memory, and the function that shuts them down.
func otelOption(spans bool) (remutex.Option, func(), error) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	opts := []remutexotel.Option{remutexotel.WithMeterProvider(mp), remutexotel.WithTracerProvider(noop.NewTracerProvider())}
	var tp *sdktrace.TracerProvider
	if spans {
		tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
		opts = append(opts, remutexotel.WithTracerProvider(tp))
	}
	hook, err := remutexotel.New(opts...)
	if err != nil {
		return nil, nil, err
	}
	return hook.Option(), func() {
		_ = mp.Shutdown(context.Background())
		if tp != nil {
			_ = tp.Shutdown(context.Background())
		}
	}, nil
}

type hookClient struct {
	remutexClient
	stop func()
}

func (h *hookClient) close() {
	h.remutexClient.close()
	if h.stop != nil {
		h.stop()
	}
}

func (r *results) runHooks(srv *server) {
	vs := hookVariants()
	r.Hooks = map[string]*cycleResult{}
	for _, v := range vs {
		r.Hooks[v.name] = &cycleResult{}
	}
	for round := 0; round < r.Plan.Rounds; round++ {
		for _, v := range inTurn(vs, round) {
			if err := uncontendedRound(v, srv, span{d: r.Plan.RoundTime}, r.Hooks[v.name]); err != nil {
				r.problem(v, "hook cost", err)
			}
		}
	}
	for _, v := range vs {
		c := r.Hooks[v.name]
		c.finish()
		r.logf("hook cost %-19s %8.1fµs/cycle %5.1f allocs", v.name, us(c.Cycle), c.Allocs)
	}
}

func (w *page) hooks(r *results) {
	if len(r.Hooks) == 0 {
		return
	}
	w.p("## (g) The cost of observing (remutex)\n\n")
	w.p("remutex's uncontended Lock+Unlock cycle with no hook, with the OpenTelemetry adapter (`otel/`) recording metrics " +
		"into the SDK (a manual reader), and recording metrics and spans (every span sampled, kept by the SDK until shut " +
		"down). Rounds alternate between the three, each beginning with the next.\n\n")
	w.p("| hook | µs/cycle | p99 µs | allocs | bytes | vs no hook |\n|---|---:|---:|---:|---:|---:|\n")
	base := r.Hooks["no hook"]
	for _, v := range hookVariants() {
		c := r.Hooks[v.name]
		if c == nil || c.Cycles == 0 {
			continue
		}
		ratio := ""
		if base != nil && base.Cycle > 0 {
			ratio = fmt.Sprintf("%.2f×", float64(c.Cycle)/float64(base.Cycle))
		}
		w.p("| %s | %.1f | %.1f | %.1f | %.0f | %s |\n", v.name, us(c.Cycle), us(c.P99), c.Allocs, c.Bytes, ratio)
	}
	w.p("\n")
}
