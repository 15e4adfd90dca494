package sim

import (
	"context"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/engine"
	"github.com/fleetlimit/fleetlimit/lua"
)

// limiterStrat runs every server of a simulated fleet as the production stack — a
// hybrid.Limiter with its own global.Store, breaker and go-redis client — on the fleet,
// demand, balancer and recorder of the simulator, inside its synctest bubble. One
// miniredis stands for Redis; a go-redis hook gives every script round trip the
// simulator's network and Redis: a one-way delay out, a wait for Redis (one command at a
// time, ScriptTime each, in arrival order), the commands run with Redis's clock at that
// instant, and the one-way delay back; during the outage, commands are neither run nor
// answered. Each request is a goroutine calling Limiter.AllowN at its arrival instant.
type limiterStrat struct {
	f    *fleet
	b    *bubble
	m    *miniredis.Miniredis
	lims map[int]*hybrid.Limiter
	log  breakerLog
	wg   sync.WaitGroup // Close calls in flight

	exec sync.Mutex // one round trip runs its commands at a time

	mu sync.Mutex
	// The fields below are guarded by mu.
	busyUntil              time.Duration
	calls, trips, callsOut int64
	busy                   time.Duration
	decided                []decidedReq
}

type decidedReq struct {
	q   *request
	d   hybrid.Decision
	err error
	at  time.Duration
}

