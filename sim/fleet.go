package sim

import (
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// epoch is virtual instant 0 on every clock of the simulation (servers and Redis).
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// source is what made a decision, as counted in Result.Sources.
type source uint8

// Decision sources.
const (
	srcNaive source = iota
	srcScript
	srcLocal
	srcPrecheck
	srcLease
	srcPaced
	srcFallback
	srcGlobal   // hybrid, after waiting for a refill from the global bucket
	srcClosed   // hybrid, the server closed while the request waited (denied)
	srcReserved // hybrid, a claim on the bucket's refill (Scenario.Reserve), admitted when its holder acts
	nSources
)

var sourceNames = [nSources]string{"naive", "script", "local", "precheck", "lease", "paced", "fallback", "global", "closed", "reserved"}

func (s source) String() string { return sourceNames[s] }

// request is one client request travelling through the fleet.
type request struct {
	key    int
	n      int
	arrive time.Duration
}

// server is one application server.
type server struct {
	id    int
	name  string
	skew  time.Duration // how far its clock runs ahead of true (virtual) time
	alive bool
	state any // the strategy's per-server state
}

// clock is the server's reading of its own clock at virtual instant t.
func (s *server) clock(t time.Duration) time.Time { return epoch.Add(t + s.skew) }

// strategyImpl is what a strategy does with a request that reached a server.
type strategyImpl interface {
	// join prepares a server that enters the fleet.
	join(s *server) error
	// handle decides q on s, now or later, by calling fleet.decide exactly once.
	handle(s *server, q *request)
	// leave closes a server that leaves the fleet gracefully.
	leave(s *server)
}

// fleet is one run: the servers, the balancer, the demand, the network and Redis.
type fleet struct {
	sc    *Scenario
	e     events
	rng   *rand.Rand
	rec   *recorder
	redis redisSim
	strat strategyImpl

	servers  []*server // every server ever started, by id
	live     []*server // servers taking traffic now
	keys     []string  // client keys, by index
	bkeys    []string  // their buckets' Redis keys
	zipf     *rand.Zipf
	arriveFn func(int64) // f.arrive, bound once
	err      error
}

// keyName is client key k.
func (f *fleet) keyName(k int) string { return f.keys[k] }

// bucketKeyOf is the Redis key of client key k's bucket.
func (f *fleet) bucketKeyOf(k int) string { return f.bkeys[k] }

// fail records the first error of the run; Run returns it.
func (f *fleet) fail(err error) {
	if f.err == nil && err != nil {
		f.err = err
	}
}

// decide records q's decision now.
func (f *fleet) decide(q *request, allowed bool, src source) {
	f.rec.decide(q, f.e.now, allowed, src)
}

// resize grows or shrinks the live fleet to n servers.
func (f *fleet) resize(n int) {
	for len(f.live) > n {
		s := f.live[len(f.live)-1]
		f.live = f.live[:len(f.live)-1]
		s.alive = false
		f.strat.leave(s)
	}
	for len(f.live) < n {
		s := f.newServer()
		f.live = append(f.live, s)
		if err := f.strat.join(s); err != nil {
			f.fail(err)
		}
	}
}

func (f *fleet) newServer() *server {
	id := len(f.servers)
	s := &server{id: id, name: "srv" + strconv.Itoa(id), alive: true}
	if f.sc.FastBy != 0 && id == f.sc.FastServer {
		s.skew = f.sc.FastBy
	}
	f.servers = append(f.servers, s)
	return s
}

// pick is the load balancer: a live server for the next request.
func (f *fleet) pick() *server {
	n := len(f.live)
	if f.sc.Balancer == Sticky {
		return f.live[0]
	}
	if f.sc.Balancer == Skewed && n >= 10 {
		hot := n / 10
		if f.rng.IntN(2) == 0 {
			return f.live[f.rng.IntN(hot)]
		}
		return f.live[hot+f.rng.IntN(n-hot)]
	}
	return f.live[f.rng.IntN(n)]
}

// arrival returns the instant of request i (0-based) of the demand stream.
func (f *fleet) arrival(i int64) time.Duration {
	c := float64(i) + f.rng.Float64()
	var secs float64
	switch f.sc.Pattern {
	case Bursty:
		const period, on = 1.0, 0.2 // seconds
		perPeriod := f.sc.Demand * period
		k := math.Floor(c / perPeriod)
		secs = k*period + (c-k*perPeriod)/(f.sc.Demand/on)
	default:
		secs = c / f.sc.Demand
	}
	return time.Duration(secs * float64(time.Second))
}

// next schedules request i of the demand stream.
func (f *fleet) next(i int64) {
	if f.sc.Demand <= 0 {
		return
	}
	if t := f.arrival(i); t < f.sc.Duration {
		f.e.atArg(t, f.arriveFn, i)
	}
}

// arrive is request i reaching the load balancer.
func (f *fleet) arrive(i int64) {
	k := 0
	if f.zipf != nil {
		k = int(f.zipf.Uint64())
	}
	f.send(k)
	f.next(i + 1)
}

// send is a request for key k reaching the load balancer.
func (f *fleet) send(k int) { f.sendTo(k, f.pick()) }

// sendTo sends a request of key k to server sv.
func (f *fleet) sendTo(k int, sv *server) {
	q := &request{key: k, n: f.sc.Cost, arrive: f.e.now}
	f.rec.arrive(q)
	if b := f.rec.bin(f.e.now); b != nil {
		b.servers = len(f.live)
	}
	f.strat.handle(sv, q)
}

// redisSim is the Redis of the fleet, one master or a Cluster's (Scenario.Masters), and
// the network to it. Each master runs one command at a time in arrival order: a command
// that arrives while its master is busy waits. During the scenario's outage every master
// is a black hole, during its MasterDown the stopped one: commands arriving then are
// neither run nor answered, and only the caller's deadline ends the wait.
type redisSim struct {
	f        *fleet
	masters  []master
	busy     time.Duration // service time of every master spent before the end of the run's duration
	calls    int64         // commands sent before the end of the run's duration (a script call is one)
	trips    int64         // round trips sent before the end (a pipeline is one; a Cluster's, one per master)
	callsOut int64         // commands sent during the fault window (Scenario.measured)
}

// master is one Redis master's queue and load.
type master struct {
	busyUntil time.Duration
	steady    time.Duration // service time spent from steadyFrom to the end of the run's duration
	trips     int64         // round trips sent to it before the end
}

// steadyFrom is when a run's Redis load is steady: past the fleet's cold start, when every
// server asks once for each key it sees, the hot ones included. Result.MasterBusy is
// measured from then on.
func (sc *Scenario) steadyFrom() time.Duration { return min(time.Second, sc.Duration/4) }

// steady counts d of master ms's time from start in its steady load.
func (r *redisSim) steady(ms *master, start, d time.Duration) {
	sc := r.f.sc
	if from := sc.steadyFrom(); start+d > from && start < sc.Duration {
		ms.steady += min(start+d, sc.Duration) - max(start, from)
	}
}

// oneWay draws a one-way network delay: RTT/2 ± Jitter/2.
func (r *redisSim) oneWay() time.Duration {
	sc := r.f.sc
	d := sc.RTT / 2
	if sc.Jitter > 0 {
		d += time.Duration((r.f.rng.Float64() - 0.5) * float64(sc.Jitter))
	}
	return d
}

// roundTrip sends cmds commands costing cost of Redis time in one round trip to master m.
// exec runs when the master starts them, with Redis's clock; reply runs on the caller
// when the answer is back. Neither runs if the master is down when the commands arrive.
func (r *redisSim) roundTrip(m, cmds int, cost time.Duration, exec func(redisNow time.Time), reply func()) {
	sc := r.f.sc
	ms := &r.masters[m]
	if r.f.e.now <= sc.Duration {
		r.calls += int64(cmds)
		r.trips++
		ms.trips++
	}
	if sc.measured().Contains(r.f.e.now) {
		r.callsOut += int64(cmds)
	}
	e := &r.f.e
	e.after(r.oneWay(), func() {
		if sc.Outage.Contains(e.now) || sc.masterStopped(m, e.now) {
			return
		}
		start := max(e.now, ms.busyUntil)
		ms.busyUntil = start + cost
		if start < sc.Duration {
			r.busy += min(cost, sc.Duration-start)
		}
		r.steady(ms, start, cost)
		// Commands run in arrival order: running exec now, on the state as every earlier
		// arrival left it, with the clock at the instant Redis gets to it, is the same as
		// running it at that instant.
		if exec != nil {
			exec(epoch.Add(start))
		}
		e.at(ms.busyUntil+r.oneWay(), reply)
	})
}

// extend adds d of Redis time to master m's command that runs now (what a read costs,
// known once it ran): it delays what follows.
func (r *redisSim) extend(m int, d time.Duration) {
	ms := &r.masters[m]
	if start := ms.busyUntil; start < r.f.sc.Duration {
		r.busy += min(d, r.f.sc.Duration-start) // as roundTrip counts: Redis's time within the run
	}
	r.steady(ms, ms.busyUntil, d)
	ms.busyUntil += d
}
