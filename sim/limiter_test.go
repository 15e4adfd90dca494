package sim

import (
	"bytes"
	"context"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/minibits"
)

// limiterStrat runs every server of a simulated fleet as the production stack — a
// hybrid.Limiter with its own global.Store, breaker and go-redis client — on the fleet,
// demand, balancer and recorder of the simulator, inside its synctest bubble. One
// miniredis (with BITFIELD, package minibits) stands for Redis; a go-redis hook gives
// every round trip of scripts, and every windowed exchange, the simulator's network and
// Redis: a one-way delay out, a wait for Redis (one command at a time, in arrival order,
// each charged the Redis time the simulator charges it), the commands run with Redis's
// clock at the instant Redis gets to them, and the one-way delay back; during the
// outage, commands are neither run nor answered. Each request is a goroutine calling
// Limiter.AllowN at its arrival instant.
type limiterStrat struct {
	f    *fleet
	b    *bubble
	m    *miniredis.Miniredis
	lims map[int]*hybrid.Limiter
	log  breakerLog
	wg   sync.WaitGroup // Close calls in flight

	exec chan struct{} // one round trip runs its commands at a time
	// setup is set while a Limiter starts: its first trip (the record of
	// representations, which Ready waits for) runs at once and is not counted, as the
	// simulator's servers make it (hybridStrat.ready).
	setup atomic.Bool

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
	if err := minibits.Register(m); err != nil { // BITFIELD, which windowed limits use
		t.Fatal(err)
	}
	l := &limiterStrat{f: f, b: b, m: m, lims: map[int]*hybrid.Limiter{}, exec: make(chan struct{}, 1)}
	// Scripts are loaded as the simulator's are, so that no EVALSHA meets NOSCRIPT.
	c := l.client(nil)
	for _, src := range []string{luascript.TakeSource, luascript.RefundSource, luascript.HeartbeatSource, luascript.LowSource} {
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
		Dialer:                   func(context.Context, string, string) (net.Conn, error) { return l.dial(), nil },
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

// dial connects a client to miniredis over net.Pipe, as Miniredis.Dial does, but with
// replies that never wait for the client to read them. A net.Pipe holds no bytes: over
// it, a pipeline larger than miniredis's 4 KiB read buffer (a refund trip of some dozens
// of keys) deadlocks, go-redis writing the rest of its commands while miniredis writes the
// first reply, which go-redis reads only once it has written them all. A TCP connection's
// buffers take both; replyConn takes the replies.
func (l *limiterStrat) dial() net.Conn {
	c, s := net.Pipe()
	l.m.Server().ServeConn(newReplyConn(s))
	return c
}

// replyConn is miniredis's end of a net.Pipe: its writes (the replies, one Write per
// command) are queued and forwarded in order by a goroutine of their own, which ends
// when the connection is closed (miniredis closes it when the client leaves and when it
// closes).
type replyConn struct {
	net.Conn
	out    chan []byte
	closed chan struct{}
	once   sync.Once
}

func newReplyConn(c net.Conn) *replyConn {
	r := &replyConn{Conn: c, out: make(chan []byte, 1<<14), closed: make(chan struct{})}
	go func() {
		for {
			select {
			case p := <-r.out:
				if _, err := r.Conn.Write(p); err != nil {
					return
				}
			case <-r.closed:
				return
			}
		}
	}()
	return r
}

func (r *replyConn) Write(p []byte) (int, error) {
	select {
	case r.out <- bytes.Clone(p):
		return len(p), nil
	case <-r.closed:
		return 0, net.ErrClosed
	}
}

func (r *replyConn) Close() error {
	r.once.Do(func() { close(r.closed) })
	return r.Conn.Close()
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
	brk, err := breaker.New(sc.Breaker.settings(s.name, l.log.onChange(l.b, s.id, 0)))
	if err != nil {
		return err
	}
	l.log.track(s.id, 0, brk)
	cfg := engineConfig(sc, s.id)
	// Its goroutine starts, as the simulator's server does, now, and makes its first
	// trip, which Ready waits for: set-up, made at once and not counted. setup is set
	// before New, whose goroutine may reach Redis on another core before New returns.
	l.setup.Store(true)
	defer l.setup.Store(false)
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
	synctest.Wait()
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

// roundTrip is one round trip of n commands that keep Redis busy for cost: what
// redisSim.roundTrip does to the simulator's calls. run sends them to miniredis and
// returns the Redis time of what they answered (a windowed trip's read), known only
// once they ran; as in the simulator, they run when they arrive, in arrival order, with
// Redis's clock at the instant Redis gets to them.
func (l *limiterStrat) roundTrip(ctx context.Context, n int, cost time.Duration, run func(context.Context) (time.Duration, error)) error {
	sc := l.f.sc
	oneWay := sc.RTT / 2
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
		// A black hole: only the caller's deadline ends the wait, and the call returns
		// once breaker.Do has given it up, as the simulator's calls are (no answer:
		// Trip.Answered false). Were it to return at the deadline's very instant, it would
		// race Do's own timer, and a batch (hybrid.Limiter.doBatch) that wins that race
		// is Answered with every item timed out, which the engine takes otherwise (a
		// debt trip's items owed again one by one rather than the trip sent again whole).
		<-ctx.Done()
		time.Sleep(time.Nanosecond) // Do returns first: it is runnable at the deadline
		return ctx.Err()
	}
	l.exec <- struct{}{} // a channel, not a mutex: waiting for it is durable in the bubble
	l.mu.Lock()
	start := max(arrive, l.busyUntil)
	l.busyUntil = start + cost
	if start < sc.Duration {
		l.busy += min(cost, sc.Duration-start)
	}
	l.mu.Unlock()
	l.m.SetTime(epoch.Add(start))
	read, err := run(ctx)
	l.mu.Lock()
	l.busyUntil += read // delays what follows, as the simulator's readCost does
	if arrive < sc.Duration {
		l.busy += read
	}
	end := l.busyUntil
	l.mu.Unlock()
	<-l.exec
	time.Sleep(end + oneWay - l.since())
	return err
}

// netHook sends every script round trip of a client, and every pipeline of plain
// commands (a windowed limit's exchange, redisstore.Store.Windows; a read of low keys,
// redisstore.Store.LowBatch), through
// limiterStrat.roundTrip, charged as the simulator charges them (hybridStrat's trip).
type netHook struct{ l *limiterStrat }

func (netHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h netHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		_, cost, ok := h.l.cost(cmd)
		if !ok {
			return next(ctx, cmd)
		}
		if h.l.setup.Load() {
			h.l.m.SetTime(epoch.Add(h.l.since())) // Redis's clock, as the simulator's
			return next(ctx, cmd)
		}
		return h.l.roundTrip(ctx, 1, cost, func(ctx context.Context) (time.Duration, error) {
			err := next(ctx, cmd)
			return readCostOf(cmd), err
		})
	}
}

func (h netHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n, cost := 0, time.Duration(0)
		for _, c := range cmds {
			if m, d, ok := h.l.cost(c); ok {
				n, cost = n+m, cost+d
			}
		}
		if n == 0 {
			return next(ctx, cmds)
		}
		return h.l.roundTrip(ctx, n, cost, func(ctx context.Context) (time.Duration, error) {
			err := next(ctx, cmds)
			var read time.Duration
			for _, c := range cmds {
				read += readCostOf(c)
			}
			return read, err
		})
	}
}