func newLimiterStrat(t *testing.T, f *fleet, b *bubble) strategyImpl {
	m := miniredis.NewMiniRedis()
	m.SetTime(epoch)
	m.ClockTTL(true)
	c0, err := m.Dial() // starts the server without a listener
	if err != nil {
		t.Fatal(err)
	}
	c0.Close()
	l := &limiterStrat{f: f, b: b, m: m, lims: map[int]*hybrid.Limiter{}}
	// Scripts are loaded as the simulator's are, so that no EVALSHA meets NOSCRIPT.
	c := l.client(nil)
	for _, src := range []string{lua.TakeSource, lua.RefundSource, lua.HeartbeatSource} {
		if err := c.ScriptLoad(context.Background(), src).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	// The run ends at Duration + 1 minute: just before, its last decisions are taken; then
	// the Limiters close (the simulator's servers do not).
	f.e.at(f.sc.Duration+time.Minute-time.Millisecond, l.end)
	return l
}

// client returns a go-redis client of miniredis whose script round trips go through the
// simulated network (hook), configured as global.Configure does.
func (l *limiterStrat) client(hook redis.Hook) *redis.Client {
	opts := &redis.Options{
		Addr:                     "127.0.0.1:6379", // never dialled: the Dialer is
		Dialer:                   func(context.Context, string, string) (net.Conn, error) { return l.m.Dial() },
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	global.Configure(opts)
	opts.ReadTimeout, opts.WriteTimeout = time.Minute, time.Minute // the hook's delays are the network's
	c := redis.NewClient(opts)
	if hook != nil {
		c.AddHook(hook)
	}
	return c
}

// since is the virtual instant of the bubble's clock.
func (l *limiterStrat) since() time.Duration { return time.Since(l.b.base) }

func (l *limiterStrat) join(s *server) error {
	l.b.sync()
	sc := l.f.sc
	c := l.client(netHook{l})
	store, err := global.New(c, global.ServerID(s.name))
	if err != nil {
		return err
	}
	brk, err := breaker.New(sc.Breaker.settings(s.name, l.log.onChange(l.b, s.id)))
	if err != nil {
		return err
	}
	l.log.track(s.id, brk)
	cfg := engineConfig(sc, s.id)
	lim, err := hybrid.New(store, hybrid.Config{
		Limits:            []hybrid.Limit{hybridLimit(cfg.Limits[0])},
		FleetSize:         cfg.Servers,
		Fleet:             cfg.Fleet,
		HeartbeatInterval: cfg.HeartbeatInterval,
		Seed:              cfg.Seed,
		Breaker:           brk,
		Clock:             serverClock{s, l},
	})
	if err != nil {
		return err
	}
	l.lims[s.id] = lim
	synctest.Wait() // its goroutine starts, as the simulator's server does, now
	return nil
}

func (l *limiterStrat) handle(s *server, q *request) {
	l.b.sync()
	l.record()
	lim := l.lims[s.id]
	go func() {
		d, err := lim.AllowN(context.Background(), limitName, l.f.keyName(q.key), q.n)
		at := l.since()
		l.mu.Lock()
		l.decided = append(l.decided, decidedReq{q, d, err, at})
		l.mu.Unlock()
	}()
	synctest.Wait()
	l.record()
}

// record counts the decisions made so far, at the instants they were made.
func (l *limiterStrat) record() {
	l.mu.Lock()
	ds := l.decided
	l.decided = nil
	l.mu.Unlock()
	for _, r := range ds {
		d := engine.Decision{Allowed: r.d.Allowed, Source: engine.Source(r.d.Source), Reason: engine.Reason(r.d.Reason)}
		l.f.rec.decide(r.q, r.at, r.d.Allowed, sourceOf(d))
	}
}

func (l *limiterStrat) leave(s *server) {
	l.b.sync()
	lim := l.lims[s.id]
	delete(l.lims, s.id)
	l.wg.Go(func() { _ = lim.Close(context.Background()) })
	synctest.Wait()
}

// end is the last instant of the run: every decision is in, Redis has been measured (as
// the simulator does, calls sent within the run's duration), and the Limiters close.
func (l *limiterStrat) end() {
	l.b.sync()
	l.record()
	l.mu.Lock()
	r := &l.f.redis
	r.calls, r.trips, r.callsOut, r.busy = l.calls, l.trips, l.callsOut, l.busy
	l.mu.Unlock()
	for id, lim := range l.lims {
		delete(l.lims, id)
		l.wg.Go(func() { _ = lim.Close(context.Background()) })
	}
	l.wg.Wait()
	l.m.Close()
}

func (l *limiterStrat) report(sc *Scenario, res *Result) { l.log.report(sc, res) }

// roundTrip is one round trip of n script commands: what redisSim.roundTrip does to the
// simulator's calls. run sends them to miniredis.
func (l *limiterStrat) roundTrip(ctx context.Context, n int, run func(context.Context) error) error {
	sc := l.f.sc
	oneWay := sc.RTT / 2
	cost := time.Duration(n) * sc.ScriptTime
	l.mu.Lock()
	if l.since() <= sc.Duration {
		l.calls += int64(n)
		l.trips++
		if sc.measured().Contains(l.since()) {
			l.callsOut += int64(n)
		}
	}
	l.mu.Unlock()
	time.Sleep(oneWay)
	arrive := l.since()
	if sc.Outage.Contains(arrive) {
		<-ctx.Done() // a black hole: only the caller's deadline ends the wait
		return ctx.Err()
	}
	l.mu.Lock()
	start := max(arrive, l.busyUntil)
	l.busyUntil = start + cost
	if start < sc.Duration {
		l.busy += min(cost, sc.Duration-start)
	}
	end := l.busyUntil
	l.mu.Unlock()
	time.Sleep(start - arrive)
	l.exec.Lock()
	l.m.SetTime(epoch.Add(start))
	err := run(ctx)
	l.exec.Unlock()
	time.Sleep(end + oneWay - l.since())
	return err
}

// netHook sends every script round trip of a client through limiterStrat.roundTrip.
type netHook struct{ l *limiterStrat }

func (netHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h netHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isScript(cmd) {
			return next(ctx, cmd)
		}
		return h.l.roundTrip(ctx, 1, func(ctx context.Context) error { return next(ctx, cmd) })
	}
}

func (h netHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, c := range cmds {
			if isScript(c) {
				n++
			}
		}
		if n == 0 {
			return next(ctx, cmds)
		}
		return h.l.roundTrip(ctx, n, func(ctx context.Context) error { return next(ctx, cmds) })
	}
}

func isScript(c redis.Cmder) bool {
	name := strings.ToLower(c.Name())
	return name == "evalsha" || name == "eval"
}

// comparable is a Result without what only one of the two runs measures: wall time and
// events of the simulator's own loop.
func comparable(r Result) Result {
	r.WallMS, r.Events = 0, 0
	return r
}

