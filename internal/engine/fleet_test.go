package engine

import (
	"cmp"
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/luamodel"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// This file is a small deterministic model of a fleet in virtual time: many servers, each
// with a Lease for one key, sharing one global bucket (the Go model of the take and refund
// scripts), over a network with latency. It checks the accuracy bound, the floor and
// the Redis-call savings of the lease rules without Redis; sim/ does the same with the
// real scripts.

// modelBucket is the global bucket of a fleet model: luascript.Take and luascript.Refund on the Go model
// of the scripts (internal/luamodel, held to the Lua by its differential tests), on one key.
type modelBucket struct {
	m              *luamodel.Model
	capacity, rate float64
	seq            uint64
}

const bucketKey = "fl:{model:k}"

func newBucket(capacity int, rate float64) *modelBucket {
	return &modelBucket{m: luamodel.New(), capacity: float64(capacity), rate: rate}
}

func (b *modelBucket) take(now time.Time, want, minimum int) Grant {
	b.seq++
	r := b.m.Take(now, bucketKey, b.capacity, b.rate, want, minimum, "s", b.seq, 0, 0, wire.Seen{})
	return Grant{Granted: r.Granted, Remaining: r.Tokens, Wait: tokenbucket.FromMillis(float64(r.WaitMS))}
}

func (b *modelBucket) refund(now time.Time, n int) {
	if n > 0 {
		b.seq++
		b.m.Refund(now, bucketKey, b.capacity, b.rate, n, "s", b.seq, 0, int(b.capacity), math.NaN())
	}
}

type evKind uint8

const (
	evArrive evKind = iota // a request reaches a server
	evTake                 // a refill reaches the bucket
	evGrant                // its answer reaches the server
	evRefund               // a refund reaches the bucket
	evSample               // snapshot of tokens out of the bucket
)

type event struct {
	at     time.Time
	order  int
	kind   evKind
	server int
	refill Refill
	grant  Grant
	n      int
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].order < q[j].order
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// fleetModel is one run's configuration.
type fleetModel struct {
	servers  int
	rate     float64 // fleet limit, tokens/s
	burst    int
	demand   float64 // requests/s over the whole fleet, cost 1, Poisson
	duration time.Duration
	warmUp   time.Duration // admissions before this are left out of the floor
	oneWay   time.Duration // network latency each way (plus up to 50% jitter)
	deadline time.Duration // how long a request waits for a refill before it is denied
	seed     uint64
	noPacing bool
	active   int // requests land on the first active servers only (0: all of them)
}

type modelResult struct {
	requests, admitted, timeouts int
	takes, refunds               int     // Redis calls
	admits                       []int64 // admission instants, ns since start
	takeAt                       []int64 // instants the bucket ran a take, ns since start
	denials                      []denial
	samples                      []sample
}

// denial is a request denied by its server's lease: at, ns since start; the retry-after
// it carried.
type denial struct {
	at    int64
	retry time.Duration
}

type sample struct {
	at  int64 // ns since start
	out int   // tokens withdrawn from the bucket and neither consumed nor back: the L of the bound
}

func (r modelResult) callsPerRequest() float64 {
	return float64(r.takes+r.refunds) / float64(r.requests)
}

func (m fleetModel) run() modelResult {
	r := rand.New(rand.NewPCG(m.seed, 1))
	cfg, err := LeaseConfig{Rate: m.rate, Burst: m.burst, Servers: m.servers, noPacing: m.noPacing}.Normalize()
	if err != nil {
		panic(err)
	}
	start := t0
	end := start.Add(m.duration)
	bucket := newBucket(m.burst, m.rate)
	type waiter struct{ deadline time.Time }
	leases := make([]Lease, m.servers)
	waiting := make([][]waiter, m.servers)
	for i := range leases {
		leases[i] = NewLease(m.seed*1000 + uint64(i))
	}
	var q eventQueue
	order := 0
	push := func(e event) {
		order++
		e.order = order
		heap.Push(&q, e)
	}
	lat := func() time.Duration {
		return m.oneWay + time.Duration(r.Float64()*0.5*float64(m.oneWay))
	}
	var res modelResult
	out := 0 // tokens out of the bucket: held, in transit to a server, or being refunded
	admit := func(now time.Time) {
		res.admitted++
		out--
		res.admits = append(res.admits, now.Sub(start).Nanoseconds())
	}
	follow := func(s int, now time.Time, st Step) {
		if st.Refund > 0 {
			res.refunds++
			push(event{at: now.Add(lat()), kind: evRefund, n: st.Refund})
		}
		if st.Refill.Want > 0 {
			push(event{at: now.Add(lat()), kind: evTake, server: s, refill: st.Refill})
		}
	}
	push(event{at: start, kind: evArrive})
	push(event{at: start, kind: evSample})
	for q.Len() > 0 {
		e := heap.Pop(&q).(event)
		now := e.at
		if now.After(end) {
			break
		}
		switch e.kind {
		case evArrive:
			push(event{at: now.Add(time.Duration(r.ExpFloat64() / m.demand * float64(time.Second))), kind: evArrive})
			s := r.IntN(cmp.Or(m.active, m.servers))
			res.requests++
			st := leases[s].Acquire(&cfg, now, 1)
			follow(s, now, st)
			switch st.Action {
			case Allow:
				admit(now)
			case Wait:
				waiting[s] = append(waiting[s], waiter{deadline: now.Add(m.deadline)})
			case Deny:
				res.denials = append(res.denials, denial{now.Sub(start).Nanoseconds(), st.RetryAfter})
			}
		case evTake:
			res.takes++
			res.takeAt = append(res.takeAt, now.Sub(start).Nanoseconds())
			g := bucket.take(now, e.refill.Want, e.refill.Min)
			out += g.Granted
			push(event{at: now.Add(lat()), kind: evGrant, server: e.server, refill: e.refill, grant: g})
		case evGrant:
			s := e.server
			if n := leases[s].Granted(&cfg, now, e.refill.Seq, e.grant); n > 0 {
				res.refunds++
				push(event{at: now.Add(lat()), kind: evRefund, n: n})
			}
			still := waiting[s][:0]
			for _, w := range waiting[s] {
				if now.After(w.deadline) {
					res.timeouts++
					continue
				}
				st := leases[s].Recheck(&cfg, now, 1)
				follow(s, now, st)
				switch st.Action {
				case Allow:
					admit(now)
				case Wait:
					still = append(still, w)
				}
			}
			waiting[s] = still
		case evRefund:
			bucket.refund(now, e.n)
			out -= e.n
		case evSample:
			res.samples = append(res.samples, sample{at: now.Sub(start).Nanoseconds(), out: out})
			push(event{at: now.Add(10 * time.Millisecond), kind: evSample})
		}
	}
	return res
}

// maxOverBound returns, over every sampled window start t and each length T, the largest
// admitted(t, t+T) − (burst + rate·T + L(t)); it must not be positive. It also returns the
// largest L seen.
func (m fleetModel) maxOverBound(res modelResult, lengths []time.Duration) (worst float64, maxL int) {
	worst = math.Inf(-1)
	for _, T := range lengths {
		j0, j1 := 0, 0
		for _, s := range res.samples {
			if s.at+T.Nanoseconds() > m.duration.Nanoseconds() {
				break
			}
			for j0 < len(res.admits) && res.admits[j0] < s.at {
				j0++
			}
			for j1 < len(res.admits) && res.admits[j1] < s.at+T.Nanoseconds() {
				j1++
			}
			over := float64(j1-j0) - (float64(m.burst) + m.rate*T.Seconds() + float64(s.out))
			worst = math.Max(worst, over)
			maxL = max(maxL, s.out)
		}
	}
	return worst, maxL
}

// admittedBetween counts admissions in [from, to).
func (res modelResult) admittedBetween(from, to time.Duration) int {
	n := 0
	for _, a := range res.admits {
		if a >= from.Nanoseconds() && a < to.Nanoseconds() {
			n++
		}
	}
	return n
}

func TestFleetModel(t *testing.T) {
	long, longer := 3*time.Second, 12*time.Second
	if testing.Short() {
		long, longer = 1500*ms, 8*time.Second
	}
	tests := []struct {
		name string
		m    fleetModel
		// maxCalls is a ceiling on Redis calls per request (takes + refunds).
		maxCalls float64
		// floor is the least share of rate·T admitted after warm-up when demand > rate;
		// for demand below the rate, the least share of requests admitted.
		floor float64
	}{
		{"200 servers, hot key at 1.5x of 100k/s", fleetModel{servers: 200, rate: 100_000, burst: 10_000,
			demand: 150_000, duration: long, oneWay: 250 * time.Microsecond, deadline: 10 * ms, seed: 1}, 0.05, 0.9},
		{"200 servers, abusive client at 100x of 100/s", fleetModel{servers: 200, rate: 100, burst: 100,
			demand: 10_000, duration: longer, warmUp: 4 * time.Second, oneWay: 250 * time.Microsecond, deadline: 10 * ms, seed: 2}, 0.05, 0.9},
		{"8 servers, 50x of 200/s", fleetModel{servers: 8, rate: 200, burst: 50,
			demand: 10_000, duration: long, oneWay: 250 * time.Microsecond, deadline: 10 * ms, seed: 3}, 0.05, 0.9},
		{"200 servers, demand at half the limit", fleetModel{servers: 200, rate: 100_000, burst: 10_000,
			demand: 50_000, duration: long, oneWay: 250 * time.Microsecond, deadline: 10 * ms, seed: 4}, 0.2, 0.99},
		// Pacing assumes every live server wants the key. A client held on one server (a
		// keep-alive connection) leases one token per refill (burst 20 over 200 servers)
		// and is paced until the bucket is full again, ±50%: before waits past full were
		// folded back (Lease.Granted), it got 86.4% of rate·T; now 100%.
		{"200 servers, one sticky client at 100x of 10/s on one server", fleetModel{servers: 200, active: 1, rate: 10, burst: 20,
			demand: 1000, duration: longer, warmUp: 2 * time.Second, oneWay: 250 * time.Microsecond, deadline: 10 * ms, seed: 7}, 0.05, 0.9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.m
			res := m.run()
			worst, maxL := m.maxOverBound(res, []time.Duration{10 * ms, 100 * ms, time.Second})
			capL := m.burst
			if m.burst/m.servers < 1 {
				capL = m.servers // one cost per server
			}
			warm := cmp.Or(m.warmUp, 500*ms) // pacing intervals of 2s (1 token x 200 servers / 100/s) need longer
			steady := m.duration - warm
			got := res.admittedBetween(warm, m.duration)
			t.Logf("requests %d admitted %d (%.1f%% of rate·T after warm-up) timeouts %d; Redis calls/request %.4f (%.0fx fewer than one script per request), takes %d refunds %d; max L %d (cap %d); worst admitted − bound %.1f",
				res.requests, res.admitted, 100*float64(got)/(m.rate*steady.Seconds()), res.timeouts, res.callsPerRequest(),
				1/res.callsPerRequest(), res.takes, res.refunds, maxL, capL, worst)
			if worst > 0 {
				t.Errorf("a window admitted %.1f over burst + rate·T + L", worst)
			}
			if maxL > capL {
				t.Errorf("leases held %d tokens, more than the cap %d", maxL, capL)
			}
			if c := res.callsPerRequest(); c > tt.maxCalls {
				t.Errorf("%.4f Redis calls per request, want at most %.3f", c, tt.maxCalls)
			}
			if m.demand > m.rate {
				if share := float64(got) / (m.rate * steady.Seconds()); share < tt.floor {
					t.Errorf("admitted %.3f of rate·T after warm-up, want at least %.2f", share, tt.floor)
				}
			} else if share := float64(res.admitted) / float64(res.requests); share < tt.floor {
				t.Errorf("admitted %.3f of requests below the limit, want at least %.2f", share, tt.floor)
			}
		})
	}
}

