package remutexotel_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/redistest"
	remutexotel "github.com/remutex/remutex/otel"
)

func TestMain(m *testing.M) {
	code := m.Run()
	redistest.StopShared() // the benchmarks'
	os.Exit(code)
}

// backend is a Redis the tests run on: a redis-server of the test's own
// (redistest.Start), or miniredis.
type backend struct {
	name string
	addr string
	srv  *redistest.Server // nil on miniredis
}

func (b *backend) real() bool { return b.srv != nil }

// eachBackend runs f on a redis-server of its own and on miniredis.
func eachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		f(t, &backend{name: "redis", addr: srv.Addr(), srv: srv})
	})
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		f(t, &backend{name: "miniredis", addr: mr.Addr()})
	})
}

// rdb returns a go-redis client on b, closed at the end of the test.
func (b *backend) rdb(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: b.addr}
	for _, f := range opts {
		f(o)
	}
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// rig is a Hook on an SDK MeterProvider with a manual reader and an SDK
// TracerProvider with an in-memory exporter, and a count of the raw events
// it was given, to hold the metrics against.
type rig struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	hook   *remutexotel.Hook

	mu      sync.Mutex
	raw     map[remutex.EventKind]int
	grants  int
	waiting time.Time // when the latest EventWaiting came
	kicks   chan remutex.EventKind
}

func newRig(t testing.TB, opts ...remutexotel.Option) *rig {
	t.Helper()
	r := &rig{
		reader: sdkmetric.NewManualReader(),
		spans:  tracetest.NewInMemoryExporter(),
		raw:    map[remutex.EventKind]int{},
		kicks:  make(chan remutex.EventKind, 1), // something happened: look again
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(r.spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = r.tp.Shutdown(context.Background())
	})
	h, err := remutexotel.New(append([]remutexotel.Option{
		remutexotel.WithMeterProvider(mp), remutexotel.WithTracerProvider(r.tp),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	r.hook = h
	return r
}

// record is the Clients' hook: it counts ev, passes it to the Hook, and
// tells await of it.
func (r *rig) record(ev remutex.Event) {
	r.mu.Lock()
	r.raw[ev.Kind]++
	if ev.Kind == remutex.EventAcquired && ev.Granted {
		r.grants++
	}
	if ev.Kind == remutex.EventWaiting {
		r.waiting = time.Now()
	}
	r.mu.Unlock()
	r.hook.Record(ev)
	select {
	case r.kicks <- ev.Kind:
	default:
	}
}

func (r *rig) count(k remutex.EventKind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.raw[k]
}

// lastWaiting returns when the latest EventWaiting came: after its wait
// began.
// grantCount is the number of acquisitions by grant so far.
func (r *rig) grantCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.grants
}

func (r *rig) lastWaiting() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiting
}

// await waits until the hook has seen n events of kind k in all.
func (r *rig) await(t testing.TB, k remutex.EventKind, n int) {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for r.count(k) < n {
		select {
		case <-r.kicks:
		case <-timeout.C:
			t.Fatalf("%d %v events within 10s, want %d", r.count(k), k, n)
		}
	}
}

// client returns a remutex Client on rdb whose hook is r's, closed at the
// end of the test.
func (r *rig) client(t testing.TB, rdb redis.UniversalClient) *remutex.Client {
	c := remutex.NewClient(rdb, remutex.WithHook(r.record), remutex.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// collect returns the metrics recorded so far, by name.
func (r *rig) collect(t testing.TB) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != remutexotel.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, remutexotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// match says whether a data point's attributes include every one of want.
func match(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum adds up the data points of an Int64 sum (counter or up-down counter)
// whose attributes include want.
func sum(t testing.TB, m metricdata.Metrics, want ...attribute.KeyValue) int64 {
	t.Helper()
	if m.Data == nil {
		return 0 // nothing recorded
	}
	data, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s: data %T, want an int64 sum", m.Name, m.Data)
	}
	var n int64
	for _, dp := range data.DataPoints {
		if match(dp.Attributes, want) {
			n += dp.Value
		}
	}
	return n
}

// histogram merges the data points of a float64 histogram whose attributes
// include want (of every lock name, say) into one.
func histogram(t testing.TB, m metricdata.Metrics, want ...attribute.KeyValue) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	data, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s: data %T, want a float64 histogram", m.Name, m.Data)
	}
	var all metricdata.HistogramDataPoint[float64]
	for _, dp := range data.DataPoints {
		if !match(dp.Attributes, want) {
			continue
		}
		if all.Bounds == nil {
			all.Bounds, all.BucketCounts = dp.Bounds, make([]uint64, len(dp.BucketCounts))
		}
		for i, n := range dp.BucketCounts {
			all.BucketCounts[i] += n
		}
		all.Count += dp.Count
		all.Sum += dp.Sum
	}
	if len(all.Bounds) > 0 && !slices.Equal(all.Bounds, remutexotel.DurationBuckets) {
		t.Errorf("%s: bounds %v, want DurationBuckets", m.Name, all.Bounds)
	}
	if all.Count == 0 {
		t.Fatalf("%s %v: no values", m.Name, want)
	}
	return all
}

// bounded is a duration the test knows only within bounds: at least lo, at
// most hi (measured around the call).
type bounded struct{ lo, hi time.Duration }

// checkBuckets checks a histogram's buckets against values known within
// bounds: at each boundary b, the count at or below b is at least the
// number of values whose hi is at or below b, and at most the number whose
// lo is.
func checkBuckets(t testing.TB, what string, dp metricdata.HistogramDataPoint[float64], vals []bounded) {
	t.Helper()
	if dp.Count != uint64(len(vals)) {
		t.Errorf("%s: count %d, want %d", what, dp.Count, len(vals))
		return
	}
	var cum uint64
	for i, b := range dp.Bounds {
		cum += dp.BucketCounts[i]
		var surely, maybe uint64
		for _, v := range vals {
			if v.hi.Seconds() <= b {
				surely++
			}
			if v.lo.Seconds() <= b {
				maybe++
			}
		}
		if cum < surely || cum > maybe {
			t.Errorf("%s: %d values at or below %gs, want %d to %d (buckets %v)", what, cum, b, surely, maybe, dp.BucketCounts)
		}
	}
	var lo, hi time.Duration
	for _, v := range vals {
		lo += v.lo
		hi += v.hi
	}
	if dp.Sum < lo.Seconds() || dp.Sum > hi.Seconds() {
		t.Errorf("%s: sum %gs, want %v to %v", what, dp.Sum, lo, hi)
	}
}
