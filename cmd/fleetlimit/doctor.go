package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

// verdict is a check's outcome.
type verdict string

const (
	pass verdict = "PASS"
	warn verdict = "WARN"
	fail verdict = "FAIL"
)

// check is one line of doctor's report.
type check struct {
	v            verdict
	name, detail string
	fix          string // what to do, for a WARN or FAIL
}

// doctor checks c for what a Limiter needs, prints a line per check to w, and reports
// whether one failed. deadline is the breaker's deadline the fleet runs with
// (breaker.Settings.Timeout), which the round-trip time is judged against. An error is
// for the command itself: no answer at all, or ctx's end before the checks were done,
// which leaves the checks done printed and no verdict for the rest (each would fail on
// the ended context, not on what it checks).
func doctor(ctx context.Context, c redis.UniversalClient, cluster bool, deadline time.Duration, prefix string, w io.Writer) (failed bool, err error) {
	var (
		checks   []check
		timedOut string // the check ctx ended in
	)
	add := func(ch check) {
		switch {
		case timedOut != "":
		case ch.v != pass && ctx.Err() != nil:
			timedOut = ch.name
		default:
			checks = append(checks, ch)
		}
	}

	// Round-trip time: a refill is two round trips within the breaker's deadline.
	ping := func() error {
		err := c.Ping(ctx).Err()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("-timeout ran out in the round trip check: raise -timeout: %w", ctx.Err())
		}
		return fmt.Errorf("PING: %w", err)
	}
	if err := ping(); err != nil { // the connection's dial is not a round trip
		return false, err
	}
	var rtts []time.Duration
	for range 20 {
		t0 := time.Now()
		if err := ping(); err != nil {
			return false, err
		}
		rtts = append(rtts, time.Since(t0))
	}
	slices.Sort(rtts)
	p50, p90 := rtts[len(rtts)/2], rtts[len(rtts)*9/10]
	switch rt := fmt.Sprintf("p50 %v, p90 %v over 20 PINGs, against a %v deadline", p50.Round(time.Microsecond), p90.Round(time.Microsecond), deadline); {
	case p90 < deadline/5:
		add(check{v: pass, name: "round trip", detail: rt})
	case p90 < deadline/2:
		add(check{v: warn, name: "round trip", detail: rt,
			fix: "keep Redis close, or raise breaker.Settings.Timeout and the limits' MaxWait (and -deadline)"})
	default:
		add(check{v: fail, name: "round trip", detail: rt,
			fix: "a refill would run past the breaker's deadline: move Redis closer, or raise breaker.Settings.Timeout and MaxWait (and -deadline)"})
	}

	// Version: scripts that read TIME need effects replication (Redis 5 on).
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		add(check{v: warn, name: "version", detail: "INFO refused: " + err.Error(), fix: "check by hand that Redis is 5.0 or later"})
	} else {
		v := field(info, "redis_version")
		major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
		switch {
		case major >= 6:
			add(check{v: pass, name: "version", detail: "Redis " + v})
		case major == 5:
			add(check{v: warn, name: "version", detail: "Redis " + v, fix: "Redis 5 is past its end of life and fleetlimit is tested on Redis 7.0: upgrade"})
		default:
			add(check{v: fail, name: "version", detail: "Redis " + v, fix: "the scripts read TIME, which needs Redis 5 or later (effects replication): upgrade"})
		}
	}

	store, err := global.New(c)
	if err != nil {
		return false, err
	}
	// Eviction: an evicted bucket comes back empty, and a charge-later limit's debts and
	// low keys go too.
	switch err := store.CheckEviction(ctx); {
	case err == nil:
		add(check{v: pass, name: "eviction", detail: "Redis cannot evict the buckets"})
	case errors.Is(err, global.ErrEvicting):
		add(check{v: fail, name: "eviction", detail: err.Error(), fix: "CONFIG SET maxmemory-policy noeviction (or maxmemory 0 on a Redis of the limiter's own)"})
	default:
		add(check{v: warn, name: "eviction", detail: "could not check: " + err.Error(), fix: "make sure maxmemory-policy is noeviction (managed services show it in their console)"})
	}
	// Scripts, on every master: SCRIPT LOAD of each.
	if err := redisstore.Of(store).Warm(ctx); err != nil {
		add(check{v: fail, name: "scripts", detail: err.Error(), fix: refusedFix(err, "allow SCRIPT LOAD and EVALSHA for the limiter's user (ACL +@scripting)")})
	} else {
		add(check{v: pass, name: "scripts", detail: "every script loads (every master)"})
	}
	// BITFIELD, which windowed limits use, on a key that expires at once.
	key := prefix + "doctor:{" + strconv.FormatInt(time.Now().UnixNano(), 36) + "}"
	pipe := c.Pipeline()
	bf := pipe.BitField(ctx, key, "OVERFLOW", "SAT", "INCRBY", "u16", "#0", 1)
	pipe.PExpire(ctx, key, time.Second)
	_, err = pipe.Exec(ctx)
	c.Del(ctx, key)
	if err != nil || len(bf.Val()) != 1 || bf.Val()[0] != 1 {
		add(check{v: fail, name: "BITFIELD", detail: fmt.Sprint(err, bf.Val()), fix: refusedFix(err, "windowed limits need BITFIELD (ACL +bitfield) on the Store's keys ("+key+" was tried: -prefix sets it); the other kinds do not")})
	} else {
		add(check{v: pass, name: "BITFIELD", detail: "OVERFLOW SAT INCRBY answers (windowed limits)"})
	}
	if cluster {
		clusterChecks(ctx, c, add)
	}
	for _, ch := range checks {
		fmt.Fprintf(w, "%s  %-12s %s\n", ch.v, ch.name, ch.detail)
		if ch.fix != "" {
			fmt.Fprintf(w, "      %-12s fix: %s\n", "", ch.fix)
		}
		failed = failed || ch.v == fail
	}
	if timedOut != "" {
		return failed, fmt.Errorf("-timeout ran out in the %s check, with %d done (above): raise -timeout (each check is a round trip or a few): %w", timedOut, len(checks), ctx.Err())
	}
	return failed, nil
}

