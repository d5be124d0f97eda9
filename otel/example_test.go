package remutexotel_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/remutex/remutex"
	remutexotel "github.com/remutex/remutex/otel"
)

// A Client whose locks are counted on an SDK MeterProvider; the manual
// reader stands in for an exporter.
func Example() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	reader := sdkmetric.NewManualReader()
	hook, err := remutexotel.New(remutexotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		panic(err)
	}
	locks := remutex.NewClient(rdb, hook.Option())
	defer locks.Close()

	m := locks.NewMutex("report")
	for range 3 {
		m.Lock()
		m.Unlock()
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, met := range rm.ScopeMetrics[0].Metrics {
		if met.Name == remutexotel.MetricAcquisitions {
			dp := met.Data.(metricdata.Sum[int64]).DataPoints[0]
			name, _ := dp.Attributes.Value("remutex.lock.name")
			fmt.Println(met.Name, name.AsString(), dp.Value)
		}
	}
	// Output: remutex.lock.acquisitions report 3
}