// cost is what the simulator counts for command c (hybridStrat's trip): the calls and
// their Redis time. A script is one call of ScriptTime (a refund of several keys, one call
// of ScriptTime a key); a low-key exchange (luascript.Low),
// lowCost's: a plain command's time besides for each key it marks or unmarks. The
// commands of a windowed exchange are windowCost's; its read's time, which depends on
// its answer, is readCostOf's. ok is false for a command the simulator does not model
// (connection set-up), which goes straight to miniredis.
func (l *limiterStrat) cost(c redis.Cmder) (n int, cost time.Duration, ok bool) {
	sc := l.f.sc
	args := c.Args()
	switch strings.ToLower(c.Name()) {
	case "evalsha", "eval":
		// EVALSHA sha numkeys key memory n most ids... unmark...
		if len(args) >= 7 && (args[1] == luascript.Low.Hash() || args[1] == luascript.LowSource) {
			return 1, sc.ScriptTime + time.Duration(len(args)-7)*sc.CommandTime, true
		}
		if keys, ok := args[2].(int); ok && keys > 1 && (args[1] == luascript.Refund.Hash() || args[1] == luascript.RefundSource) {
			// Refunds of several keys in one call (redisstore.Store.RefundBatch): the
			// simulator charges each key's refund as a call of its own.
			return 1, time.Duration(keys) * sc.ScriptTime, true
		}
		return 1, sc.ScriptTime, true
	case "time", "zremrangebyscore", "pexpire":
		return 1, cmdCost.zCall, true
	case "bitfield": // BITFIELD key OVERFLOW SAT INCRBY type offset n ...
		cost = cmdCost.bfCall
		for _, a := range args {
			if s, ok := a.(string); ok && strings.EqualFold(s, "incrby") {
				cost += cmdCost.bfSub
			}
		}
		return 1, cost, true
	case "pexpireat":
		return 1, cmdCost.expire, true
	case "multi", "exec": // a windowed exchange's transaction: counted, not timed (hybridStrat.call)
		return 1, 0, true
	case "zadd": // ZADD key score member ...
		return 1, cmdCost.zCall + time.Duration((len(args)-2)/2)*cmdCost.zMember, true
	case "zrangebyscore":
		return 1, 0, true
	case "zrevrangebyscore": // a read of a set of low keys (lowCost)
		return 1, sc.CommandTime, true
	}
	return 0, 0, false
}