// refusedFix is the fix of a check that failed with err: fix when Redis refused it (an
// ACL, a command it lacks), and otherwise what says that it could not serve it, which
// no ACL change mends: no answer in time, a lost connection, or a reply such as
// LOADING, BUSY or OOM (storeerr.IsNodeFailure, the breaker's rule).
func refusedFix(err error, fix string) string {
	if err != nil && storeerr.IsNodeFailure(err) {
		return "Redis could not serve it now (no answer in time, a lost connection, or a reply such as LOADING or OOM): see the round trip above, and run doctor again"
	}
	return fix
}

// clusterChecks checks a Cluster's state and, on every master, the settings a failover
// depends on.
func clusterChecks(ctx context.Context, c redis.UniversalClient, add func(check)) {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return
	}
	if info, err := cc.ClusterInfo(ctx).Result(); err != nil || field(info, "cluster_state") != "ok" {
		add(check{v: fail, name: "cluster", detail: fmt.Sprint("cluster_state ", field(info, "cluster_state"), " ", err), fix: "every slot must be served: redis-cli --cluster check"})
	} else {
		add(check{v: pass, name: "cluster", detail: "cluster_state ok, " + field(info, "cluster_known_nodes") + " nodes"})
	}
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		addr := m.Options().Addr
		cfg, err := m.ConfigGet(ctx, "cluster-*").Result()
		if err != nil {
			add(check{v: warn, name: "failover", detail: addr + ": CONFIG refused", fix: "set cluster-require-full-coverage no and a short cluster-node-timeout (docs/operations.md)"})
			return nil
		}
		if cfg["cluster-require-full-coverage"] == "yes" {
			add(check{v: warn, name: "failover", detail: addr + ": cluster-require-full-coverage yes", fix: "CONFIG SET cluster-require-full-coverage no: else one failed master stops every key (CLUSTERDOWN)"})
		}
		if ms, _ := strconv.Atoi(cfg["cluster-node-timeout"]); ms > 5000 {
			add(check{v: warn, name: "failover", detail: fmt.Sprintf("%s: cluster-node-timeout %d ms", addr, ms), fix: "its length is the outage of a failed master's keys: 1000-2000 ms"})
		}
		return nil
	})
	if err != nil {
		add(check{v: fail, name: "cluster", detail: err.Error(), fix: "every master must answer"})
	}
}

// field returns the value of name in an INFO-style reply ("name:value" lines).
func field(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
