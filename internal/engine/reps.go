package engine

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// A limit's representation is where its keys are counted in Redis: the bucket kinds
// (exact and charge-later) count in one token bucket per key, which they share; a
// windowed limit counts in arrays named by its window (Burst/Rate) and its number of
// shards (wire.WindowShards: a key's shard is a hash of it modulo that number, and
// the shards' keys carry it, so two numbers of shards are two sets of keys). Servers that
// disagree on a limit's representation, as while a release that changes its kind or
// window rolls out, would each count in their own place and see nothing of the others'
// admissions: up to the sum of both configurations' bounds.
//
// So every server records the representation of each of its limits in the fleet's
// record (wire.RepsKey, one sorted set; a member lives for repsLive after its last
// record) and reads back every live one with the same call, a HeartbeatTrip, every
// repsEvery; its first comes with the first Next, which the driver makes before it
// serves requests (hybrid.Limiter.Ready waits for it). For each representation
// of one of its limits other than the limit's own, the server runs a companion limit
// of that representation beside it: a request of the limit is decided as an
// all-or-nothing request over the limit and its companions (Multi), so it is admitted
// only if each admits it, and spends in each. A companion goes once its representation
// has not been recorded for repsLive.
//
// The rule that follows: once a server has read the record, every admission it makes
// is counted in every representation it read live. A server taking a new representation
// reads the record before serving (the driver's first trip, again every heartbeat
// interval until it is answered), so the old representation counts every admission of
// the fleet for as long as old servers run, and repsLive after; once they have gone,
// every server counts in the new one. Each window of the rollout is thus within the old
// configuration's bound, or the new one's: within the larger of the two.
//
// A request decided under a tier runs that tier on the limit and its own rate and burst
// on the companions; a reservation (Claim) claims on the limit alone.

// repsEvery is how often a server records its representations: every 30 heartbeat
// intervals (30 s by default), riding on a heartbeat when the engine beats: one call
// per server and 30 s, a few percent of the calls of a fleet whose keys are quiet. A new
// server's first record is read at once (again every heartbeat interval until one is
// answered); the rest only bound how soon the servers already running check a new
// representation, which the rule's bound does not need, and how long a companion
// outlives the last server of its representation (at most repsLive + repsEvery).
func (e *Engine) repsEvery() time.Duration { return 30 * e.beat }

// repsLive is how long a recorded representation stays live: two records, so that one
// late record does not drop it.
func (e *Engine) repsLive() time.Duration { return 2 * e.repsEvery() }

// repOf is the record's member for the limit configured by c: its name, its
// representation (repIdentity's part) and what a companion is made of.
//
//	<name> bucket <rate> <burst>
//	<name> windowed <window µs> <rate> <burst> <report µs> <width> <shards>
//
// A windowed limit of one shard, the unsharded format, leaves <shards> out: that is the
// member of a release that counts every key of a limit under one tag, which a server
// reads as one shard, and which that release reads back.
func repOf(c LimitConfig) string {
	r := strconv.FormatFloat(c.Rate, 'g', -1, 64)
	b := strconv.Itoa(c.Burst)
	if c.Windowed > 0 {
		w := wire.WindowMicros(c.Rate, c.Burst)
		m := c.Name + " windowed " + strconv.FormatInt(w, 10) + " " + r + " " + b + " " +
			strconv.FormatInt(c.Windowed.Microseconds(), 10) + " " + strconv.Itoa(c.WindowWidth)
		if n := c.WindowShards; n > 1 {
			m += " " + strconv.Itoa(n)
		}
		return m
	}
	return c.Name + " bucket " + r + " " + b
}

// repIdentity is the part of a member that names where keys are counted: the limit's
// name and "bucket" (every bucket kind counts in the same bucket, whatever its rate), or
// "windowed", the window and the number of shards (arrays are named by them). ok is
// false for a member that is not one repOf writes.
func repIdentity(m string) (id string, ok bool) {
	f := strings.Fields(m)
	switch {
	case len(f) == 4 && f[1] == "bucket":
		return f[0] + " bucket", true
	case len(f) == 7 && f[1] == "windowed":
		return f[0] + " windowed " + f[2] + " 1", true
	case len(f) == 8 && f[1] == "windowed" && f[7] != "1":
		return f[0] + " windowed " + f[2] + " " + f[7], true
	}
	return "", false
}

