package sim

import (
	"math"
	"slices"
	"time"
)

// Result is what one run measured. Rates are per second of virtual time; latencies are the
// virtual time from a request's arrival at a server to its decision (network and Redis
// queueing; in-process work takes no virtual time).
type Result struct {
	Scenario   string  `json:"scenario"`
	Strategy   string  `json:"strategy"`
	Policy     string  `json:"policy,omitempty"`
	Servers    int     `json:"servers"`
	LimitPerS  float64 `json:"limit_per_s"`
	Burst      int     `json:"burst"`
	DemandPerS float64 `json:"demand_per_s"`
	Keys       int     `json:"keys"`
	DurationS  float64 `json:"duration_s"`
	// BinS is the width of each Timeline bin, seconds.
	BinS float64 `json:"bin_s"`

	Requests int64 `json:"requests"`
	// Admitted counts admissions decided within the run's window [0, T]: what the protected
	// service received during it. A request still waiting for Redis at T is decided later;
	// if admitted, it counts in AdmittedLate instead.
	Admitted     int64   `json:"admitted"`
	AdmittedLate int64   `json:"admitted_late"`
	AdmittedPerS float64 `json:"admitted_per_s"`
	// AdmittedOverLimit is AdmittedPerS / LimitPerS (for many keys: Admitted / Fair).
	AdmittedOverLimit float64 `json:"admitted_over_limit"`
	// RequestsAdmittedOverLimit counts every admitted request of the run, however late it
	// was decided, over rate·T: the share of the demand let through, in units of the limit.
	RequestsAdmittedOverLimit float64 `json:"requests_admitted_over_limit"`
	// LastDecisionS is when the last request of the run was decided.
	LastDecisionS float64 `json:"last_decision_s"`
	// Bound is burst + rate·T, the most a perfect token bucket admits for one key.
	Bound float64 `json:"bound"`
	// Floor is 90% of rate·T.
	Floor float64 `json:"floor"`
	// Fair is Σ over keys of min(that key's requests, burst + rate·T): what a perfect limiter
	// would admit. AdmittedOverFair = Admitted / Fair. HottestKeyOverBound is the largest
	// admitted / Bound of any one key.
	Fair float64 `json:"fair"`
	// UnderLimitAdmitted is, over the keys whose requests stayed within burst + rate·T (a
	// perfect limiter admits them all), the share of their requests admitted.
	UnderLimitAdmitted  float64 `json:"under_limit_admitted"`
	AdmittedOverFair    float64 `json:"admitted_over_fair"`
	HottestKeyOverBound float64 `json:"hottest_key_over_bound"`

	// Cold is set only by the cold-key scenarios' runs (coldOpts): their extra measures.
	Cold *ColdResult `json:"cold,omitempty"`

	RedisCalls                int64   `json:"redis_calls"`
	RedisRoundTrips           int64   `json:"redis_round_trips"`
	RedisCallsPerRequest      float64 `json:"redis_calls_per_request"`
	RedisRoundTripsPerRequest float64 `json:"redis_round_trips_per_request"`
	// RedisBusy is the share of the run Redis spent executing commands: on a Cluster
	// (Masters > 1), the masters' mean. MasterBusy is each master's share of the run
	// past the fleet's cold start (Scenario.steadyFrom: 1 s, or a quarter of a shorter
	// run), the steady load a Cluster is sized for; MasterRoundTrips the round trips each
	// was sent over the run (a trip split over masters counts once for each).
	RedisBusy        float64   `json:"redis_busy"`
	Masters          int       `json:"masters"`
	MasterBusy       []float64 `json:"master_busy"`
	MasterRoundTrips []int64   `json:"master_round_trips"`
	// PolicyShare is the share of the run's decisions the failure policy made.
	PolicyShare   float64          `json:"policy_share"`
	P50DecisionUS float64          `json:"p50_decision_us"`
	P99DecisionUS float64          `json:"p99_decision_us"`
	MaxDecisionUS float64          `json:"max_decision_us"`
	Sources       map[string]int64 `json:"sources"`
	Timeline      []Bin            `json:"timeline"`
	Outage        *OutageResult    `json:"outage,omitempty"`
	Partition     *OutageResult    `json:"partition,omitempty"` // the partition window, measured as an outage is
	LimitChanges  []ChangeResult   `json:"limit_changes,omitempty"`
	Also          []AlsoResult     `json:"also,omitempty"`
	Starve        *OutageResult    `json:"starve,omitempty"`      // the starvation window, measured as an outage is
	MasterDown    *OutageResult    `json:"master_down,omitempty"` // a master's stop, measured as an outage is
	// GivenBack counts the admitted items of requests of several limits whose tokens
	// went back because another item denied (hybrid only).
	GivenBack          int64   `json:"given_back,omitempty"`
	FastServer         string  `json:"fast_server,omitempty"`
	BreakerTransitions int     `json:"breaker_transitions"`
	Events             uint64  `json:"events"`
	WallMS             float64 `json:"wall_ms"`
}

