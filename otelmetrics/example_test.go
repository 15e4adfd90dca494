package otelmetrics_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/otelmetrics"
)

// A server observes its Limiter on the application's MeterProvider (here one with a
// ManualReader, where a service would have an OTLP or Prometheus exporter). The
// attribute tells this Limiter from others the process may run. An embedded miniredis
// stands in for Redis.
func Example() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	opts := &redis.Options{Addr: m.Addr()}
	global.Configure(opts)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	store, err := global.New(rdb)
	if err != nil {
		panic(err)
	}
	lim, err := hybrid.New(store, hybrid.Config{
		FleetSize: 4,
		Limits:    []hybrid.Limit{{Name: "upload", Rate: 1.0 / 60, Burst: 8, Policy: breaker.FailLocal(), MaxWait: time.Second}},
	})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(context.Background())
	reg, err := otelmetrics.Register(lim, provider.Meter("example.com/uploads"),
		otelmetrics.WithAttributes(attribute.String("limiter", "upload")))
	if err != nil {
		panic(err)
	}
	defer reg.Unregister()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name == "fleetlimit_servers" {
			p := m.Data.(metricdata.Gauge[int64]).DataPoints[0]
			limiter, _ := p.Attributes.Value("limiter")
			fmt.Println(m.Name, limiter.AsString(), p.Value)
		}
	}
	// Output:
	// fleetlimit_servers upload 4
}
