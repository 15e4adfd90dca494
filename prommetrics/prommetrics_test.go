package prommetrics_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/hybrid/hybridtest"
	"github.com/fleetlimit/fleetlimit/internal/metricstest"
	"github.com/fleetlimit/fleetlimit/prommetrics"
)

// scrape serves reg over HTTP as Prometheus would scrape it and parses the text.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// labels returns a sample's labels as a map.
func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

// value returns a counter's or a gauge's value.
func value(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// series returns a family's samples keyed by the values of the given labels, joined by "/".
func series(t *testing.T, fams map[string]*dto.MetricFamily, name string, keys ...string) map[string]float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no %s in the scrape", name)
	}
	out := map[string]float64{}
	for _, m := range f.GetMetric() {
		ls := labels(m)
		var k []string
		for _, key := range keys {
			k = append(k, ls[key])
		}
		id := strings.Join(k, "/")
		if _, dup := out[id]; dup {
			t.Errorf("%s: two samples for %q", name, id)
		}
		out[id] = value(m)
	}
	return out
}

// TestScrapeAgreesWithStats: what Prometheus parses from a scrape is what the Limiter
// counted (Limiter.Stats) and what its callers were told (Config.OnDecision), through
// leases, refills, pre-check denials, a cost above the burst, Redis errors under both
// failure policies and an open breaker.
func TestScrapeAgreesWithStats(t *testing.T) {
	l, seen := hybridtest.Busy(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(prommetrics.New(l, prommetrics.ConstLabels{"limiter": "api"}))
	st := agree(t, l, seen, reg)
	if api := st.Limits[0]; api.Granted == 0 || api.Held == 0 || api.RefillErrors == 0 {
		t.Errorf("api: %+v; want tokens granted and held, and failed refills", api)
	}

	// Close, with Redis gone, cannot refund what the leases hold: the tokens are lost.
	if err := l.Close(context.Background()); err == nil {
		t.Error("Close refunded with Redis down")
	}
	st = agree(t, l, seen, reg)
	if api := st.Limits[0]; api.Held != 0 || api.RefundsLost == 0 {
		t.Errorf("api after Close: %+v; want nothing held, tokens lost", api)
	}
}

// agree scrapes reg, which holds a Collector of l, and checks that every metric is what
// l.Stats says and, for decisions, what OnDecision heard. It returns the Stats.
func agree(t *testing.T, l *hybrid.Limiter, seen *hybridtest.Tally, reg *prometheus.Registry) hybrid.Stats {
	t.Helper()
	// The Limiter is idle, so its counters hold still; a scrape between two equal
	// snapshots saw them.
	var st hybrid.Stats
	var fams map[string]*dto.MetricFamily
	for try := 0; ; try++ {
		st = l.Stats()
		fams = scrape(t, reg)
		if reflect.DeepEqual(st, l.Stats()) {
			break
		}
		if try == 10 {
			t.Fatal("the Limiter's counters keep moving while it is idle")
		}
	}

	// Every decision the callers got is in the scrape once, under its labels.
	heard := seen.Counts()
	for _, k := range metricstest.BusyOutcomes {
		if heard[k] == 0 {
			t.Errorf("the test made no decision %+v; OnDecision heard %v", k, heard)
		}
	}
	decisions := series(t, fams, "fleetlimit_decisions_total", "limit", "allowed", "source", "reason")
	want := map[string]float64{}
	var total int64
	for k, n := range heard {
		want[strings.Join([]string{k.Limit, strconv.FormatBool(k.Allowed), k.Source.String(), k.Reason.String()}, "/")] = float64(n)
		total += n
	}
	if !reflect.DeepEqual(decisions, want) {
		t.Errorf("fleetlimit_decisions_total:\n scraped %v\n   heard %v", decisions, want)
	}
	if n := st.PreCheck + st.Lease + st.Global + st.Fallback + st.Canceled; n != total {
		t.Errorf("Stats counts %d decisions, OnDecision heard %d", n, total)
	}

	// Per limit: every counter of LimitStats, decisions included.
	perLimit := map[string]func(hybrid.LimitStats) int64{
		"fleetlimit_refills_total":              func(s hybrid.LimitStats) int64 { return s.Takes },
		"fleetlimit_refill_errors_total":        func(s hybrid.LimitStats) int64 { return s.RefillErrors },
		"fleetlimit_tokens_granted_total":       func(s hybrid.LimitStats) int64 { return s.Granted },
		"fleetlimit_tokens_refunded_total":      func(s hybrid.LimitStats) int64 { return s.Refunded },
		"fleetlimit_tokens_refund_lost_total":   func(s hybrid.LimitStats) int64 { return s.RefundsLost },
		"fleetlimit_buckets_lost_total":         func(s hybrid.LimitStats) int64 { return s.LostBuckets },
		"fleetlimit_decisions_given_back_total": func(s hybrid.LimitStats) int64 { return s.GivenBack },
		"fleetlimit_lease_tokens_held":          func(s hybrid.LimitStats) int64 { return s.Held },
	}
	for name, field := range perLimit {
		got := series(t, fams, name, "limit")
		want := map[string]float64{}
		for _, ls := range st.Limits {
			want[ls.Name] = float64(field(ls))
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: scraped %v, Stats say %v", name, got, want)
		}
	}
	for _, ls := range st.Limits {
		for _, d := range ls.Decisions {
			id := strings.Join([]string{ls.Name, strconv.FormatBool(d.Allowed), d.Source.String(), d.Reason.String()}, "/")
			if decisions[id] != float64(d.Count) {
				t.Errorf("decisions %s: scraped %v, Stats say %d", id, decisions[id], d.Count)
			}
		}
	}

	// The Limiter's totals and its breaker.
	for name, want := range map[string]int64{
		"fleetlimit_round_trips_total":  st.RoundTrips,
		"fleetlimit_refund_calls_total": st.RefundCalls,
		"fleetlimit_heartbeats_total":   st.Heartbeats,
		"fleetlimit_servers":            int64(st.Servers),
	} {
		if got := series(t, fams, name); !reflect.DeepEqual(got, map[string]float64{"": float64(want)}) {
			t.Errorf("%s: scraped %v, Stats say %d", name, got, want)
		}
	}
	if st.Servers != 2 || st.RoundTrips == 0 {
		t.Errorf("Stats %+v: want 2 servers and some round trips", st)
	}
	b := st.BreakerStats
	for name, want := range map[string]map[string]float64{
		"fleetlimit_breaker_state":             {"closed": 0, "half-open": 0, "open": 1},
		"fleetlimit_breaker_transitions_total": {"closed": float64(b.Closed), "half-open": float64(b.HalfOpened), "open": float64(b.Opened)},
		"fleetlimit_breaker_calls_total": {
			"success": float64(b.Successes), "failure": float64(b.Failures), "rejected": float64(b.Rejected),
			"overloaded": float64(b.Overloaded), "excluded": float64(b.Excluded),
		},
	} {
		key := "state"
		switch name {
		case "fleetlimit_breaker_transitions_total":
			key = "to"
		case "fleetlimit_breaker_calls_total":
			key = "result"
		}
		if got := series(t, fams, name, key); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: scraped %v, Stats say %v", name, got, want)
		}
	}
	if st.Breaker != breaker.StateOpen || b.Opened != 1 || b.Failures == 0 || b.Successes == 0 {
		t.Errorf("breaker %v %+v: want open once, after successes and a failure", st.Breaker, b)
	}
	return st
}