// Bin is one slice of the timeline.
type Bin struct {
	AtS          float64 `json:"at_s"` // start of the bin, seconds
	AdmittedPerS float64 `json:"admitted_per_s"`
	DemandPerS   float64 `json:"demand_per_s"`
	// Servers is the live fleet size.
	Servers int `json:"servers"`
	// FallbackShare is the share of the bin's decisions that went to the failure policy.
	FallbackShare float64 `json:"fallback_share"`
	// BreakersOpen counts the breakers (one per server, or per server and master on a
	// Cluster) that were not closed at the end of the bin.
	BreakersOpen int `json:"breakers_open"`
}

// OutageResult describes the run during its Redis outage window.
type OutageResult struct {
	StartS        float64 `json:"start_s"`
	EndS          float64 `json:"end_s"`
	Requests      int64   `json:"requests"`
	AdmittedPerS  float64 `json:"admitted_per_s"`
	DemandPerS    float64 `json:"demand_per_s"`
	OverLimit     float64 `json:"admitted_over_limit"` // AdmittedPerS over one key's limit
	P50DecisionUS float64 `json:"p50_decision_us"`
	P99DecisionUS float64 `json:"p99_decision_us"`
	MaxDecisionUS float64 `json:"max_decision_us"`
	// BreakerOpenS is when the breaker of the first server to trip opened, relative to
	// the outage start; BreakerClosedS when the last one closed again after it.
	BreakerOpenS   float64 `json:"breaker_open_after_s"`
	BreakerClosedS float64 `json:"breaker_closed_after_end_s"`
	CallsDuring    int64   `json:"redis_calls_during"`
	// Sources counts the decisions of requests that arrived during the outage, by source
	// and outcome ("fallback+", "paced-", ...).
	Sources map[string]int64 `json:"sources"`
	// PolicyShare is the share of those decisions the failure policy made;
	// MasterPolicyShare, on a Cluster, the same over the keys of each master.
	PolicyShare       float64   `json:"policy_share"`
	MasterPolicyShare []float64 `json:"master_policy_share,omitempty"`
	// BreakerOpens counts the times a breaker of a server the fault acts on (every server
	// in an outage, the cut-off or starved ones) opened, from the window's start to the
	// end of the run. Timeouts counts their calls that timed out over the run, and
	// StarvedTimeouts those of them the breaker saw a whole budget late and did not count
	// towards opening (breaker.Stats.Starved).
	BreakerOpens    int   `json:"breaker_opens"`
	Timeouts        int64 `json:"timeouts"`
	StarvedTimeouts int64 `json:"starved_timeouts"`
	// GrantsUnread is the tokens Redis granted over the run to takes of those servers
	// whose answers came back after the breaker's deadline and were never read (not by
	// their lingering call, nor by a later take under the same number): spent in the
	// bucket, leased to no one. GrantsReadLate is those read by their call after the
	// breaker's deadline (engine.Engine.Late). (The simulator's servers count them where
	// the simulated Redis runs the take; the Limiters of TestSimTracksLimiter do not, and
	// its fleets answer in time.)
	GrantsUnread   int64 `json:"grants_unread"`
	GrantsReadLate int64 `json:"grants_read_late"`
	// AfterPerS is key 0's admissions per second from 0.5 s to 2.5 s after the window:
	// what the fleet admits once Redis answers again (a debt being repaid shows here).
	AfterPerS float64 `json:"after_per_s"`
	// ThroughPerS is the same from the window's start to 2.5 s after its end: what the
	// fault and the recovery from it cost or gave over the limit, debts repaid included.
	ThroughPerS float64 `json:"through_per_s"`
	// LateOverBound is the largest count of key 0's admissions in a window ending 2.5 s
	// or more after the window, over 2·burst + servers·ceil(burst/servers)
	// + rate·W for a window of length W (1 to 6 s); LateW is the W that gave it.
	LateOverBound float64 `json:"late_over_bound"`
	LateW         string  `json:"late_window"`
}