// TestFleetModelPacing shows what the pacing rule saves: the same fleets with it, and with
// the plain rule it replaces (after a grant of 0, ask again once the bucket's wait for min
// has passed; no pacing after partial grants). Without pacing, when demand exceeds the
// limit every refill finds only the few tokens refilled since the last one, and the
// servers told the same wait ask again together; the bound still holds, the savings vanish.
func TestFleetModelPacing(t *testing.T) {
	d := 2 * time.Second
	if testing.Short() {
		d = time.Second
	}
	for _, m := range []fleetModel{
		{servers: 200, rate: 100_000, burst: 10_000, demand: 150_000, duration: d, oneWay: 250 * time.Microsecond, deadline: 10 * ms, seed: 5},
		{servers: 200, rate: 100, burst: 100, demand: 10_000, duration: 4 * d, oneWay: 250 * time.Microsecond, deadline: 10 * ms, seed: 6},
	} {
		paced := m.run()
		m.noPacing = true
		unpaced := m.run()
		worst, _ := m.maxOverBound(unpaced, []time.Duration{10 * ms, 100 * ms, time.Second})
		t.Logf("%d servers, limit %v/s burst %d, demand %v/s: Redis calls per request %.4f with pacing, %.4f without (%.1fx); admitted %d vs %d",
			m.servers, m.rate, m.burst, m.demand, paced.callsPerRequest(), unpaced.callsPerRequest(),
			unpaced.callsPerRequest()/paced.callsPerRequest(), paced.admitted, unpaced.admitted)
		if worst > 0 {
			t.Errorf("without pacing a window admitted %.1f over the bound", worst)
		}
		if paced.callsPerRequest()*3 > unpaced.callsPerRequest() {
			t.Errorf("pacing saved less than 3x: %.4f vs %.4f calls per request", paced.callsPerRequest(), unpaced.callsPerRequest())
		}
	}
}

