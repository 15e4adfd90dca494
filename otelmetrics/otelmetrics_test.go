package otelmetrics_test

import (
	"context"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/hybrid/hybridtest"
	"github.com/fleetlimit/fleetlimit/internal/metricstest"
	"github.com/fleetlimit/fleetlimit/otelmetrics"
)

// instrument is the OpenTelemetry name of a metric of metricstest.Metrics: counters lose the
// "_total" that OpenTelemetry's Prometheus exporter adds back.
func instrument(m metricstest.Metric) string {
	if m.Type == "counter" {
		return strings.TrimSuffix(m.Name, "_total")
	}
	return m.Name
}

// collect reads every metric the reader has, by instrument name.
func collect(t *testing.T, rd *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if _, dup := out[m.Name]; dup {
				t.Errorf("%s collected twice", m.Name)
			}
			out[m.Name] = m
		}
	}
	return out
}

// dataPoints returns an instrument's data points whatever its aggregation.
func dataPoints(m metricdata.Metrics) []metricdata.DataPoint[int64] {
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		return d.DataPoints
	case metricdata.Gauge[int64]:
		return d.DataPoints
	}
	return nil
}

// series returns an instrument's values keyed by the values of the given attributes,
// joined by "/".
func series(t *testing.T, ms map[string]metricdata.Metrics, name string, keys ...string) map[string]float64 {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		t.Fatalf("no %s collected", name)
	}
	out := map[string]float64{}
	for _, p := range dataPoints(m) {
		var k []string
		for _, key := range keys {
			v, _ := p.Attributes.Value(attribute.Key(key))
			k = append(k, v.Emit())
		}
		id := strings.Join(k, "/")
		if _, dup := out[id]; dup {
			t.Errorf("%s: two data points for %q", name, id)
		}
		out[id] = float64(p.Value)
	}
	return out
}

func register(t *testing.T, l *hybrid.Limiter, opts ...otelmetrics.Option) *sdkmetric.ManualReader {
	t.Helper()
	rd := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	if _, err := otelmetrics.Register(l, mp.Meter("fleetlimit-test"), opts...); err != nil {
		t.Fatal(err)
	}
	return rd
}

// TestCollectAgreesWithStats: what the SDK collects is what the Limiter counted
// (Limiter.Stats) and what its callers were told (Config.OnDecision), through leases,
// refills, pre-check denials, a cost above the burst, Redis errors under both failure
// policies, an open breaker, and a Close that could not refund.
func TestCollectAgreesWithStats(t *testing.T) {
	l, seen := hybridtest.Busy(t)
	rd := register(t, l, otelmetrics.WithAttributes(attribute.String("limiter", "api")))
	st := agree(t, l, seen, rd)
	if api := st.Limits[0]; api.Granted == 0 || api.Held == 0 || api.RefillErrors == 0 {
		t.Errorf("api: %+v; want tokens granted and held, and failed refills", api)
	}
	if err := l.Close(context.Background()); err == nil {
		t.Error("Close refunded with Redis down")
	}
	st = agree(t, l, seen, rd)
	if api := st.Limits[0]; api.Held != 0 || api.RefundsLost == 0 {
		t.Errorf("api after Close: %+v; want nothing held, tokens lost", api)
	}
}

