package prommetrics_test

import (
	"context"
	"net/http"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/prommetrics"
)

// A server exports its Limiter's counters on /metrics. The constant label tells this
// Limiter from others the process may run. Here an embedded miniredis stands in for Redis.
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

	reg := prometheus.NewRegistry()
	reg.MustRegister(prommetrics.New(lim, prommetrics.ConstLabels{"limiter": "upload"}))
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// http.ListenAndServe(":9090", nil)
}