// TestOneServerPacesByTheRefillInterval: one server far over its limit (100/s, burst
// 200, demand 100 × the limit). Pacing waits for a whole round, and one server's round is
// the whole burst: 2 s of refill. The server must instead ask about once a refill
// interval and admit what refilled since: after the first burst, the median Retry-After
// is at most 2 × RefillInterval, no gap between admissions is longer, and the server
// asks the bucket at most 1 / RefillInterval times a second.
func TestOneServerPacesByTheRefillInterval(t *testing.T) {
	m := fleetModel{servers: 1, rate: 100, burst: 200, demand: 10_000, duration: 5 * time.Second,
		oneWay: 250 * time.Microsecond, deadline: 10 * ms, seed: 8}
	res := m.run()
	bound := 2 * DefaultRefillInterval
	// The first burst ends at the first denial.
	if len(res.denials) == 0 {
		t.Fatal("no request was denied: demand is not over the limit")
	}
	after := res.denials[0].at
	retries := make([]time.Duration, 0, len(res.denials))
	for _, d := range res.denials {
		retries = append(retries, d.retry)
	}
	slices.Sort(retries)
	median, p90 := retries[len(retries)/2], retries[len(retries)*9/10]
	var gap int64
	for i := 1; i < len(res.admits); i++ {
		if res.admits[i] > after {
			gap = max(gap, res.admits[i]-max(res.admits[i-1], after))
		}
	}
	takes := 0
	for _, at := range res.takeAt {
		if at > after {
			takes++
		}
	}
	window := time.Duration(m.duration.Nanoseconds() - after)
	perSecond := float64(takes) / window.Seconds()
	steady := res.admittedBetween(time.Duration(after), m.duration)
	t.Logf("first burst over at %v; then Retry-After p50 %v p90 %v, longest gap between admissions %v, %.1f takes/s, admitted %d (%.1f%% of rate·T); %d requests, calls/request %.5f",
		time.Duration(after), median, p90, time.Duration(gap), perSecond, steady, 100*float64(steady)/(m.rate*window.Seconds()), res.requests, res.callsPerRequest())
	if median > bound {
		t.Errorf("median Retry-After %v, want at most %v", median, bound)
	}
	if time.Duration(gap) > bound {
		t.Errorf("a gap of %v between admissions, want at most %v", time.Duration(gap), bound)
	}
	if limit := 1 / DefaultRefillInterval.Seconds(); perSecond > limit {
		t.Errorf("%.2f takes a second, want at most %.0f", perSecond, limit)
	}
	if share := float64(steady) / (m.rate * window.Seconds()); share < 0.9 {
		t.Errorf("admitted %.3f of rate·T after the first burst, want at least 0.9", share)
	}
}