// agree collects from rd, which observes l, and checks that every instrument is what
// l.Stats says and, for decisions, what OnDecision heard. It returns the Stats.
func agree(t *testing.T, l *hybrid.Limiter, seen *hybridtest.Tally, rd *sdkmetric.ManualReader) hybrid.Stats {
	t.Helper()
	// The Limiter is idle, so its counters hold still; a collection between two equal
	// snapshots saw them.
	var st hybrid.Stats
	var ms map[string]metricdata.Metrics
	for try := 0; ; try++ {
		st = l.Stats()
		ms = collect(t, rd)
		if reflect.DeepEqual(st, l.Stats()) {
			break
		}
		if try == 10 {
			t.Fatal("the Limiter's counters keep moving while it is idle")
		}
	}

	heard := seen.Counts()
	for _, k := range metricstest.BusyOutcomes {
		if heard[k] == 0 {
			t.Errorf("the test made no decision %+v; OnDecision heard %v", k, heard)
		}
	}
	decisions := series(t, ms, "fleetlimit_decisions", "limit", "allowed", "source", "reason")
	want := map[string]float64{}
	for k, n := range heard {
		want[strings.Join([]string{k.Limit, strconv.FormatBool(k.Allowed), k.Source.String(), k.Reason.String()}, "/")] = float64(n)
	}
	if !reflect.DeepEqual(decisions, want) {
		t.Errorf("fleetlimit_decisions:\n collected %v\n     heard %v", decisions, want)
	}
	for _, ls := range st.Limits {
		for _, d := range ls.Decisions {
			id := strings.Join([]string{ls.Name, strconv.FormatBool(d.Allowed), d.Source.String(), d.Reason.String()}, "/")
			if decisions[id] != float64(d.Count) {
				t.Errorf("decisions %s: collected %v, Stats say %d", id, decisions[id], d.Count)
			}
		}
	}

	perLimit := map[string]func(hybrid.LimitStats) int64{
		"fleetlimit_refills":              func(s hybrid.LimitStats) int64 { return s.Takes },
		"fleetlimit_refill_errors":        func(s hybrid.LimitStats) int64 { return s.RefillErrors },
		"fleetlimit_tokens_granted":       func(s hybrid.LimitStats) int64 { return s.Granted },
		"fleetlimit_tokens_refunded":      func(s hybrid.LimitStats) int64 { return s.Refunded },
		"fleetlimit_tokens_refund_lost":   func(s hybrid.LimitStats) int64 { return s.RefundsLost },
		"fleetlimit_buckets_lost":         func(s hybrid.LimitStats) int64 { return s.LostBuckets },
		"fleetlimit_decisions_given_back": func(s hybrid.LimitStats) int64 { return s.GivenBack },
		"fleetlimit_lease_tokens_held":    func(s hybrid.LimitStats) int64 { return s.Held },
	}
	for name, field := range perLimit {
		got := series(t, ms, name, "limit")
		want := map[string]float64{}
		for _, ls := range st.Limits {
			want[ls.Name] = float64(field(ls))
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: collected %v, Stats say %v", name, got, want)
		}
	}

	for name, want := range map[string]int64{
		"fleetlimit_round_trips":  st.RoundTrips,
		"fleetlimit_refund_calls": st.RefundCalls,
		"fleetlimit_heartbeats":   st.Heartbeats,
		"fleetlimit_servers":      int64(st.Servers),
	} {
		if got := series(t, ms, name); !reflect.DeepEqual(got, map[string]float64{"": float64(want)}) {
			t.Errorf("%s: collected %v, Stats say %d", name, got, want)
		}
	}
	b := st.BreakerStats
	for _, c := range []struct {
		name, key string
		want      map[string]float64
	}{
		{"fleetlimit_breaker_state", "state", map[string]float64{"closed": 0, "half-open": 0, "open": 1}},
		{"fleetlimit_breaker_transitions", "to", map[string]float64{"closed": float64(b.Closed), "half-open": float64(b.HalfOpened), "open": float64(b.Opened)}},
		{"fleetlimit_breaker_calls", "result", map[string]float64{
			"success": float64(b.Successes), "failure": float64(b.Failures), "rejected": float64(b.Rejected),
			"overloaded": float64(b.Overloaded), "excluded": float64(b.Excluded),
		}},
	} {
		if got := series(t, ms, c.name, c.key); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: collected %v, Stats say %v", c.name, got, c.want)
		}
	}
	if st.Breaker != breaker.StateOpen || b.Opened != 1 {
		t.Errorf("breaker %v %+v: want open once", st.Breaker, b)
	}
	return st
}