// fault returns the measures of the run's fault window, if it has one, and what the
// fault is called: "outage", "partition", "master's stop" or "starvation".
func (r *Result) fault() (*OutageResult, string) {
	switch {
	case r.Outage != nil:
		return r.Outage, "outage"
	case r.Partition != nil:
		return r.Partition, "partition"
	case r.MasterDown != nil:
		return r.MasterDown, "master's stop"
	case r.Starve != nil:
		return r.Starve, "starvation"
	}
	return nil, ""
}

// binWidth is the timeline's resolution.
const binWidth = 100 * time.Millisecond

// recorder collects a run's measures as decisions happen.
type recorder struct {
	sc      *Scenario
	bins    []binAcc
	lat     []time.Duration
	outLat  []time.Duration
	sources [nSources]int64

	requests, admitted, late int64
	last                     time.Duration
	keyReq, keyAdm           []int64
	keyWait                  []int64                 // decisions that waited (latency > 0), by key; cold runs only
	keyReqLate, keyWaitLate  []int64                 // the same two counts for requests from 1 s on; cold runs only
	keyAt                    map[int][]time.Duration // admission instants of every key; cold runs only
	hotAt                    []time.Duration         // admission instants of key 0, in runs with LimitChanges
	outReq, outAdm           int64
	outSources               [nSources][2]int64 // [source][allowed]
	// keyMaster is the master of each key's bucket (a windowed limit's key: of its
	// shard), on a Cluster; outMaster counts the decisions of the fault window's requests
	// by their key's master: [decided, policy].
	keyMaster []uint8
	outMaster [][2]int64
}

type binAcc struct {
	admitted, demand, fallback, decided int64
	servers                             int
}

func newRecorder(sc *Scenario) *recorder {
	n := int(sc.Duration/binWidth) + 1
	r := &recorder{
		sc:     sc,
		bins:   make([]binAcc, n),
		lat:    make([]time.Duration, 0, int(sc.Demand*sc.Duration.Seconds())+16),
		keyReq: make([]int64, sc.Keys),
		keyAdm: make([]int64, sc.Keys),
	}
	if sc.cold.on {
		r.keyWait = make([]int64, sc.Keys)
		r.keyReqLate, r.keyWaitLate = make([]int64, sc.Keys), make([]int64, sc.Keys)
		r.keyAt = make(map[int][]time.Duration)
	}
	return r
}

func (r *recorder) bin(t time.Duration) *binAcc {
	i := int(t / binWidth)
	if i >= len(r.bins) {
		return nil
	}
	return &r.bins[i]
}

func (r *recorder) arrive(q *request) {
	r.requests++
	r.keyReq[q.key]++
	if b := r.bin(q.arrive); b != nil {
		b.demand++
	}
	if r.sc.measured().Contains(q.arrive) {
		r.outReq++
	}
}

// decide records the decision of q at virtual instant now, made by source.
func (r *recorder) decide(q *request, now time.Duration, allowed bool, src source) {
	r.sources[src]++
	r.last = max(r.last, now)
	lat := now - q.arrive
	r.lat = append(r.lat, lat)
	if r.keyWait != nil {
		r.coldDecide(q, now, lat, allowed)
	}
	inOutage := r.sc.measured().Contains(q.arrive)
	if inOutage {
		r.outLat = append(r.outLat, lat)
		a := 0
		if allowed {
			a = 1
		}
		r.outSources[src][a]++
		if r.keyMaster != nil {
			c := &r.outMaster[r.keyMaster[q.key]]
			c[0]++
			if src == srcFallback {
				c[1]++
			}
		}
	}
	b := r.bin(now)
	if b != nil {
		b.decided++
		if src == srcFallback {
			b.fallback++
		}
	}
	if !allowed {
		return
	}
	if now > r.sc.Duration {
		r.late++
		return
	}
	r.admitted++
	r.keyAdm[q.key]++
	if q.key == 0 && (len(r.sc.LimitChanges) > 0 || r.sc.measured().End > 0) {
		r.hotAt = append(r.hotAt, now)
	}
	if b != nil {
		b.admitted++
	}
	if inOutage {
		r.outAdm++
	}
}

// percentile returns the p-quantile of sorted, in microseconds: the value of rank p·n
// rounded to the nearest integer (at least 1), where the nearest-rank method rounds it
// up; for the p99 of n samples that is one rank lower when n mod 100 is over 50.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	i = min(max(i, 0), len(sorted)-1)
	return float64(sorted[i]) / float64(time.Microsecond)
}

