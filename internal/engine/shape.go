package engine

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/fallback"
	"github.com/fleetlimit/fleetlimit/internal/keystore"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
)

// TierConfig is a tier of a limit: another rate and burst (and pre-check) for the keys a
// caller decides under it, in the same buckets. The limit's other fields apply to every
// tier.
type TierConfig struct {
	// Name names the tier in calls: 1 to 64 bytes. The limit's own rate and burst are the
	// tier "".
	Name     string
	Rate     float64
	Burst    int
	PreRate  float64
	PreBurst int
}

// Shape is one set of a limit's parameters as the engine runs them: its bucket's rate,
// burst and version, the pre-check, the lease sizing and the failure policy, for one
// tier. A Limit holds the shapes of its current configuration, one per tier; each key
// remembers the shape it was last decided on, and a request under another shape (a new
// configuration, or another tier) re-shapes the key first (see reshape). A Shape never
// changes once built, but for its fleet size.
type Shape struct {
	tier       string
	cfg        LimitConfig // the tier's Rate, Burst, PreRate and PreBurst (0: the default, as given)
	glim       redisstore.Limit
	lease      atomic.Pointer[LeaseConfig]
	fallback   *fallback.Fallback
	preRate    float64 // tokens per second; tokenbucket.Inf: no pre-check
	preBurst   int
	window     time.Duration // Burst / Rate
	perToken   float64       // nanoseconds to refill one token at Rate
	lostWindow time.Duration // see Limit.lostWindow
}

// Tier returns the shape's tier: "" for the limit's own rate and burst.
func (s *Shape) Tier() string { return s.tier }

// Rate and Burst are the shape's fleet-wide refill rate and capacity.
func (s *Shape) Rate() float64 { return s.cfg.Rate }
func (s *Shape) Burst() int    { return s.cfg.Burst }

// Global is the shape's bucket as package global names it: the limit's name, the
// shape's rate and burst, and the limit's version.
func (s *Shape) Global() redisstore.Limit { return s.glim }

// Window returns the time the shape's bucket takes to refill from empty (Burst / Rate).
func (s *Shape) Window() time.Duration { return s.window }

// DryRun reports whether the shape's limit only watches (LimitConfig.DryRun).
func (sh *Shape) DryRun() bool { return sh.cfg.DryRun }

// RefillTime returns the time the shape's bucket takes to refill n tokens at Rate: 0 for
// n <= 0, InfDuration when that does not fit a time.Duration.
func (s *Shape) RefillTime(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	if ns := float64(n) * s.perToken; ns < float64(InfDuration) {
		return time.Duration(ns)
	}
	return InfDuration
}

// sameBucket reports whether keys of s and o hold the same leases and pre-check: the
// same bucket parameters and version, pre-check and lease sizing. A key moves from one
// to the other without giving anything back.
func (s *Shape) sameBucket(o *Shape) bool {
	a, b := s.lease.Load(), o.lease.Load()
	return s.glim == o.glim && s.preRate == o.preRate && s.preBurst == o.preBurst &&
		a.RefillInterval == b.RefillInterval && a.Lifetime == b.Lifetime && a.LowWatermark == b.LowWatermark
}

// shapes is a limit's configuration: the shape of its own rate and burst, and one per
// tier, by name.
type shapes struct {
	base  *Shape
	tiers []*Shape
}

// of returns the shape of tier; base for "" or a tier the limit does not have (one a
// SetLimit removed while the caller was deciding).
func (ss *shapes) of(tier string) *Shape {
	if tier == "" {
		return ss.base
	}
	for _, s := range ss.tiers {
		if s.tier == tier {
			return s
		}
	}
	return ss.base
}

func (ss *shapes) all() []*Shape { return append([]*Shape{ss.base}, ss.tiers...) }