// readCostOf is the Redis time of c's answer: readCost's for a windowed exchange's read.
func readCostOf(c redis.Cmder) time.Duration {
	if z, ok := c.(*redis.ZSliceCmd); ok && strings.EqualFold(c.Name(), "zrangebyscore") {
		return cmdCost.zCall + time.Duration(len(z.Val()))*cmdCost.zRead
	}
	return 0
}

// comparable is a Result without what only one of the two runs measures: wall time and
// events of the simulator's own loop, and the load per master of its Redis queues.
func comparable(r Result) Result {
	r.WallMS, r.Events, r.MasterBusy, r.MasterRoundTrips = 0, 0, nil, nil
	return r
}

// TestSimTracksLimiter runs small fleets twice, on the same fleet, demand, network and
// Redis: once as the simulator runs them (one engine per server, its loop and timers as
// events) and once as real hybrid.Limiters (goroutines, go-redis, the breaker) in the
// simulator's synctest bubble. Both drive the same engine at the same instants, so
// every figure must be identical: admissions, Redis calls and round trips, the source of
// every decision, latencies, the timeline, the breakers, the outage. It covers the three
// kinds of limit: exact (Hybrid), charge-later (HybridAsync: charges and low-key
// exchanges) and windowed (HybridWindow: the windowed exchanges' pipelines).
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
		// The charge-later kind.
		{Name: "charge-later keys", Servers: 10, Duration: 2 * time.Second, Rate: 50, Burst: 50, Demand: 3000, Keys: 100, Policy: FailLocal, Async: DefaultAsync},
		{Name: "charge-later outage", Servers: 10, Duration: 3 * time.Second, Rate: 50, Burst: 50, Demand: 3000, Keys: 100, Outage: outage, Policy: FailLocal, Async: DefaultAsync},
		// The windowed kind.
		{Name: "windowed keys", Servers: 10, Duration: 2 * time.Second, Rate: 50, Burst: 50, Demand: 3000, Keys: 100, Policy: FailLocal, Windowed: DefaultWindowed},
		{Name: "windowed outage", Servers: 10, Duration: 3 * time.Second, Rate: 50, Burst: 50, Demand: 3000, Keys: 100, Outage: outage, Policy: FailLocal, Windowed: DefaultWindowed},
	}
	for _, sc := range cases {
		sc.Jitter = -1 // no draws from the run's random stream for the network
		st := Hybrid
		switch {
		case sc.Async > 0:
			st = HybridAsync
		case sc.Windowed > 0:
			st = HybridWindow
		}
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			sim, err := Run(t, sc, st)
			if err != nil {
				t.Fatal(err)
			}
			var prod Result
			synctest.Test(t, func(t *testing.T) {
				prod, err = simulate(sc, st, true, func(f *fleet, b *bubble) strategyImpl { return newLimiterStrat(t, f, b) })
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
	return time.AfterFunc(d, f).Stop
}

// hybridLimit is c as a hybrid.Limit: the same fields.
func hybridLimit(c engine.LimitConfig) hybrid.Limit {
	l := hybrid.Limit{
		Name: c.Name, Rate: c.Rate, Burst: c.Burst, Policy: c.Policy, PreRate: c.PreRate, PreBurst: c.PreBurst,
		MaxWait: c.MaxWait, MaxCost: c.MaxCost, MaxKeys: c.MaxKeys, Version: c.Version,
		Lease: hybrid.LeaseTuning{RefillInterval: c.RefillInterval, Lifetime: c.Lifetime, LowWatermark: c.LowWatermark},
	}
	switch {
	case c.Async > 0:
		l.Mode = hybrid.ChargeLater(c.Async)
	case c.Windowed > 0:
		l.Mode = hybrid.Windowed(c.Windowed)
	}
	for _, t := range c.Tiers {
		l.Tiers = append(l.Tiers, hybrid.Tier(t))
	}
	return l
}
