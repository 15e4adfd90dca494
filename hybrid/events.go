package hybrid

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/engine"
)

// defaultLogInterval is Config.LogInterval's default.
const defaultLogInterval = 10 * time.Second

// evictionCheckTimeout bounds the start-up check of Redis's eviction policy.
const evictionCheckTimeout = 2 * time.Second

// warmTimeout bounds the start-up warming of Redis and the client (Limiter.Ready).
const warmTimeout = 5 * time.Second

// events turns what the Limiter's background goroutine sees into log lines: breaker
// state changes, lost refunds, fleet size changes and scripts Redis refuses. Only that
// goroutine uses it.
type events struct {
	log      *slog.Logger
	every    time.Duration
	nodes    *nodes
	seen     map[*node]breakerSeen // each breaker as last logged
	fleet    string
	servers  int
	lost     throttle
	refused  throttle
	gone     throttle                // lost buckets
	limits   func() []*engine.Limit  // to read their lost-bucket counters
	goneSeen map[*engine.Limit]int64 // each limit's lost buckets when last logged
	dryLast  time.Time               // when the DryRun limits' denials were last looked at
	drySeen  map[*engine.Limit]int64
	repsSeen map[*engine.Limit]int // each limit's representations as last logged (1: its own)
	ctx      context.Context
	lostToks int // tokens lost since the last lost-refunds line
}

// throttle lets one line of a kind through per interval and counts the others.
type throttle struct {
	last       time.Time
	suppressed int
}

// allow reports whether a line may be logged at now; if so, skipped is how many were
// not since the last one.
func (t *throttle) allow(now time.Time, every time.Duration) (skipped int, ok bool) {
	if !t.last.IsZero() && now.Sub(t.last) < every {
		t.suppressed++
		return 0, false
	}
	skipped, t.suppressed, t.last = t.suppressed, 0, now
	return skipped, true
}

// breakerSeen is a breaker's state and counters as last logged.
type breakerSeen struct {
	state breaker.State
	stats breaker.Stats
}

func newEvents(log *slog.Logger, every time.Duration, nodes *nodes, fleet string, servers int, limits func() []*engine.Limit) *events {
	ev := &events{
		log: log, every: every, nodes: nodes, seen: map[*node]breakerSeen{}, fleet: fleet, servers: servers, limits: limits,
		drySeen: map[*engine.Limit]int64{}, repsSeen: map[*engine.Limit]int{}, goneSeen: map[*engine.Limit]int64{},
		ctx: context.Background(),
	}
	ev.seen[nodes.all] = breakerSeen{nodes.all.brk.State(), nodes.all.brk.Stats()}
	return ev
}

// breaker logs the breakers' state changes since the last look: one line per look and
// breaker, with how many times it opened meanwhile, so that a flapping breaker is seen
// as such. A Cluster master's line names it (node); a master's first line says only how
// it differs from a new, closed breaker.
func (ev *events) breaker() {
	live := ev.nodes.forEach(ev.breakerOf)
	if len(ev.seen) > live { // masters dropped: forget them
		for nd := range ev.seen {
			if nd != ev.nodes.all && !slices.Contains(*ev.nodes.masters.Load(), nd) {
				delete(ev.seen, nd)
			}
		}
	}
}

