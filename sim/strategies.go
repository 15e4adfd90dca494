package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/fallback"
	"github.com/fleetlimit/fleetlimit/internal/luamodel"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/internal/wire"
	"github.com/fleetlimit/fleetlimit/local"
)

// naive is the article's broken read-modify-write: HMGET, compute in the application with
// the server's clock, HSET + PEXPIRE. Other servers' commands interleave between the read
// and the write, so every server that read the same state admits against it.
type naive struct {
	f *fleet
	m *luamodel.Model
}

func (n *naive) join(*server) error { return nil }
func (n *naive) leave(*server)      {}

func (n *naive) handle(s *server, q *request) {
	f, sc := n.f, n.f.sc
	key := f.bucketKeyOf(q.key)
	capacity, r := float64(sc.Burst), sc.Rate
	var tokens, ts float64
	var okT, okTS bool
	f.redis.roundTrip(sc.masterOf(key), 1, sc.CommandTime, func(at time.Time) {
		tokens, ts, okT, okTS = n.m.HMGet(at, key)
	}, func() {
		now := luamodel.NowMillis(s.clock(f.e.now))
		if !okT {
			tokens = capacity
		}
		if !okTS {
			ts = now
		}
		tokens = math.Min(capacity, tokens+math.Max(0, now-ts)/1000*r)
		allowed := tokens >= float64(q.n)
		if allowed {
			tokens -= float64(q.n)
		}
		t := tokens
		f.redis.roundTrip(sc.masterOf(key), 2, 2*sc.CommandTime, func(at time.Time) {
			n.m.HSetExpire(at, key, t, now, tokenbucket.TTLMillis(capacity, r))
		}, func() {
			f.decide(q, allowed, srcNaive)
		})
	})
}

// perRequest runs one bucket script per request: luascript.Bucket (Redis TIME), or the
// caller-clock variant.
type perRequest struct {
	f           *fleet
	s           scripts
	callerClock bool
}

func (p *perRequest) join(*server) error { return nil }
func (p *perRequest) leave(*server)      {}

func (p *perRequest) handle(s *server, q *request) {
	f, sc := p.f, p.f.sc
	key := f.bucketKeyOf(q.key)
	sent := luamodel.NowMillis(s.clock(f.e.now)) // the caller's clock, read when it sends
	var r wire.BucketReply
	f.redis.roundTrip(sc.masterOf(key), 1, sc.ScriptTime, func(at time.Time) {
		if p.callerClock {
			r = p.s.BucketCallerClock(at, key, float64(sc.Burst), sc.Rate, float64(q.n), sent)
			return
		}
		r = p.s.Bucket(at, key, float64(sc.Burst), sc.Rate, float64(q.n))
	}, func() {
		f.decide(q, r.Allowed, srcScript)
	})
}

// localOnly gives every server its share of the limit, as FailLocal does (rate/servers,
// burst max(⌈burst/servers⌉, cost)), for the fleet size it was configured with, and never
// talks to Redis.
type localOnly struct {
	f *fleet
}

func (l *localOnly) join(s *server) error {
	sc := l.f.sc
	r, b := fallback.Share(sc.Rate, sc.Burst, sc.Servers, sc.Cost)
	lim, err := local.NewLimiter(local.Config{Rate: r, Burst: b, MaxKeys: max(sc.Keys, 1024)})
	if err != nil {
		return fmt.Errorf("sim: local limiter: %w", err)
	}
	s.state = lim
	return nil
}

func (l *localOnly) leave(s *server) { s.state.(*local.Limiter).Close() }

func (l *localOnly) handle(s *server, q *request) {
	f := l.f
	f.decide(q, s.state.(*local.Limiter).AllowN(s.clock(f.e.now), f.keyName(q.key), q.n), srcLocal)
}