// buildShapes validates c and returns its shapes for a fleet of servers, with c's
// MaxWait and MaxCost defaults filled in (a default pre-check stays 0).
func buildShapes(c LimitConfig, servers int) (*shapes, LimitConfig, error) {
	if _, err := redisstore.NewLimit(c.Name, c.Rate, c.Burst); err != nil {
		return nil, c, err
	}
	if c.Version > redisstore.MaxVersion {
		return nil, c, fmt.Errorf("limit %q: Version %d above %d", c.Name, c.Version, uint64(redisstore.MaxVersion))
	}
	if err := fallback.Validate(c.Policy); err != nil {
		return nil, c, fmt.Errorf("limit %q: %w", c.Name, err)
	}
	switch {
	case c.MaxWait < 0:
		return nil, c, fmt.Errorf("limit %q: MaxWait %v", c.Name, c.MaxWait)
	case c.MaxCost < 0 || c.MaxCost > c.Burst:
		return nil, c, fmt.Errorf("limit %q: MaxCost %d must be between 1 and Burst %d", c.Name, c.MaxCost, c.Burst)
	case c.MaxKeys < 0:
		return nil, c, fmt.Errorf("limit %q: MaxKeys %d", c.Name, c.MaxKeys)
	}
	if err := checkKind(c); err != nil {
		return nil, c, err
	}
	c.MaxWait = cmpOr(c.MaxWait, DefaultMaxWait)
	c.MaxCost = max(c.MaxCost, 1)
	c.Tiers = slices.Clone(c.Tiers)
	ss := &shapes{}
	var err error
	if ss.base, err = newShape(c, TierConfig{Rate: c.Rate, Burst: c.Burst, PreRate: c.PreRate, PreBurst: c.PreBurst}, servers); err != nil {
		return nil, c, err
	}
	for i, t := range c.Tiers {
		if t.Name == "" || len(t.Name) > redisstore.MaxNameLen {
			return nil, c, fmt.Errorf("limit %q: tier %d: name %q must be 1 to %d bytes", c.Name, i, t.Name, redisstore.MaxNameLen)
		}
		if slices.ContainsFunc(c.Tiers[:i], func(o TierConfig) bool { return o.Name == t.Name }) {
			return nil, c, fmt.Errorf("limit %q: tier %q configured twice", c.Name, t.Name)
		}
		if _, err := redisstore.NewLimit(c.Name, t.Rate, t.Burst); err != nil {
			return nil, c, fmt.Errorf("tier %q: %w", t.Name, err)
		}
		s, err := newShape(c, t, servers)
		if err != nil {
			return nil, c, err
		}
		ss.tiers = append(ss.tiers, s)
	}
	return ss, c, nil
}