// TestCollectHasTheSpec: the instruments are exactly the metrics of docs/metrics.md,
// named as the Prometheus exporter expects, counters as cumulative monotonic sums, the
// tokens held as a non-monotonic sum and the other gauges as gauges; every data point
// has its attributes and the constant ones; every instrument has a description.
func TestCollectHasTheSpec(t *testing.T) {
	l, _ := hybridtest.Busy(t)
	rd := register(t, l, otelmetrics.WithAttributes(attribute.String("limiter", "api"), attribute.String("region", "eu")))
	ms := collect(t, rd)
	if len(ms) != len(metricstest.Metrics) {
		var names []string
		for n := range ms {
			names = append(names, n)
		}
		t.Errorf("collected %d instruments %v, the metricstest.Metrics has %d", len(ms), names, len(metricstest.Metrics))
	}
	for _, sp := range metricstest.Metrics {
		name := instrument(sp)
		m, ok := ms[name]
		if !ok {
			t.Errorf("%s: not collected", name)
			continue
		}
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			monotonic := sp.Type == "counter"
			if sp.Type == "gauge" && sp.Name != "fleetlimit_lease_tokens_held" || d.IsMonotonic != monotonic || d.Temporality != metricdata.CumulativeTemporality {
				t.Errorf("%s: a sum (monotonic %v, %v), want a %s", name, d.IsMonotonic, d.Temporality, sp.Type)
			}
		case metricdata.Gauge[int64]:
			if sp.Type != "gauge" || sp.Name == "fleetlimit_lease_tokens_held" {
				t.Errorf("%s: a gauge, want a %s", name, sp.Type)
			}
		default:
			t.Errorf("%s: %T", name, m.Data)
		}
		if m.Description == "" {
			t.Errorf("%s: no description", name)
		}
		// A unit is an annotation ({token}) or none: the Prometheus exporter adds a suffix
		// to the name for any other, and the name would no longer be the table's.
		if u := m.Unit; u != "" && (!strings.HasPrefix(u, "{") || !strings.HasSuffix(u, "}")) {
			t.Errorf("%s: unit %q, want an annotation such as {token}, or none", name, u)
		}
		points := dataPoints(m)
		if len(points) == 0 {
			t.Errorf("%s: no data point", name)
		}
		for _, p := range points {
			// allowed is a boolean attribute (docs/metrics.md): an OTLP backend keeps its
			// type, and a query on the boolean does not match a string "true".
			if v, ok := p.Attributes.Value("allowed"); ok && v.Type() != attribute.BOOL {
				t.Errorf("%s: allowed is a %v attribute, want a BOOL", name, v.Type())
			}
		}
		want := append([]string{"limiter", "region"}, sp.Labels...)
		slices.Sort(want)
		for _, p := range points {
			var got []string
			for _, kv := range p.Attributes.ToSlice() {
				got = append(got, string(kv.Key))
			}
			slices.Sort(got)
			limiter, _ := p.Attributes.Value("limiter")
			region, _ := p.Attributes.Value("region")
			if !slices.Equal(got, want) || limiter.AsString() != "api" || region.AsString() != "eu" {
				t.Errorf("%s: attributes %v, want the keys %v with limiter=api, region=eu", name, p.Attributes.ToSlice(), want)
			}
		}
	}
}

// TestUnregister: after Unregister the Limiter is no longer observed.
func TestUnregister(t *testing.T) {
	l, _ := hybridtest.Busy(t)
	rd := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
	defer mp.Shutdown(context.Background())
	reg, err := otelmetrics.Register(l, mp.Meter("fleetlimit-test"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(dataPoints(collect(t, rd)["fleetlimit_servers"])); n != 1 {
		t.Fatalf("%d data points of fleetlimit_servers while registered", n)
	}
	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
	if n := len(dataPoints(collect(t, rd)["fleetlimit_servers"])); n != 0 {
		t.Errorf("%d data points of fleetlimit_servers after Unregister", n)
	}
}

// TestCollectPerLimitCounters: the per-limit counters and gauge that Busy's Limiter
// leaves at 0 are collected under their own names with their own limit's values
// (metricstest.PerLimit).
func TestCollectPerLimitCounters(t *testing.T) {
	l, want := metricstest.PerLimit(t)
	checkCollected(t, register(t, l), want)
}

// TestCollectBreaker: the state gauge follows the breaker through closed, open and
// half-open, and each transition and call counter is collected under its own attribute
// (metricstest.Breaker).
func TestCollectBreaker(t *testing.T) {
	l, walk := metricstest.Breaker(t)
	rd := register(t, l)
	want := walk(func(state string) {
		checkCollected(t, rd, metricstest.Want{"fleetlimit_breaker_state": {"closed": 0, "half-open": 0, "open": 0, state: 1}})
	})
	checkCollected(t, rd, want)
}

// checkCollected fails t unless each metric of want is collected from rd with want's
// values, under its OpenTelemetry name.
func checkCollected(t *testing.T, rd *sdkmetric.ManualReader, want metricstest.Want) {
	t.Helper()
	ms := collect(t, rd)
	for _, m := range metricstest.Metrics {
		w, ok := want[m.Name]
		if !ok {
			continue
		}
		if got := series(t, ms, instrument(m), metricstest.Label(t, m.Name)); !reflect.DeepEqual(got, w) {
			t.Errorf("%s: collected %v, want %v", instrument(m), got, w)
		}
	}
}
