package remutexotel_test

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/redistest"
	remutexotel "github.com/remutex/remutex/otel"
)

// benchHooks are the variants the benchmarks compare: no hook, the Hook
// with metrics only (spans go to a no-op TracerProvider), and with metrics
// and spans (every span sampled, under a caller's span, and dropped at End).
var benchHooks = []struct {
	name  string
	spans bool
	off   bool
}{{name: "off", off: true}, {name: "metrics"}, {name: "metrics+spans", spans: true}}

// benchHook returns the Hook of a variant and the context to lock with.
func benchHook(b *testing.B, spans bool) (*remutexotel.Hook, context.Context) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	opts := []remutexotel.Option{remutexotel.WithMeterProvider(mp), remutexotel.WithTracerProvider(noop.NewTracerProvider())}
	ctx := context.Background()
	if spans {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		opts = append(opts, remutexotel.WithTracerProvider(tp))
		ctx, _ = tp.Tracer("bench").Start(ctx, "caller")
	}
	h, err := remutexotel.New(opts...)
	if err != nil {
		b.Fatal(err)
	}
	return h, ctx
}

// BenchmarkLockUnlock is the uncontended cycle (LockContext, Unlock) of the
// root package's benchmark of that name, with each variant of the hook.
func BenchmarkLockUnlock(b *testing.B) {
	addr := benchAddr(b)
	for _, v := range benchHooks {
		b.Run("hook="+v.name, func(b *testing.B) {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			b.Cleanup(func() { _ = rdb.Close() })
			var opts []remutex.Option
			ctx := context.Background()
			if !v.off {
				var h *remutexotel.Hook
				h, ctx = benchHook(b, v.spans)
				opts = append(opts, h.Option())
			}
			c := remutex.NewClient(rdb, opts...)
			b.Cleanup(func() { _ = c.Close() })
			m := c.NewMutex("bench:" + b.Name())
			if err := m.LockContext(ctx); err != nil { // load the scripts, open the connection
				b.Fatal(err)
			}
			m.Unlock()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := m.LockContext(ctx); err != nil {
					b.Fatal(err)
				}
				m.Unlock()
			}
		})
	}
}

// BenchmarkRecord is the Hook's own cost for one uncontended cycle: the
// EventAcquired and EventReleased it records, without Redis.
func BenchmarkRecord(b *testing.B) {
	for _, v := range benchHooks[1:] {
		b.Run("hook="+v.name, func(b *testing.B) {
			h, ctx := benchHook(b, v.spans)
			acq := remutex.Event{Kind: remutex.EventAcquired, Lock: "bench", Owner: "c:1", Context: ctx}
			rel := remutex.Event{Kind: remutex.EventReleased, Lock: "bench", Owner: "c:1", Context: context.Background()}
			b.ReportAllocs()
			for i := range b.N {
				acq.Hold, rel.Hold = uint64(i+1), uint64(i+1)
				h.Record(acq)
				h.Record(rel)
			}
		})
	}
}

// benchAddr is REDIS_ADDR if set, else the shared redis-server, else (with
// no redis-server on PATH) miniredis.
func benchAddr(b *testing.B) string {
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		return addr
	}
	if _, err := exec.LookPath("redis-server"); err == nil || os.Getenv(redistest.RequireEnv) == "1" {
		return redistest.Shared(b).Addr()
	}
	mr := miniredis.RunT(b)
	return mr.Addr()
}