// TestSimTracksLimiter runs small fleets twice, on the same fleet, demand, network and
// Redis: once as the simulator runs them (one engine per server, its loop and timers as
// events) and once as real hybrid.Limiters (goroutines, go-redis, the breaker) in the
// simulator's synctest bubble. Both drive the same engine at the same instants, so
// every figure must be identical: admissions, Redis calls and round trips, the source of
// every decision, latencies, the timeline, the breakers, the outage.
func TestSimTracksLimiter(t *testing.T) {
	t.Parallel() // beside the other long tests of the package: two cores stay busy
	outage := Window{Start: time.Second, End: 2 * time.Second}
	cases := []Scenario{
		{Name: "hot", Servers: 10, Duration: 2 * time.Second, Rate: 2000, Burst: 200, Demand: 3000, Policy: FailLocal},
		{Name: "abusive", Servers: 20, Duration: 5 * time.Second, Rate: 20, Burst: 20, Demand: 2000, Policy: FailLocal},
		{Name: "wide", Servers: 50, Duration: 2 * time.Second, Rate: 10000, Burst: 1000, Demand: 15000, Policy: FailLocal},
		{Name: "keys", Servers: 10, Duration: 2 * time.Second, Rate: 50, Burst: 50, Demand: 3000, Keys: 100, Policy: FailLocal},
		{Name: "skewed", Servers: 20, Duration: 2 * time.Second, Rate: 2000, Burst: 200, Demand: 3000, Balancer: Skewed, Policy: FailLocal},
		// Redis stops answering for a second, under each policy: the breakers, the
		// fallback and the recovery must match too.
		{Name: "outage fail-local", Servers: 10, Duration: 3 * time.Second, Rate: 2000, Burst: 200, Demand: 3000, Outage: outage, Policy: FailLocal},
		{Name: "outage fail-closed", Servers: 10, Duration: 3 * time.Second, Rate: 2000, Burst: 200, Demand: 3000, Outage: outage, Policy: FailClosed},
		{Name: "outage fail-open", Servers: 10, Duration: 3 * time.Second, Rate: 2000, Burst: 200, Demand: 3000, Outage: outage, Policy: FailOpen},
		// Servers leave (their Limiters close and refund) and join, and count each other
		// with heartbeats.
		{Name: "churn", Servers: 10, Duration: 3 * time.Second, Rate: 2000, Burst: 200, Demand: 3000, Policy: FailLocal,
			Churn: []Change{{At: 700 * time.Millisecond, Servers: 6}, {At: 1400 * time.Millisecond, Servers: 12}}, Heartbeat: 300 * time.Millisecond},
	}
	for _, sc := range cases {
		sc.Jitter = -1 // no draws from the run's random stream for the network
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			sim, err := Run(t, sc, Hybrid)
			if err != nil {
				t.Fatal(err)
			}
			var prod Result
			synctest.Test(t, func(t *testing.T) {
				prod, err = simulate(sc, Hybrid, true, func(f *fleet, b *bubble) strategyImpl { return newLimiterStrat(t, f, b) })
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("simulator: %d of %d admitted, %d Redis calls, sources %v", sim.Admitted, sim.Requests, sim.RedisCalls, sim.Sources)
			t.Logf("Limiters:  %d of %d admitted, %d Redis calls, sources %v", prod.Admitted, prod.Requests, prod.RedisCalls, prod.Sources)
			if sim.RedisCalls == 0 || sim.Admitted == 0 {
				t.Fatal("nothing happened: the comparison proves nothing")
			}
			if a, b := comparable(sim), comparable(prod); !reflect.DeepEqual(a, b) {
				t.Errorf("the simulator and the Limiters differ:\nsimulator %+v\nLimiters  %+v", a, b)
			}
		})
	}
}

// serverClock is server s's clock in the bubble: the simulator's reading of it (its skew
// included); its timers are the bubble's.
type serverClock struct {
	s *server
	l *limiterStrat
}

func (c serverClock) Now() time.Time { return c.s.clock(c.l.since()) }

func (serverClock) AfterFunc(d time.Duration, f func()) func() bool {
	return breaker.SystemClock{}.AfterFunc(d, f)
}

// hybridLimit is c as a hybrid.Limit: the same fields.
func hybridLimit(c engine.LimitConfig) hybrid.Limit {
	l := hybrid.Limit{
		Name: c.Name, Rate: c.Rate, Burst: c.Burst, Policy: c.Policy, PreRate: c.PreRate, PreBurst: c.PreBurst,
		MaxWait: c.MaxWait, MaxCost: c.MaxCost, MaxKeys: c.MaxKeys, Version: c.Version,
		Lease: hybrid.LeaseTuning{RefillInterval: c.RefillInterval, Lifetime: c.Lifetime, LowWatermark: c.LowWatermark},
	}
	for _, t := range c.Tiers {
		l.Tiers = append(l.Tiers, hybrid.Tier(t))
	}
	return l
}