// repConfig is the configuration of a companion of p, the configuration of the limit it
// runs beside, for member m: p's policy, waits and key bounds, with m's kind, rate and
// burst. A bucket companion is exact: it checks the bucket and never charges later.
func repConfig(p LimitConfig, m string) (LimitConfig, error) {
	f := strings.Fields(m)
	if _, ok := repIdentity(m); !ok {
		return LimitConfig{}, fmt.Errorf("representation %q: not a member of the record", m)
	}
	at := 2 // the rate's field; a windowed member has its window first
	if f[1] == "windowed" {
		at = 3
	}
	r, err := strconv.ParseFloat(f[at], 64)
	if err != nil {
		return LimitConfig{}, fmt.Errorf("representation %q: rate: %w", m, err)
	}
	b, err := strconv.Atoi(f[at+1])
	if err != nil {
		return LimitConfig{}, fmt.Errorf("representation %q: burst: %w", m, err)
	}
	c := LimitConfig{Name: p.Name, Rate: r, Burst: b, Policy: p.Policy, MaxWait: p.MaxWait, MaxKeys: p.MaxKeys}
	if f[1] == "windowed" {
		report, err := strconv.ParseInt(f[5], 10, 64)
		if err != nil {
			return LimitConfig{}, fmt.Errorf("representation %q: report: %w", m, err)
		}
		if c.WindowWidth, err = strconv.Atoi(f[6]); err != nil {
			return LimitConfig{}, fmt.Errorf("representation %q: width: %w", m, err)
		}
		c.WindowShards = 1
		if len(f) == 8 {
			if c.WindowShards, err = strconv.Atoi(f[7]); err != nil {
				return LimitConfig{}, fmt.Errorf("representation %q: shards: %w", m, err)
			}
		}
		c.Windowed = time.Duration(report) * time.Microsecond
	}
	return c, nil
}

// repsMembers returns the members this server records: one per limit it runs.
func (e *Engine) repsMembers() []string {
	t := e.limits.Load()
	ms := make([]string, 0, len(t.prim))
	for _, lm := range t.prim {
		ms = append(ms, repOf(lm.Config()))
	}
	return ms
}

// repsDone takes the live members a HeartbeatTrip read at now (got; nil, or err, when
// it was not answered): each limit gets a companion for each live representation other
// than its own, and loses those no longer live. Until the first is answered, the
// record is read again every heartbeat interval.
func (e *Engine) repsDone(now time.Time, got []string, err error) {
	if got == nil || err != nil {
		e.mu.Lock()
		if e.firstReps {
			e.nextReps = now.Add(e.beat)
		}
		e.mu.Unlock()
		return
	}
	e.mu.Lock()
	e.firstReps = false
	e.mu.Unlock()
	e.cfgMu.Lock()
	defer e.cfgMu.Unlock()
	t := e.limits.Load()
	changed := false
	var gone []*Limit
	prim := t.prim
	var comps []*Limit
	for _, lm := range prim {
		own, _ := repIdentity(repOf(lm.Config()))
		var keep []*Limit
		for _, m := range got {
			id, ok := repIdentity(m)
			if !ok || id == own || !strings.HasPrefix(id, lm.name+" ") {
				continue
			}
			if i := slices.IndexFunc(keep, func(c *Limit) bool { return c.rep == id }); i >= 0 {
				continue // another member of the same representation: one companion
			}
			old := lm.also.Load()
			if i := slices.IndexFunc(derefLimits(old), func(c *Limit) bool { return c.rep == id }); i >= 0 {
				keep = append(keep, (*old)[i])
				continue
			}
			c, err := repConfig(lm.Config(), m)
			var cl *Limit
			if err == nil {
				cl, err = e.newLimit(c, e.Servers(), e.shards, lm.seed^hashKey(id))
			}
			if err != nil {
				continue // a member this release cannot run
			}
			cl.rep = id
			keep = append(keep, cl)
			changed = true
		}
		for _, c := range derefLimits(lm.also.Load()) {
			if !slices.Contains(keep, c) {
				gone, changed = append(gone, c), true
			}
		}
		if len(keep) == 0 {
			lm.also.Store(nil)
		} else {
			lm.also.Store(&keep)
		}
		comps = append(comps, keep...)
	}
	if !changed {
		return
	}
	e.limits.Store(newLimitTable(prim, comps))
	for _, c := range gone {
		e.dropLimit(c)
	}
	e.mu.Lock()
	e.tickEvery = e.tickInterval()
	e.mu.Unlock()
}

func derefLimits(p *[]*Limit) []*Limit {
	if p == nil {
		return nil
	}
	return *p
}

// Companions returns the limits a request of lm is also decided on (Multi does it): one
// for each other representation of lm the fleet runs; nil for most limits.
func (lm *Limit) Companions() []*Limit { return derefLimits(lm.also.Load()) }

// expand adds, once, an item for each companion of each item the driver added, with the
// same key and cost on the companion's own rate and burst, so that m is decided on every
// representation of its limits.
func (m *Multi) expand() {
	if m.users > 0 {
		return
	}
	m.users = m.n
	for i := range m.users {
		it := *m.At(i) // a copy: Add may move the items
		for _, c := range it.Limit.Companions() {
			m.Add(MultiItem{Limit: c, Key: it.Key, N: it.N})
			m.orig = append(m.orig, i)
		}
	}
}

// finish makes Denied and Item, once m is decided, indices of the items the driver
// added: a companion's item stands for the item it was added for.
func (m *Multi) finish() {
	if m.Denied >= m.users {
		m.Denied = m.orig[m.Denied-m.users]
	}
	if m.Item >= m.users {
		m.Item = m.orig[m.Item-m.users]
	}
}