func (r *recorder) result(st Strategy) Result {
	sc := r.sc
	T := sc.Duration.Seconds()
	res := Result{
		Scenario: sc.Name, Strategy: string(st), Servers: sc.Servers,
		LimitPerS: sc.Rate, Burst: sc.Burst, DemandPerS: sc.Demand, Keys: sc.Keys, DurationS: T, BinS: binWidth.Seconds(),
		Requests: r.requests, Admitted: r.admitted, AdmittedLate: r.late,
		Bound: sc.bound(), Floor: 0.9 * sc.Rate * T,
		Sources: map[string]int64{},
	}
	var decided int64
	for src, n := range r.sources {
		if n > 0 {
			res.Sources[source(src).String()] = n
		}
		decided += n
	}
	if decided > 0 {
		res.PolicyShare = float64(r.sources[srcFallback]) / float64(decided)
	}
	if st == Hybrid || st == HybridAsync || st == HybridWindow {
		res.Policy = string(sc.Policy)
	}
	res.AdmittedPerS = float64(r.admitted) / T
	res.RequestsAdmittedOverLimit = float64(r.admitted+r.late) / (sc.Rate * T)
	res.LastDecisionS = r.last.Seconds()
	var fair, underReq, underAdm float64
	for k := range r.keyReq {
		if float64(r.keyReq[k]) <= sc.bound() {
			underReq += float64(r.keyReq[k])
			underAdm += float64(r.keyAdm[k])
		}
		fair += min(float64(r.keyReq[k]), sc.bound())
		res.HottestKeyOverBound = max(res.HottestKeyOverBound, float64(r.keyAdm[k])/sc.bound())
	}
	res.Fair = fair
	if underReq > 0 {
		res.UnderLimitAdmitted = underAdm / underReq
	}
	if fair > 0 {
		res.AdmittedOverFair = float64(r.admitted) / fair
	}
	if r.keyWait != nil {
		res.Cold = r.coldResult()
	}
	res.LimitChanges = r.changeResults()
	res.Also = r.alsoResults()
	if sc.Keys == 1 {
		res.AdmittedOverLimit = res.AdmittedPerS / sc.Rate
	} else {
		res.AdmittedOverLimit = res.AdmittedOverFair
	}
	slices.Sort(r.lat)
	res.P50DecisionUS = percentile(r.lat, 0.50)
	res.P99DecisionUS = percentile(r.lat, 0.99)
	res.MaxDecisionUS = percentile(r.lat, 1)
	sec := binWidth.Seconds()
	for i, b := range r.bins[:len(r.bins)-1] {
		bin := Bin{AtS: math.Round(float64(i)*sec*1000) / 1000, AdmittedPerS: float64(b.admitted) / sec, DemandPerS: float64(b.demand) / sec, Servers: b.servers}
		if b.decided > 0 {
			bin.FallbackShare = float64(b.fallback) / float64(b.decided)
		}
		res.Timeline = append(res.Timeline, bin)
	}
	if w := sc.measured(); w.End > w.Start {
		slices.Sort(r.outLat)
		d := (w.End - w.Start).Seconds()
		u := &OutageResult{
			StartS: w.Start.Seconds(), EndS: w.End.Seconds(), Requests: r.outReq,
			AdmittedPerS: float64(r.outAdm) / d, DemandPerS: float64(r.outReq) / d,
			P50DecisionUS: percentile(r.outLat, 0.5), P99DecisionUS: percentile(r.outLat, 0.99),
			MaxDecisionUS: percentile(r.outLat, 1), Sources: map[string]int64{},
		}
		for src, n := range r.outSources {
			for a, sign := range []string{"-", "+"} {
				if n[a] > 0 {
					u.Sources[source(src).String()+sign] = n[a]
				}
			}
		}
		var all, policy int64
		for src, n := range r.outSources {
			all += n[0] + n[1]
			if source(src) == srcFallback {
				policy += n[0] + n[1]
			}
		}
		if all > 0 {
			u.PolicyShare = float64(policy) / float64(all)
		}
		for _, c := range r.outMaster {
			u.MasterPolicyShare = append(u.MasterPolicyShare, float64(c[1])/float64(max(c[0], 1)))
		}
		u.OverLimit = u.AdmittedPerS / sc.Rate
		u.AfterPerS = r.hotRate(w.End+500*time.Millisecond, min(w.End+2500*time.Millisecond, sc.Duration))
		u.ThroughPerS = r.hotRate(w.Start, min(w.End+2500*time.Millisecond, sc.Duration))
		u.LateOverBound, u.LateW = r.lateOverBound(w.End + 2500*time.Millisecond)
		switch w {
		case sc.Outage:
			res.Outage = u
		case sc.Partition:
			res.Partition = u
		case sc.MasterDown:
			res.MasterDown = u
		default:
			res.Starve = u
		}
	}
	return res
}
