// Package prommetrics exports the counters of a hybrid.Limiter to Prometheus.
//
// A Collector reads Limiter.Stats when Prometheus scrapes it and at no other time:
// nothing is added to the path a request takes. The metrics, their types and labels are
// those of docs/metrics.md in the fleetlimit repository: decisions by limit, outcome,
// source and reason; refills, tokens leased, refunded and lost, and tokens held, by
// limit; round trips, refund calls, heartbeats and the fleet size; and the Redis
// breaker's state, state changes and calls. No label carries a client key.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(prommetrics.New(limiter))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// A process that runs several Limiters registers one Collector for each, told apart by
// a constant label: prommetrics.New(l, prommetrics.ConstLabels{"limiter": "api"}).
package prommetrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// An Option configures a Collector.
type Option interface {
	apply(*Collector)
}

// ConstLabels are labels with fixed values added to every metric of a Collector, such
// as limiter="api" for a process that runs more than one Limiter. Their names must not
// be those of the metrics' own labels (limit, allowed, source, reason, state, to,
// result).
type ConstLabels prometheus.Labels

func (c ConstLabels) apply(col *Collector) {
	if col.constLabels == nil {
		col.constLabels = prometheus.Labels{}
	}
	for k, v := range c {
		col.constLabels[k] = v
	}
}

// Collector is a prometheus.Collector for one hybrid.Limiter. Create it with New and
// register it with a prometheus.Registerer. It is safe for concurrent scrapes.
type Collector struct {
	l           *hybrid.Limiter
	constLabels prometheus.Labels

	decisions, refills, refillErrors, granted, refunded, refundLost, bucketsLost, givenBack, held *prometheus.Desc
	roundTrips, refundCalls, heartbeats, servers                                                  *prometheus.Desc
	breakerState, breakerTransitions, breakerCalls                                                *prometheus.Desc
	dryRun                                                                                        *prometheus.Desc
}

// New returns a Collector that reports l's counters at each scrape.
func New(l *hybrid.Limiter, opts ...Option) *Collector {
	c := &Collector{l: l}
	for _, o := range opts {
		o.apply(c)
	}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, c.constLabels)
	}
	c.decisions = desc("fleetlimit_decisions_total",
		"Decisions, by limit, outcome, the tier that decided (pre-check, lease, global, fallback) and why.",
		"limit", "allowed", "source", "reason")
	c.refills = desc("fleetlimit_refills_total",
		"Refills sent to Redis.", "limit")
	c.refillErrors = desc("fleetlimit_refill_errors_total",
		"Refills that failed (breaker open, timeout, Redis error): their requests went to the limit's policy.", "limit")
	c.granted = desc("fleetlimit_tokens_granted_total",
		"Tokens leased from the global buckets.", "limit")
	c.refunded = desc("fleetlimit_tokens_refunded_total",
		"Leased tokens given back.", "limit")
	c.refundLost = desc("fleetlimit_tokens_refund_lost_total",
		"Leased tokens whose refund failed: they stay spent, the fleet admits less.", "limit")
	c.givenBack = desc("fleetlimit_decisions_given_back_total",
		"Admitted items of all-or-nothing requests whose tokens went back because another item was denied; they stay counted in fleetlimit_decisions_total.", "limit")
	c.bucketsLost = desc("fleetlimit_buckets_lost_total",
		"Buckets and window arrays found lost in Redis (evicted, flushed, deleted) while this server used them: a bucket came back empty, an array is counted again.", "limit")
	c.held = desc("fleetlimit_lease_tokens_held",
		"Tokens this server holds in leases, over every key.", "limit")
	c.dryRun = desc("fleetlimit_limit_dry_run",
		"1 for a limit that only watches (DryRun): its denials in fleetlimit_decisions_total were admitted.", "limit")
	c.roundTrips = desc("fleetlimit_round_trips_total",
		"Round trips to Redis that carried refills (several refills share one).")
	c.refundCalls = desc("fleetlimit_refund_calls_total",
		"Round trips to Redis that carried refunds.")
	c.heartbeats = desc("fleetlimit_heartbeats_total",
		"Fleet heartbeats attempted.")
	c.servers = desc("fleetlimit_servers",
		"The live fleet size the limits are divided by.")
	c.breakerState = desc("fleetlimit_breaker_state",
		"1 for the Redis breaker's current state, 0 for the others.", "state")
	c.breakerTransitions = desc("fleetlimit_breaker_transitions_total",
		"The Redis breaker's state changes, by the state entered.", "to")
	c.breakerCalls = desc("fleetlimit_breaker_calls_total",
		"Calls through the Redis breaker: answered, failed (timeouts included), refused while open, refused for too many in flight, not counted (the caller's own cancellation).",
		"result")
	return c
}

// Describe sends the descriptions of every metric the Collector exports.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.decisions, c.refills, c.refillErrors, c.granted, c.refunded, c.refundLost, c.bucketsLost, c.givenBack, c.held,
		c.roundTrips, c.refundCalls, c.heartbeats, c.servers,
		c.breakerState, c.breakerTransitions, c.breakerCalls, c.dryRun,
	} {
		ch <- d
	}
}

// Collect reads the Limiter's Stats and sends them as metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.l.Stats()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	for _, ls := range s.Limits {
		for _, d := range ls.Decisions {
			counter(c.decisions, d.Count, ls.Name, strconv.FormatBool(d.Allowed), d.Source.String(), d.Reason.String())
		}
		counter(c.refills, ls.Takes, ls.Name)
		counter(c.refillErrors, ls.RefillErrors, ls.Name)
		counter(c.granted, ls.Granted, ls.Name)
		counter(c.refunded, ls.Refunded, ls.Name)
		counter(c.refundLost, ls.RefundsLost, ls.Name)
		counter(c.bucketsLost, ls.LostBuckets, ls.Name)
		counter(c.givenBack, ls.GivenBack, ls.Name)
		gauge(c.held, ls.Held, ls.Name)
		var dry int64
		if ls.DryRun {
			dry = 1
		}
		gauge(c.dryRun, dry, ls.Name)
	}

	counter(c.roundTrips, s.RoundTrips)
	counter(c.refundCalls, s.RefundCalls)
	counter(c.heartbeats, s.Heartbeats)
	gauge(c.servers, int64(s.Servers))
	for _, st := range []breaker.State{breaker.StateClosed, breaker.StateHalfOpen, breaker.StateOpen} {
		var v int64
		if s.Breaker == st {
			v = 1
		}
		gauge(c.breakerState, v, st.String())
	}
	b := s.BreakerStats
	counter(c.breakerTransitions, b.Closed, breaker.StateClosed.String())
	counter(c.breakerTransitions, b.HalfOpened, breaker.StateHalfOpen.String())
	counter(c.breakerTransitions, b.Opened, breaker.StateOpen.String())
	counter(c.breakerCalls, b.Successes, "success")
	counter(c.breakerCalls, b.Failures, "failure")
	counter(c.breakerCalls, b.Rejected, "rejected")
	counter(c.breakerCalls, b.Overloaded, "overloaded")
	counter(c.breakerCalls, b.Excluded, "excluded")
}