// newShape is the shape of tier t of the limit c; its configuration keeps t's pre-check
// as given (0: the default), its preRate and preBurst the ones in force.
func newShape(c LimitConfig, t TierConfig, servers int) (*Shape, error) {
	what := fmt.Sprintf("limit %q", c.Name)
	if t.Name != "" {
		what += fmt.Sprintf(", tier %q", t.Name)
	}
	switch {
	case t.PreRate < 0 || math.IsNaN(t.PreRate) || math.IsInf(t.PreRate, 0):
		return nil, fmt.Errorf("%s: PreRate %v", what, t.PreRate)
	case t.PreBurst < 0:
		return nil, fmt.Errorf("%s: PreBurst %d", what, t.PreBurst)
	case t.PreRate > t.Rate || t.PreBurst > t.Burst:
		return nil, fmt.Errorf("%s: the pre-check (%v/s, burst %d) must be tighter than the limit (%v/s, burst %d)", what, t.PreRate, t.PreBurst, t.Rate, t.Burst)
	}
	// The configuration keeps the pre-check as given (0: the tier's own rate or burst),
	// so that one read back and changed moves a default pre-check with the limit.
	c.Rate, c.Burst, c.PreRate, c.PreBurst = t.Rate, t.Burst, t.PreRate, t.PreBurst
	c.MaxCost = min(c.MaxCost, c.Burst)
	lc, err := LeaseConfig{
		Rate: c.Rate, Burst: c.Burst, Servers: servers,
		RefillInterval: c.RefillInterval, Lifetime: c.Lifetime, LowWatermark: c.LowWatermark,
	}.Normalize()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	s := &Shape{
		tier: t.Name, cfg: c,
		glim:    redisstore.Limit{Name: c.Name, Rate: c.Rate, Burst: c.Burst, Version: c.Version},
		preRate: cmpOr(t.PreRate, t.Rate), preBurst: cmpOr(t.PreBurst, t.Burst),
		window: tokenbucket.Duration(float64(c.Burst), c.Rate), perToken: float64(time.Second) / c.Rate,
	}
	s.lostWindow = min(s.window, 120*time.Second)
	s.lease.Store(&lc)
	// FailLocal: a per-key local limit of this server's share of the fleet limit (rate /
	// servers, burst max(ceil(burst / servers), MaxCost)), resized when the count moves.
	if err := fallback.Validate(c.Policy); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	s.fallback, err = fallback.New(fallback.Of(c.Policy), fallback.Config{
		Rate: c.Rate, Burst: c.Burst, Servers: servers, MaxCost: c.MaxCost, MaxKeys: c.MaxKeys,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return s, nil
}

// setServers divides the shape among n live servers from now on.
func (s *Shape) setServers(now time.Time, n int) {
	c := *s.lease.Load()
	c.Servers = n
	s.lease.Store(&c)
	_ = s.fallback.SetServersAt(now, n) // valid: the limit was accepted, and a share too slow gets the slowest rate
}

// idleTimeout is how long a key of ss stays held without a request: twice the lease
// lifetime, and not before a roomy grant's tokens expire (LeaseConfig.roomyLifetime)
// nor before its pre-check bucket would be full again (a dropped bucket comes back
// full), the fill time capped at a day; its lease is refunded then.
func (ss *shapes) idleTimeout() time.Duration {
	var d time.Duration
	for _, s := range ss.all() {
		fill := min(tokenbucket.Duration(float64(s.preBurst), float64(s.preRate)), 24*time.Hour)
		lc := s.lease.Load()
		d = max(d, 2*lc.Lifetime, lc.roomyLifetime()+time.Second, fill+time.Second)
	}
	return d
}

// reshape moves the key of en to shape s at t (Unix nanoseconds): the first shape of a new key fills its
// pre-check; a key of another shape with other bucket parameters gives its leased tokens
// back (queued for refund on the shape they were leased under: Redis adds them back
// only if the bucket still has it) and drops a refill in flight, whose answer is
// refunded the same way, and its pre-check takes s's rate and burst, keeping what it
// holds up to the new burst. It requires the key's lock.
func (lm *Limit) reshape(en *entry, s *Shape, t int64) {
	old := en.shape
	en.shape = s
	if old == nil {
		en.pre.Reset(t, s.preRate, s.preBurst)
		return
	}
	if old.sameBucket(s) {
		return
	}
	en.pre.SetRateAt(t, s.preRate)
	en.pre.SetBurstAt(t, s.preBurst)
	en.flight = nil
	lm.stats.reshaped.Add(1)
	lm.drain(en, old)
}

// limitTable is the engine's limits: replaced whole when a limit is added or removed,
// or a companion (reps.go). prim are the limits of the configuration, the ones Limit
// finds by name; list is those and their companions, every limit whose keys and
// schedule the engine runs.
type limitTable struct {
	prim   []*Limit
	list   []*Limit
	byName map[string]*Limit // nil when there are few limits: a scan is faster
}

func newLimitTable(prim, comps []*Limit) *limitTable {
	t := &limitTable{prim: prim, list: prim}
	if len(comps) > 0 {
		t.list = append(slices.Clip(prim), comps...)
	}
	if len(prim) > 8 {
		t.byName = make(map[string]*Limit, len(prim))
		for _, lm := range prim {
			t.byName[lm.name] = lm
		}
	}
	return t
}

// companions returns the companions in t.
func (t *limitTable) companions() []*Limit { return t.list[len(t.prim):] }

// errVersion is wrapped by SetLimit's error for a change that needs a higher Version.
var errVersion = errors.New("a change of a bucket's rate or burst needs a higher Version")

// SetLimit replaces the configuration of the limit named c.Name at now: its rate, burst,
// tiers, pre-check, policy, MaxWait and lease tuning (MaxKeys stays). Requests decided from
// now on run on it; each key re-shapes on its next request (reshape), and keys that see
// none give their leases back when these expire, as they would have. A change of the
// bucket's parameters (the rate or burst of the limit or of a tier, a tier added or
// removed) needs a higher Version, so that servers which learn of it at different
// instants agree on it in Redis: the highest version's are in force there. A lower
// Version is refused.
func (e *Engine) SetLimit(now time.Time, c LimitConfig) error {
	e.cfgMu.Lock()
	defer e.cfgMu.Unlock()
	lm := e.Limit(c.Name)
	if lm == nil {
		return fmt.Errorf("limit %q: no such limit", c.Name)
	}
	old := lm.cur.Load()
	ss, err := e.checkChange(old, c)
	if err != nil {
		return err
	}
	for _, s := range ss.all() {
		if o := old.of(s.tier); o.tier == s.tier && o.sameBucket(s) && o.fallback.Same(s.fallback) {
			// Same bucket and policy: keep the shape's fallback, with its keys' local
			// buckets.
			s.fallback.Close()
			s.fallback = o.fallback
		}
	}
	lm.cur.Store(ss)
	lm.keys.SetIdleTimeout(ss.idleTimeout())
	for _, o := range old.all() {
		if n := ss.of(o.tier); n.fallback != o.fallback {
			o.fallback.Close()
		}
	}
	e.mu.Lock()
	e.tickEvery = e.tickInterval()
	e.mu.Unlock()
	e.wake()
	return nil
}

// checkChange returns the shapes of c, a new configuration of the limit whose
// configuration is old, or why it cannot replace it.
func (e *Engine) checkChange(old *shapes, c LimitConfig) (*shapes, error) {
	oc := old.base.cfg
	// 0 is the key store's default: naming the default is no change.
	if keystore.MaxKeys(c.MaxKeys) != keystore.MaxKeys(oc.MaxKeys) {
		return nil, fmt.Errorf("limit %q: MaxKeys cannot change at run time (%d, was %d): remove the limit and add it again", c.Name, c.MaxKeys, oc.MaxKeys)
	}
	if err := checkKindChange(c, oc); err != nil {
		return nil, err
	}
	ss, c, err := buildShapes(c, e.Servers())
	if err != nil {
		return nil, err
	}
	switch {
	case c.Version < oc.Version:
		return nil, fmt.Errorf("limit %q: Version %d is below the current %d", c.Name, c.Version, oc.Version)
	case c.Version == oc.Version && !sameBuckets(old, ss):
		return nil, fmt.Errorf("limit %q: %w than %d", c.Name, errVersion, oc.Version)
	}
	return ss, nil
}

// CheckLimit reports, without changing anything, why c could not be added (a limit of a
// new name) or set (SetLimit, for a limit the engine has).
func (e *Engine) CheckLimit(c LimitConfig) error {
	lm := e.Limit(c.Name)
	var ss *shapes
	var err error
	if lm == nil {
		ss, _, err = buildShapes(c, e.Servers())
	} else {
		ss, err = e.checkChange(lm.cur.Load(), c)
	}
	if ss != nil {
		for _, s := range ss.all() {
			s.fallback.Close()
		}
	}
	return err
}

// sameBuckets reports whether a and b have the same tiers with the same bucket
// parameters.
func sameBuckets(a, b *shapes) bool {
	if len(a.tiers) != len(b.tiers) {
		return false
	}
	for _, s := range b.all() {
		o := a.of(s.tier)
		if o.tier != s.tier || o.cfg.Rate != s.cfg.Rate || o.cfg.Burst != s.cfg.Burst {
			return false
		}
	}
	return true
}

// AddLimit adds the limit c to the engine at run time.
func (e *Engine) AddLimit(c LimitConfig) error {
	e.cfgMu.Lock()
	defer e.cfgMu.Unlock()
	if e.Limit(c.Name) != nil {
		return fmt.Errorf("limit %q configured twice", c.Name)
	}
	t := e.limits.Load()
	lm, err := e.newLimit(c, e.Servers(), e.shards, e.seed+uint64(len(t.prim))*0x9e3779b97f4a7c15)
	if err != nil {
		return err
	}
	e.limits.Store(newLimitTable(append(slices.Clip(t.prim), lm), t.companions()))
	e.mu.Lock()
	// Record the new limit's representation and read the others' at once, not with
	// the next heartbeat: its requests are decided on them.
	e.repsDue, e.firstReps = true, true
	e.mu.Unlock()
	e.mu.Lock()
	e.tickEvery = e.tickInterval()
	e.mu.Unlock()
	return nil
}

// RemoveLimit removes the limit named name at run time: its keys are let go of (their
// leased tokens are queued for refund; a windowed limit's admissions without asking and
// the grants its waiting requests asked go with a last report) and its requests from
// now on are denied with ReasonClosed; Engine.Limit no longer finds it. Its counters stay
// in Stats' totals, and go on in StatsOf of a limit added again under its name.
func (e *Engine) RemoveLimit(name string) error {
	e.cfgMu.Lock()
	defer e.cfgMu.Unlock()
	lm := e.Limit(name)
	if lm == nil {
		return fmt.Errorf("limit %q: no such limit", name)
	}
	t := e.limits.Load()
	comps := lm.Companions()
	e.limits.Store(newLimitTable(slices.DeleteFunc(slices.Clone(t.prim), func(l *Limit) bool { return l == lm }),
		slices.DeleteFunc(slices.Clone(t.companions()), func(l *Limit) bool { return slices.Contains(comps, l) })))
	e.dropLimit(lm)
	for _, c := range comps {
		e.dropLimit(c)
	}
	e.removedMu.Lock()
	e.past = append(e.past, lm)
	e.removedMu.Unlock()
	e.wake()
	return nil
}

// dropLimit lets go of lm, no longer in the engine's table: its keys (their leased
// tokens are queued for refund) and its fallbacks; its refunds may still be out (each
// carries lm: refundBatch). A windowed limit sends what it queued with a last report
// (retiring): the requests waiting for its grants are decided on their answers, as they
// would have been.
func (e *Engine) dropLimit(lm *Limit) {
	lm.keys.Close() // drains every lease through evicted
	for _, s := range lm.cur.Load().all() {
		s.fallback.Close()
	}
	if wl := lm.windowed(); wl != nil {
		// What it admitted without asking, the grants its keys gave back and the grants
		// its waiting requests asked for go with a last report; it retires once that went.
		wl.mu.Lock()
		wl.lastReport()
		wl.mu.Unlock()
		e.mu.Lock()
		e.retiring = append(e.retiring, wl)
		e.mu.Unlock()
		e.wake()
	}
}

// tickInterval is the lease-expiry sweep's interval: a quarter of the shortest lease
// lifetime, at least a millisecond.
func (e *Engine) tickInterval() time.Duration {
	d := time.Hour
	for _, lm := range e.limits.Load().list {
		for _, s := range lm.cur.Load().all() {
			d = min(d, s.lease.Load().Lifetime/4)
		}
	}
	return max(d, time.Millisecond)
}
