package sim

import (
	"slices"
	"time"
)

// coldOpts are a scenario's options for the cold-key scenarios: per-client keys, where a
// lease holds about one token (cold_test.go).
type coldOpts struct {
	// on records what only the cold-key scenarios measure (ColdResult).
	on bool
	// abuse adds one key (the last, index Keys-1) with steady demand of abuse requests/s
	// on top of Demand, from abuseAt on; the Zipf spread covers the other keys.
	abuse   float64
	abuseAt time.Duration
	// abuseServers, if set, sends the abusive key's requests to that many servers only
	// (the first live ones), as a client holding a few dozen connections does.
	abuseServers int
}

func (o coldOpts) abuseKeys() int {
	if o.abuse > 0 {
		return 1
	}
	return 0
}

// ColdResult is what only the cold-key scenarios measure.
type ColdResult struct {
	// UnderLimitWaited is the share of the requests of keys within their limit (requests
	// ≤ burst + rate·T) decided after waiting for Redis; UnderLimitWaitedAfter1s the same
	// over the requests that arrived 1 s into the run or later, past the fleet's start.
	UnderLimitWaited        float64 `json:"under_limit_waited"`
	UnderLimitWaitedAfter1s float64 `json:"under_limit_waited_after_1s"`
	// OverLimitAdmitted is, over the Zipf keys that asked more than burst + rate·T, their
	// admissions decided within the run over burst + rate·T each: what a key over its
	// limit gets of it (a limit honoured from below as well as from above).
	OverLimitAdmitted float64 `json:"over_limit_admitted"`
	// HotWorst and AbuseWorst are, for the hottest Zipf key and the abusive key, the
	// largest admissions in any window of length W over 2·burst + rate·W, W in
	// coldWindows; HotWorstW and AbuseWorstW the W that gave it.
	HotWorst    float64       `json:"hot_worst"`
	HotWorstW   time.Duration `json:"hot_worst_w"`
	AbuseWorst  float64       `json:"abuse_worst,omitempty"`
	AbuseWorstW time.Duration `json:"abuse_worst_w,omitempty"`
	// AbuseOverBound is the abusive key's admissions over burst + rate·T.
	AbuseOverBound float64 `json:"abuse_over_bound,omitempty"`
	// AbuseWorstAsync is AbuseWorst over the bound of a limit with Async,
	// 2·burst + rate·W + S·c (S servers, c = max(1, ceil(burst/S))): the largest over
	// every W, which may be another W than AbuseWorstW.
	AbuseWorstAsync float64 `json:"abuse_worst_async,omitempty"`
	// AnyWorst and AnyWorstAsync are the same over every key: the largest admissions of
	// any key in any window over 2·burst + rate·W, and over 2·burst + rate·W + S·c.
	AnyWorst      float64       `json:"any_worst"`
	AnyWorstW     time.Duration `json:"any_worst_w"`
	AnyWorstAsync float64       `json:"any_worst_async"`
	// AnyWorstAfter1s is AnyWorst over the windows that start 1 s into the run or later:
	// past the fleet's cold start.
	AnyWorstAfter1s float64 `json:"any_worst_after_1s"`
}

// coldWindows are the window lengths over which the keys' admissions are checked.
var coldWindows = []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second}

func (r *recorder) coldDecide(q *request, now, lat time.Duration, allowed bool) {
	if lat > 0 {
		r.keyWait[q.key]++
	}
	if now-lat >= time.Second {
		r.keyReqLate[q.key]++
		if lat > 0 {
			r.keyWaitLate[q.key]++
		}
	}
	if allowed && now <= r.sc.Duration {
		r.keyAt[q.key] = append(r.keyAt[q.key], now)
	}
}

// worstWindow returns the largest count of ats in a window of length w over
// 2·burst + rate·w + extra, for w in coldWindows, and the w.
func (r *recorder) worstWindow(ats []time.Duration, extra float64) (float64, time.Duration) {
	return r.worstWindowFrom(ats, extra, 0)
}

// worstWindowFrom is worstWindow over the windows that start at from or later.
func (r *recorder) worstWindowFrom(ats []time.Duration, extra float64, from time.Duration) (float64, time.Duration) {
	slices.Sort(ats)
	var worst float64
	var at time.Duration
	for _, w := range coldWindows {
		n := 0
		eachWindow(ats, w, func(start time.Duration, k int) {
			if start >= from {
				n = max(n, k)
			}
		})
		if x := float64(n) / (2*float64(r.sc.Burst) + r.sc.Rate*w.Seconds() + extra); x > worst {
			worst, at = x, w
		}
	}
	return worst, at
}

// asyncExtra is what a limit with Async may admit over 2·burst + rate·W: one share of
// the burst per server, max(1, ceil(burst/S)) each.
func (r *recorder) asyncExtra() float64 {
	s := r.sc.Servers
	return float64(s * max(1, (r.sc.Burst+s-1)/s))
}

func (r *recorder) coldResult() *ColdResult {
	c := &ColdResult{}
	var req, wait, reqLate, waitLate float64
	for k := range r.keyReq {
		if float64(r.keyReq[k]) <= r.sc.bound() {
			req += float64(r.keyReq[k])
			wait += float64(r.keyWait[k])
			reqLate += float64(r.keyReqLate[k])
			waitLate += float64(r.keyWaitLate[k])
		}
	}
	if req > 0 {
		c.UnderLimitWaited = wait / req
	}
	var adm, due float64
	for k := range r.sc.Keys - r.sc.cold.abuseKeys() {
		if float64(r.keyReq[k]) > r.sc.bound() {
			adm += float64(r.keyAdm[k])
			due += r.sc.bound()
		}
	}
	if due > 0 {
		c.OverLimitAdmitted = adm / due
	}
	if reqLate > 0 {
		c.UnderLimitWaitedAfter1s = waitLate / reqLate
	}
	c.HotWorst, c.HotWorstW = r.worstWindow(r.keyAt[0], 0)
	for _, ats := range r.keyAt {
		if w, at := r.worstWindow(ats, 0); w > c.AnyWorst {
			c.AnyWorst, c.AnyWorstW = w, at
		}
		w, _ := r.worstWindow(ats, r.asyncExtra())
		late, _ := r.worstWindowFrom(ats, 0, time.Second)
		c.AnyWorstAsync, c.AnyWorstAfter1s = max(c.AnyWorstAsync, w), max(c.AnyWorstAfter1s, late)
	}
	if r.sc.cold.abuse > 0 {
		abusive := r.keyAt[r.sc.Keys-1]
		c.AbuseWorst, c.AbuseWorstW = r.worstWindow(abusive, 0)
		c.AbuseWorstAsync, _ = r.worstWindow(abusive, r.asyncExtra())
		c.AbuseOverBound = float64(r.keyAdm[r.sc.Keys-1]) / r.sc.bound()
	}
	return c
}

// startAbuse schedules the abusive key's steady stream, if the scenario has one.
func (f *fleet) startAbuse() {
	a := f.sc.cold.abuse
	if a <= 0 {
		return
	}
	var next func(int64)
	next = func(i int64) {
		t := f.sc.cold.abuseAt + time.Duration((float64(i)+0.5)/a*float64(time.Second))
		if t >= f.sc.Duration {
			return
		}
		f.e.atArg(t, func(i int64) {
			sv := f.pick()
			if k := f.sc.cold.abuseServers; k > 0 {
				sv = f.live[f.rng.IntN(min(k, len(f.live)))]
			}
			f.sendTo(f.sc.Keys-1, sv)
			next(i + 1)
		}, i)
	}
	next(0)
}
