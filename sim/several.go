package sim

import (
	"fmt"

	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/engine"
)

// AlsoLimit is another limit every request counts against, all or nothing, as
// hybrid.Limiter.AllowMulti does: a per-tenant limit (Keys tenants, request key k
// belonging to tenant k mod Keys) or a global one (Keys 1). A request is admitted only
// if every limit admits it, and a denial spends nothing anywhere. Only the hybrid
// strategies see it.
type AlsoLimit struct {
	Name  string
	Rate  float64
	Burst int
	Keys  int
}

// AlsoResult is how one AlsoLimit fared: its busiest key's admissions over the bound of a
// perfect bucket (Burst + Rate·T) and over the hybrid bound (2·Burst + Rate·T), and all
// its keys' admissions over Keys·Rate·T.
type AlsoResult struct {
	Name                 string  `json:"name"`
	Rate                 float64 `json:"rate"`
	Burst                int     `json:"burst"`
	Keys                 int     `json:"keys"`
	HottestKeyOverBound  float64 `json:"hottest_key_over_bound"`
	HottestKeyOver2Burst float64 `json:"hottest_key_over_2burst"`
	AdmittedOverLimit    float64 `json:"admitted_over_limit"`
}

// checkAlso validates the scenario's other limits.
func (sc *Scenario) checkAlso() error {
	names := map[string]bool{limitName: true}
	for i, a := range sc.AlsoLimits {
		if _, err := global.NewLimit(a.Name, a.Rate, a.Burst); err != nil {
			return fmt.Errorf("also limit %d: %v", i, err)
		}
		switch {
		case names[a.Name]:
			return fmt.Errorf("also limit %d: name %q taken", i, a.Name)
		case a.Keys < 1:
			return fmt.Errorf("also limit %q: %d keys", a.Name, a.Keys)
		case a.Burst < sc.Cost:
			return fmt.Errorf("also limit %q: burst %d below the cost %d", a.Name, a.Burst, sc.Cost)
		}
		names[a.Name] = true
	}
	return nil
}

// alsoConfigs are the engine limits of sc's other limits, tuned as its own.
func alsoConfigs(sc *Scenario, base engine.LimitConfig) []engine.LimitConfig {
	var out []engine.LimitConfig
	for _, a := range sc.AlsoLimits {
		c := base
		c.Name, c.Rate, c.Burst, c.PreRate, c.PreBurst = a.Name, a.Rate, a.Burst, 0, 0
		out = append(out, c)
	}
	return out
}

// multiReq is a request of several limits waiting for one of its items' refill.
type multiReq struct {
	q *request
	m *engine.Multi
}

// alsoKey is the key of request key k under other limit i.
func (h *hybridStrat) alsoKey(i, k int) string {
	if h.alsoKeys == nil {
		h.alsoKeys = make([][]string, len(h.f.sc.AlsoLimits))
		for j, a := range h.f.sc.AlsoLimits {
			for t := range a.Keys {
				h.alsoKeys[j] = append(h.alsoKeys[j], fmt.Sprintf("%s%d", a.Name, t))
			}
		}
	}
	return h.alsoKeys[i][k%len(h.alsoKeys[i])]
}

// handleMulti decides q against the scenario's other limits and its own, all or
// nothing, through the engine's Multi (what hybrid.Limiter.AllowMulti does).
func (h *hybridStrat) handleMulti(s *server, hs *hybridServer, q *request) {
	f := h.f
	m := &engine.Multi{}
	for i := range f.sc.AlsoLimits {
		m.Add(engine.MultiItem{Limit: hs.also[i], Key: h.alsoKey(i, q.key), N: q.n})
	}
	m.Add(engine.MultiItem{Limit: hs.lim, Key: f.keyName(q.key), N: q.n})
	w, done := hs.eng.StartMulti(s.clock(f.e.now).UnixNano(), m)
	h.multiStep(s, hs, &multiReq{q: q, m: m}, w, done)
}

// multiStep records r once decided, or waits for w: for its answer (decided) or its
// limit's MaxWait, whichever comes first, then resumes r.
func (h *hybridStrat) multiStep(s *server, hs *hybridServer, r *multiReq, w *engine.Waiter, done bool) {
	f := h.f
	if done {
		d := r.m.Decision
		d.Allowed = r.m.Allowed
		h.record(r.q, d)
		return
	}
	hs.multi[w] = r
	h.later(s, f.e.now+w.Limit().Config().MaxWait, func() {
		if r, ok := hs.multi[w]; ok {
			delete(hs.multi, w)
			d := hs.eng.GiveUp(s.clock(f.e.now), w, engine.ReasonTimeout)
			h.resume(s, hs, r, d)
		}
	})
}

// resume goes on with r after one of its items was decided d.
func (h *hybridStrat) resume(s *server, hs *hybridServer, r *multiReq, d engine.Decision) {
	w, done := hs.eng.ResumeMulti(s.clock(h.f.e.now).UnixNano(), r.m, d)
	h.multiStep(s, hs, r, w, done)
	h.wake(s, hs)
}

// multiDecided is decided for the waiter of a request of several limits: it resumes the
// request at the same instant, once the engine call that decided w has returned (the
// callback must not call the engine).
func (h *hybridStrat) multiDecided(s *server, hs *hybridServer, w *engine.Waiter) bool {
	r, ok := hs.multi[w]
	if !ok {
		return false
	}
	delete(hs.multi, w)
	h.f.e.after(0, func() { h.resume(s, hs, r, w.Decision()) })
	return true
}

// alsoResults measures the other limits from the admissions per request key.
func (r *recorder) alsoResults() []AlsoResult {
	sc := r.sc
	T := sc.Duration.Seconds()
	var out []AlsoResult
	for _, a := range sc.AlsoLimits {
		adm := make([]int64, a.Keys)
		total := int64(0)
		for k, n := range r.keyAdm {
			adm[k%a.Keys] += n
			total += n
		}
		ar := AlsoResult{Name: a.Name, Rate: a.Rate, Burst: a.Burst, Keys: a.Keys,
			AdmittedOverLimit: float64(total) / (float64(a.Keys) * a.Rate * T)}
		for _, n := range adm {
			ar.HottestKeyOverBound = max(ar.HottestKeyOverBound, float64(n)/(float64(a.Burst)+a.Rate*T))
			ar.HottestKeyOver2Burst = max(ar.HottestKeyOver2Burst, float64(n)/(2*float64(a.Burst)+a.Rate*T))
		}
		out = append(out, ar)
	}
	return out
}

// report adds what only the hybrid strategy knows to res: its breakers' transitions, the
// admitted items given back because another item of their request denied, and the grants
// whose answers the servers a fault acts on did not read.
func (h *hybridStrat) report(sc *Scenario, res *Result) {
	h.breakerLog.report(sc, res)
	fault, _ := res.fault()
	for _, s := range h.f.servers {
		if hs, ok := s.state.(*hybridServer); ok {
			for _, lm := range hs.eng.Limits() {
				res.GivenBack += lm.Stats().GivenBack
			}
			if fault != nil && sc.affected(s.id, sc.DownMaster) { // a stopped master: every server's
				fault.GrantsUnread += hs.unread
				fault.GrantsReadLate += hs.readLate
			}
		}
	}
}