// breakerOf logs nd's breaker's changes since the last look.
func (ev *events) breakerOf(nd *node) {
	state, st := nd.brk.State(), nd.brk.Stats()
	was := ev.seen[nd] // a master not seen yet: closed, no counts
	opened := st.Opened - was.stats.Opened
	changes := opened + st.HalfOpened - was.stats.HalfOpened + st.Closed - was.stats.Closed
	ev.seen[nd] = breakerSeen{state, st}
	if changes == 0 && state == was.state {
		return
	}
	level := slog.LevelInfo
	if state == breaker.StateOpen {
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{slog.String("from", was.state.String()),
		slog.String("to", state.String()), slog.Int64("opened", opened), slog.Int64("changes", changes),
		slog.Int64("failures", st.Failures-was.stats.Failures), slog.Int64("rejected", st.Rejected-was.stats.Rejected)}
	if nd.addr != "" {
		attrs = append(attrs, slog.String("node", nd.addr))
	}
	ev.log.LogAttrs(ev.ctx, level, "fleetlimit: Redis breaker "+state.String(), attrs...)
}

// trip logs what trip t, just done, says: lost refunds, a refused script, a new fleet
// size (servers is the live count after it); then the breaker's changes.
func (ev *events) trip(now time.Time, t *engine.Trip, servers int) {
	switch t.Kind {
	case engine.RefundTrip:
		if n, err := t.Lost(); n > 0 {
			ev.lostToks += n
			if skipped, ok := ev.lost.allow(now, ev.every); ok {
				ev.log.LogAttrs(ev.ctx, slog.LevelWarn, "fleetlimit: leased tokens not refunded; they stay spent",
					slog.Int("tokens", ev.lostToks), slog.Int("lines_skipped", skipped), slog.Any("error", err))
				ev.lostToks = 0
			}
		}
		ev.refusedBy(now, t.Err)
		if t.Answered {
			for _, r := range t.RefundResults {
				ev.refusedBy(now, r.Err)
			}
		}
	case engine.TakeTrip:
		ev.lostBuckets(now)
		ev.refusedBy(now, t.Err)
		if t.Answered {
			for _, r := range t.TakeResults {
				ev.refusedBy(now, r.Err)
			}
		}
	case engine.HeartbeatTrip:
		ev.refusedBy(now, t.Err)
		ev.reps()
		if servers != ev.servers {
			ev.log.LogAttrs(ev.ctx, slog.LevelInfo, "fleetlimit: live fleet size changed",
				slog.String("fleet", ev.fleet), slog.Int("from", ev.servers), slog.Int("to", servers))
			ev.servers = servers
		}
	case engine.LowTrip:
		// A Redis that refuses luascript.Low leaves a ChargeLater limit exact: say why.
		ev.refusedBy(now, t.Err)
		if t.Answered {
			for _, x := range t.Lows {
				ev.refusedBy(now, x.Err)
			}
		}
	case engine.WindowsTrip:
		ev.lostBuckets(now) // window arrays found lost
		// A Redis (or proxy) that refuses BITFIELD or the marks' commands sends a
		// windowed limit's requests that must ask to its policy: say why.
		ev.refusedBy(now, t.Err)
		if t.Answered {
			for _, err := range t.WindowErrs {
				ev.refusedBy(now, err)
			}
		}
	}
	ev.breaker()
}

// reps logs each limit whose representations in the fleet changed in number: while
// servers disagree on its kind or window, each of its requests is decided on every one
// (docs/limits.md).
func (ev *events) reps() {
	for _, lm := range ev.limits() {
		n := 1 + len(lm.Companions())
		last, ok := ev.repsSeen[lm]
		if !ok {
			last = 1
		}
		if n == last {
			continue
		}
		ev.repsSeen[lm] = n
		msg := "fleetlimit: the fleet counts a limit in several representations (servers disagree on its kind or window); each request is decided on every one"
		if n == 1 {
			msg = "fleetlimit: the fleet counts a limit in one representation again"
		}
		ev.log.LogAttrs(ev.ctx, slog.LevelInfo, msg, slog.String("limit", lm.Name()), slog.Int("representations", n))
	}
}

// refusedBy logs err if it says Redis refuses the scripts or commands: an error that
// waiting will not cure (global.ErrRedis: a script error, an unknown command, WRONGTYPE,
// ACL, an unreadable reply).
func (ev *events) refusedBy(now time.Time, err error) {
	if err == nil || !errors.Is(err, global.ErrRedis) {
		return
	}
	if skipped, ok := ev.refused.allow(now, ev.every); ok {
		ev.log.LogAttrs(ev.ctx, slog.LevelError, "fleetlimit: Redis refused a script; the limit's policy decides meanwhile",
			slog.Int("lines_skipped", skipped), slog.Any("error", err))
	}
}

// eviction logs the start-up check of Redis's eviction policy: an error when Redis may
// evict the buckets, a line at INFO when it could not tell (CONFIG refused, as managed
// services often do). It only uses the logger, which is safe from any goroutine.
func (ev *events) eviction(err error) {
	switch {
	case err == nil, errors.Is(err, context.Canceled): // Close came first: nothing to say
	case errors.Is(err, global.ErrEvicting):
		ev.log.LogAttrs(ev.ctx, slog.LevelError, "fleetlimit: Redis may evict the rate-limit buckets; the limits will not hold",
			slog.Any("error", err))
	default:
		ev.log.LogAttrs(ev.ctx, slog.LevelInfo, "fleetlimit: could not check Redis's eviction policy; make sure maxmemory-policy is noeviction",
			slog.Any("error", err))
	}
}

// lostBuckets logs buckets and window arrays found lost in Redis since the last line, and
// the limits they are of: a bucket came back empty, its key losing the tokens it held; a
// window array's servers count again what each knows it added. Each limit's count is
// read against its own as last logged, so that a limit Reconfigure removed takes
// nothing off the others'.
func (ev *events) lostBuckets(now time.Time) {
	var n int64
	for _, lm := range ev.limits() {
		n += max(lm.LostBuckets()-ev.goneSeen[lm], 0)
	}
	if n == 0 {
		return
	}
	if skipped, ok := ev.gone.allow(now, ev.every); ok {
		var names []string
		seen := make(map[*engine.Limit]int64, len(ev.goneSeen)) // the removed limits' left out
		n = 0
		for _, lm := range ev.limits() {
			c := lm.LostBuckets()
			if d := c - ev.goneSeen[lm]; d > 0 {
				n += d
				names = append(names, lm.Name())
			}
			seen[lm] = c
		}
		ev.goneSeen = seen
		ev.log.LogAttrs(ev.ctx, slog.LevelError, "fleetlimit: Redis lost rate-limit buckets (evicted, flushed or deleted); buckets came back empty, window arrays are counted again",
			slog.Int64("buckets", n), slog.Any("limits", names), slog.Int("lines_skipped", skipped))
	}
}

// dryRuns logs, once per interval, how many requests each DryRun limit denied (and so
// admitted) since the last line: what enforcing it would have turned away.
func (ev *events) dryRuns(now time.Time) {
	if !ev.dryLast.IsZero() && now.Sub(ev.dryLast) < ev.every {
		return
	}
	ev.dryLast = now
	for _, lm := range ev.limits() {
		if !lm.Config().DryRun {
			continue
		}
		var denied int64
		st := lm.Stats()
		for src := range st.Decisions[0] {
			for _, n := range st.Decisions[0][src] {
				denied += n
			}
		}
		if d := denied - ev.drySeen[lm]; d > 0 {
			ev.log.LogAttrs(ev.ctx, slog.LevelInfo, "fleetlimit: dry-run limit would have denied requests; they were admitted",
				slog.String("limit", lm.Name()), slog.Int64("requests", d))
		}
		ev.drySeen[lm] = denied
	}
}