// TestScrapeHasTheSpec: a scrape has exactly the metrics of docs/metrics.md, each with
// its type, its labels and the constant ones, and a help text.
func TestScrapeHasTheSpec(t *testing.T) {
	l, _ := hybridtest.Busy(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(prommetrics.New(l, prommetrics.ConstLabels{"limiter": "api", "region": "eu"}))
	fams := scrape(t, reg)
	if len(fams) != len(metricstest.Metrics) {
		var names []string
		for n := range fams {
			names = append(names, n)
		}
		t.Errorf("scraped %d metrics %v, the metricstest.Metrics has %d", len(fams), names, len(metricstest.Metrics))
	}
	for _, m := range metricstest.Metrics {
		f := fams[m.Name]
		if f == nil {
			t.Errorf("%s: not scraped", m.Name)
			continue
		}
		if got := strings.ToLower(f.GetType().String()); got != m.Type {
			t.Errorf("%s: a %s, want a %s", m.Name, got, m.Type)
		}
		if f.GetHelp() == "" {
			t.Errorf("%s: no help text", m.Name)
		}
		if len(f.GetMetric()) == 0 {
			t.Errorf("%s: no sample", m.Name)
		}
		want := append([]string{"limiter", "region"}, m.Labels...)
		slices.Sort(want)
		for _, s := range f.GetMetric() {
			ls := labels(s)
			var got []string
			for k := range ls {
				got = append(got, k)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) || ls["limiter"] != "api" || ls["region"] != "eu" {
				t.Errorf("%s: labels %v, want the names %v with limiter=api, region=eu", m.Name, ls, want)
			}
		}
	}
}

// TestTwoLimitersOneRegistry: Collectors told apart by a constant label register side
// by side.
func TestTwoLimitersOneRegistry(t *testing.T) {
	a, _ := hybridtest.Busy(t)
	b, _ := hybridtest.Busy(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(prommetrics.New(a, prommetrics.ConstLabels{"limiter": "a"}))
	reg.MustRegister(prommetrics.New(b, prommetrics.ConstLabels{"limiter": "b"}))
	fams := scrape(t, reg)
	got := series(t, fams, "fleetlimit_servers", "limiter")
	if !reflect.DeepEqual(got, map[string]float64{"a": 2, "b": 2}) {
		t.Errorf("fleetlimit_servers by limiter: %v", got)
	}
	if err := reg.Register(prommetrics.New(a, prommetrics.ConstLabels{"limiter": "a"})); err == nil {
		t.Error("a second Collector with the same constant labels registered")
	}
}

// TestScrapePerLimitCounters: the per-limit counters and gauge that Busy's Limiter leaves
// at 0 are scraped under their own names with their own limit's values
// (metricstest.PerLimit).
func TestScrapePerLimitCounters(t *testing.T) {
	l, want := metricstest.PerLimit(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(prommetrics.New(l))
	checkScraped(t, reg, want)
}

// TestScrapeBreaker: the state gauge follows the breaker through closed, open and
// half-open, and each transition and call counter is scraped under its own label
// (metricstest.Breaker).
func TestScrapeBreaker(t *testing.T) {
	l, walk := metricstest.Breaker(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(prommetrics.New(l))
	want := walk(func(state string) {
		checkScraped(t, reg, metricstest.Want{"fleetlimit_breaker_state": {"closed": 0, "half-open": 0, "open": 0, state: 1}})
	})
	checkScraped(t, reg, want)
}

// checkScraped fails t unless each metric of want is scraped from reg with want's values.
func checkScraped(t *testing.T, reg *prometheus.Registry, want metricstest.Want) {
	t.Helper()
	fams := scrape(t, reg)
	for name, w := range want {
		if got := series(t, fams, name, metricstest.Label(t, name)); !reflect.DeepEqual(got, w) {
			t.Errorf("%s: scraped %v, want %v", name, got, w)
		}
	}
}
