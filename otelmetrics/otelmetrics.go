// Package otelmetrics exports the counters of a hybrid.Limiter as OpenTelemetry
// observable instruments.
//
// Register creates the instruments on a metric.Meter with one callback that reads
// Limiter.Stats when the SDK collects, and at no other time: nothing is added to the
// path a request takes. The instruments are those of docs/metrics.md in the fleetlimit
// repository, named as there less the "_total" of counters, which OpenTelemetry's
// Prometheus exporter adds back: the counter fleetlimit_decisions is scraped as
// fleetlimit_decisions_total. Counters are Int64ObservableCounters, the tokens held an
// Int64ObservableUpDownCounter (a sum over keys and servers), and the fleet size and the
// breaker's state Int64ObservableGauges. No attribute carries a client key.
//
//	reg, err := otelmetrics.Register(limiter, otel.Meter("api-server"))
//	...
//	defer reg.Unregister()
//
// A process that runs several Limiters registers each with an attribute that tells them
// apart: otelmetrics.WithAttributes(attribute.String("limiter", "api")).
package otelmetrics

import (
	"context"
	"errors"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// An Option configures Register.
type Option interface {
	apply(*config)
}

type config struct {
	attrs []attribute.KeyValue
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithAttributes adds attributes with fixed values to every measurement, such as
// limiter="api" for a process that runs more than one Limiter. An attribute named like
// one the instruments set themselves (limit, allowed, source, reason, state, to,
// result) is overridden by it.
func WithAttributes(kv ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) { c.attrs = append(c.attrs, kv...) })
}

