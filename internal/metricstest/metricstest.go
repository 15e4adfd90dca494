// Package metricstest is what every metrics adapter of fleetlimit (prommetrics,
// otelmetrics) is tested against: the table of docs/metrics.md, and the decisions
// hybridtest.Busy's Limiter has made, which the adapters' counters must show; and the
// sums of a limit's decision counts (Allowed, Denied) that tests compare with.
package metricstest

import (
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/hybrid/hybridtest"
)

// BusyOutcomes are the kinds of decision hybridtest.Busy's Limiter has made, each at least once: a
// refill granted, leases, a pre-check denial, a cost above the burst, Redis refusing
// commands under fail-open and fail-closed, and the breaker open under both.
var BusyOutcomes = []hybridtest.Outcome{
	{Limit: "api", Allowed: true, Source: hybrid.SourceGlobal, Reason: hybrid.ReasonGranted},
	{Limit: "api", Allowed: true, Source: hybrid.SourceLease, Reason: hybrid.ReasonLease},
	{Limit: "tight", Allowed: false, Source: hybrid.SourcePreCheck, Reason: hybrid.ReasonPreCheck},
	{Limit: "tight", Allowed: false, Source: hybrid.SourceLease, Reason: hybrid.ReasonExceedsBurst},
	{Limit: "api", Allowed: true, Source: hybrid.SourceFallback, Reason: hybrid.ReasonUnavailable},
	{Limit: "tight", Allowed: false, Source: hybrid.SourceFallback, Reason: hybrid.ReasonUnavailable},
	{Limit: "api", Allowed: true, Source: hybrid.SourceFallback, Reason: hybrid.ReasonBreakerOpen},
	{Limit: "tight", Allowed: false, Source: hybrid.SourceFallback, Reason: hybrid.ReasonBreakerOpen},
}

// Metric is one row of docs/metrics.md: a Prometheus name, its type ("counter" or
// "gauge") and its labels.
type Metric struct {
	Name, Type string
	Labels     []string
}

// Metrics is the table of docs/metrics.md: what every metrics adapter exports.
var Metrics = []Metric{
	{"fleetlimit_decisions_total", "counter", []string{"limit", "allowed", "source", "reason"}},
	{"fleetlimit_refills_total", "counter", []string{"limit"}},
	{"fleetlimit_refill_errors_total", "counter", []string{"limit"}},
	{"fleetlimit_tokens_granted_total", "counter", []string{"limit"}},
	{"fleetlimit_tokens_refunded_total", "counter", []string{"limit"}},
	{"fleetlimit_tokens_refund_lost_total", "counter", []string{"limit"}},
	{"fleetlimit_buckets_lost_total", "counter", []string{"limit"}},
	{"fleetlimit_decisions_given_back_total", "counter", []string{"limit"}},
	{"fleetlimit_lease_tokens_held", "gauge", []string{"limit"}},
	{"fleetlimit_limit_dry_run", "gauge", []string{"limit"}},
	{"fleetlimit_round_trips_total", "counter", nil},
	{"fleetlimit_refund_calls_total", "counter", nil},
	{"fleetlimit_heartbeats_total", "counter", nil},
	{"fleetlimit_servers", "gauge", nil},
	{"fleetlimit_breaker_state", "gauge", []string{"state"}},
	{"fleetlimit_breaker_transitions_total", "counter", []string{"to"}},
	{"fleetlimit_breaker_calls_total", "counter", []string{"result"}},
}

// Allowed returns the requests s's limit admitted: its allowed Decisions.
func Allowed(s hybrid.LimitStats) int64 { return sum(s, true) }

// Denied returns the requests s's limit denied, canceled ones included.
func Denied(s hybrid.LimitStats) int64 { return sum(s, false) }

func sum(s hybrid.LimitStats, allowed bool) int64 {
	var n int64
	for _, d := range s.Decisions {
		if d.Allowed == allowed {
			n += d.Count
		}
	}
	return n
}