// Register creates the instruments on m and a callback that observes l's Stats. The
// Registration it returns unregisters the callback: call Unregister when l is closed
// and its counters are no longer wanted. If the Meter refuses an instrument, Register
// registers no callback and returns the Meter's errors.
func Register(l *hybrid.Limiter, m metric.Meter, opts ...Option) (metric.Registration, error) {
	var cfg config
	for _, o := range opts {
		o.apply(&cfg)
	}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	decisions := counter("fleetlimit_decisions", "{decision}",
		"Decisions, by limit, outcome, the tier that decided (pre-check, lease, global, fallback) and why.")
	refills := counter("fleetlimit_refills", "{refill}",
		"Refills sent to Redis.")
	refillErrors := counter("fleetlimit_refill_errors", "{refill}",
		"Refills that failed (breaker open, timeout, Redis error): their requests went to the limit's policy.")
	granted := counter("fleetlimit_tokens_granted", "{token}",
		"Tokens leased from the global buckets.")
	refunded := counter("fleetlimit_tokens_refunded", "{token}",
		"Leased tokens given back.")
	refundLost := counter("fleetlimit_tokens_refund_lost", "{token}",
		"Leased tokens whose refund failed: they stay spent, the fleet admits less.")
	givenBack := counter("fleetlimit_decisions_given_back", "{decision}",
		"Admitted items of all-or-nothing requests whose tokens went back because another item was denied; they stay counted in fleetlimit_decisions.")
	bucketsLost := counter("fleetlimit_buckets_lost", "{bucket}",
		"Buckets and window arrays found lost in Redis (evicted, flushed, deleted) while this server used them: a bucket came back empty, an array is counted again.")
	held, err := m.Int64ObservableUpDownCounter("fleetlimit_lease_tokens_held", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens this server holds in leases, over every key."))
	errs = append(errs, err)
	roundTrips := counter("fleetlimit_round_trips", "{round_trip}",
		"Round trips to Redis that carried refills (several refills share one).")
	refundCalls := counter("fleetlimit_refund_calls", "{round_trip}",
		"Round trips to Redis that carried refunds.")
	heartbeats := counter("fleetlimit_heartbeats", "{heartbeat}",
		"Fleet heartbeats attempted.")
	servers := gauge("fleetlimit_servers", "{server}",
		"The live fleet size the limits are divided by.")
	dryRun := gauge("fleetlimit_limit_dry_run", "",
		"1 for a limit that only watches (DryRun): its denials in fleetlimit_decisions were admitted.")
	breakerState := gauge("fleetlimit_breaker_state", "",
		"1 for the Redis breaker's current state, 0 for the others.")
	breakerTransitions := counter("fleetlimit_breaker_transitions", "{transition}",
		"The Redis breaker's state changes, by the state entered.")
	breakerCalls := counter("fleetlimit_breaker_calls", "{call}",
		"Calls through the Redis breaker: answered, failed (timeouts included), refused while open, refused for too many in flight, not counted (the caller's own cancellation).")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	with := func(kv ...attribute.KeyValue) metric.ObserveOption {
		return metric.WithAttributeSet(attribute.NewSet(append(slices.Clone(cfg.attrs), kv...)...))
	}
	total := with()
	states := []breaker.State{breaker.StateClosed, breaker.StateHalfOpen, breaker.StateOpen}
	var stateIs, enteredIs [3]metric.ObserveOption
	for i, st := range states {
		stateIs[i] = with(attribute.String("state", st.String()))
		enteredIs[i] = with(attribute.String("to", st.String()))
	}
	result := func(r string) metric.ObserveOption { return with(attribute.String("result", r)) }
	success, failure, rejected, overloaded, excluded := result("success"), result("failure"), result("rejected"), result("overloaded"), result("excluded")

	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := l.Stats()
		for _, ls := range s.Limits {
			limit := attribute.String("limit", ls.Name)
			for _, d := range ls.Decisions {
				o.ObserveInt64(decisions, d.Count, with(limit, attribute.Bool("allowed", d.Allowed),
					attribute.String("source", d.Source.String()), attribute.String("reason", d.Reason.String())))
			}
			byLimit := with(limit)
			o.ObserveInt64(refills, ls.Takes, byLimit)
			o.ObserveInt64(refillErrors, ls.RefillErrors, byLimit)
			o.ObserveInt64(granted, ls.Granted, byLimit)
			o.ObserveInt64(refunded, ls.Refunded, byLimit)
			o.ObserveInt64(refundLost, ls.RefundsLost, byLimit)
			o.ObserveInt64(bucketsLost, ls.LostBuckets, byLimit)
			o.ObserveInt64(givenBack, ls.GivenBack, byLimit)
			o.ObserveInt64(held, ls.Held, byLimit)
			var dry int64
			if ls.DryRun {
				dry = 1
			}
			o.ObserveInt64(dryRun, dry, byLimit)
		}
		o.ObserveInt64(roundTrips, s.RoundTrips, total)
		o.ObserveInt64(refundCalls, s.RefundCalls, total)
		o.ObserveInt64(heartbeats, s.Heartbeats, total)
		o.ObserveInt64(servers, int64(s.Servers), total)
		for i, st := range states {
			var v int64
			if s.Breaker == st {
				v = 1
			}
			o.ObserveInt64(breakerState, v, stateIs[i])
		}
		b := s.BreakerStats
		o.ObserveInt64(breakerTransitions, b.Closed, enteredIs[0])
		o.ObserveInt64(breakerTransitions, b.HalfOpened, enteredIs[1])
		o.ObserveInt64(breakerTransitions, b.Opened, enteredIs[2])
		o.ObserveInt64(breakerCalls, b.Successes, success)
		o.ObserveInt64(breakerCalls, b.Failures, failure)
		o.ObserveInt64(breakerCalls, b.Rejected, rejected)
		o.ObserveInt64(breakerCalls, b.Overloaded, overloaded)
		o.ObserveInt64(breakerCalls, b.Excluded, excluded)
		return nil
	}, decisions, refills, refillErrors, granted, refunded, refundLost, bucketsLost, givenBack, held, dryRun,
		roundTrips, refundCalls, heartbeats, servers, breakerState, breakerTransitions, breakerCalls)
}
