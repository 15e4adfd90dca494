package sim

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/engine"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Strategy is a way of enforcing one fleet-wide limit from every server of a fleet.
type Strategy string

// The strategies the simulator compares.
const (
	// Naive reads the bucket (HMGET), computes in application code with the server's clock
	// and writes it back (HSET + PEXPIRE): two round trips that other servers' commands
	// interleave with, the race of the source article's trace.
	Naive Strategy = "naive"
	// Script runs the seed script (luascript.Bucket, Redis TIME) on every request.
	Script Strategy = "script"
	// ScriptCallerClock runs the article's script changed to trust the caller's clock
	// (now passed as an argument, ts = now): the mistake the article warns about.
	ScriptCallerClock Strategy = "script-caller-clock"
	// Hybrid is fleetlimit's two tiers, as hybrid.Limiter runs them on every server (the
	// same engine): a local pre-check, token leases from the global bucket (luascript.Take and
	// luascript.Refund on miniredis), and the failure policy when Redis does not answer in time.
	Hybrid Strategy = "hybrid"
	// HybridAsync is Hybrid with the limit's Async set (the scenario's, 100ms if it sets
	// none): a request a lease cannot serve is admitted without waiting for Redis unless
	// its server knows the key low, and charged to the bucket within Async.
	HybridAsync Strategy = "hybrid-async"
	// HybridWindow is Hybrid with the limit windowed (the scenario's Windowed; if it sets
	// none, 120ms or half the window, Burst/Rate, if shorter): counted windows in Redis's shared arrays, no script, each server
	// reporting every Windowed (hybrid.Windowed).
	HybridWindow Strategy = "hybrid-window"
	// LocalOnly gives each server its share of the limit (rate/servers, burst
	// max(⌈burst/servers⌉, cost)), as FailLocal does, and never talks to Redis.
	LocalOnly Strategy = "local-only"
)

// DefaultAsync is HybridAsync's Async when the scenario sets none.
const DefaultAsync = 100 * time.Millisecond

// DefaultWindowed is HybridWindow's Windowed when the scenario sets none and its window
// is at least twice as long.
const DefaultWindowed = 120 * time.Millisecond

// Pattern is how a client's demand is spread over time.
type Pattern string

// Demand patterns.
const (
	// Steady demand arrives evenly: request i at (i+u)/rate, u uniform in [0,1), so a run
	// of T seconds has exactly rate·T requests.
	Steady Pattern = "steady"
	// Bursty demand arrives in on/off waves: in each second, all of it in the first 200 ms
	// (5× the average rate), nothing in the other 800 ms.
	Bursty Pattern = "bursty"
)

// Balancer is how the load balancer spreads requests over the live servers.
type Balancer string

// Load balancers.
const (
	// Uniform picks a live server uniformly at random for each request.
	Uniform Balancer = "uniform"
	// Skewed sends half of the requests to the first 10% of the live servers.
	Skewed Balancer = "skewed"
	// Sticky sends every request to the first live server, as a client that keeps one
	// connection open (HTTP keep-alive) reaches one server however many there are.
	Sticky Balancer = "sticky"
)

// Policy is what a hybrid limit does when Redis does not answer in time.
type Policy string

// Failure policies (the breaker package's, by name).
const (
	// FailOpen admits every request the global tier cannot decide.
	FailOpen Policy = "fail-open"
	// FailClosed denies every request the global tier cannot decide.
	FailClosed Policy = "fail-closed"
	// FailLocal decides with a conservative local limit: each server's share of the
	// fleet-wide limit, rate/servers with a burst of max(⌈burst/servers⌉, cost).
	FailLocal Policy = "fail-local"
)

// Window is a stretch of virtual time, measured from the start of the run.
type Window struct {
	Start, End time.Duration
}

// Contains reports whether t is in [Start, End).
func (w Window) Contains(t time.Duration) bool { return t >= w.Start && t < w.End }

// measured returns the window a Result measures apart: the outage, else the partition,
// else the stopped master, else the starvation (a scenario has at most one of them).
func (sc *Scenario) measured() Window {
	switch {
	case sc.Outage.End > sc.Outage.Start:
		return sc.Outage
	case sc.Partition.End > sc.Partition.Start:
		return sc.Partition
	case sc.MasterDown.End > sc.MasterDown.Start:
		return sc.MasterDown
	}
	return sc.Starve
}

// affected reports whether the breaker of server id for master m (0 on one Redis) is one
// the measured fault acts on: every server's in an outage, the cut-off ones' in a
// partition, the stopped master's in a master's stop, the starved ones' in a starvation.
func (sc *Scenario) affected(id, m int) bool {
	switch {
	case sc.Outage.End > sc.Outage.Start:
		return true
	case sc.Partition.End > sc.Partition.Start:
		return id < sc.PartitionServers
	case sc.MasterDown.End > sc.MasterDown.Start:
		return m == sc.DownMaster
	}
	return id < sc.StarvedServers
}

// masterOf returns the master that serves Redis key key: the one whose slot range holds
// its hash slot (wire.Slot), the slots cut into Masters contiguous ranges in order, as
// CLUSTER ADDSLOTSRANGE gives a new Cluster's masters their slots.
func (sc *Scenario) masterOf(key string) int {
	if sc.Masters <= 1 {
		return 0
	}
	return wire.Slot(key) * sc.Masters / wire.Slots
}

// masterStopped reports whether master m answers nothing at virtual instant t.
func (sc *Scenario) masterStopped(m int, t time.Duration) bool {
	return m == sc.DownMaster && sc.MasterDown.Contains(t)
}

// cutOff reports whether server id is cut off from Redis at virtual instant t.
func (sc *Scenario) cutOff(id int, t time.Duration) bool {
	return id < sc.PartitionServers && sc.Partition.Contains(t)
}

// runsAt returns the first instant at or after t at which the process of server id runs:
// t itself, unless the server is starved and t falls between two of its runs. A starved
// server runs StarveRun at the start of every StarvePeriod, at a phase of its own drawn
// from the seed, so that the starved servers do not all run at once.
func (sc *Scenario) runsAt(id int, t time.Duration) time.Duration {
	if id >= sc.StarvedServers || !sc.Starve.Contains(t) {
		return t
	}
	phase := time.Duration(mix(sc.Seed, uint64(id), starvePhase) % uint64(sc.StarvePeriod))
	in := (t - sc.Starve.Start + phase) % sc.StarvePeriod
	if in < sc.StarveRun {
		return t
	}
	return min(t+sc.StarvePeriod-in, sc.Starve.End)
}

// starvePhase sets the starved servers' phases apart from the other draws of a seed.
const starvePhase = 0x57a12e

// Change resizes the fleet at a virtual instant: servers leave (the last ones, closing
// gracefully) or join (fresh, with empty state).
type Change struct {
	At      time.Duration
	Servers int
}

// Scenario fixes everything about one simulated run but the strategy. Rate, Burst and
// Policy are required; other zero fields take the defaults of a built-in scenario: 200 servers,
// 10 s, RTT 0.5 ms ± 0.1 ms, 8 µs per script call. In JSON (a file for
// `go test ./sim -args -scenario FILE`), its keys are the field names and durations
// are strings: see UnmarshalJSON.
type Scenario struct {
	// Name identifies the scenario in tables, reports and plot files.
	Name string
	// Servers is the fleet size at the start. default: 200
	Servers int
	// Duration is the virtual time during which requests arrive. default: 10s
	Duration time.Duration
	// RTT is the mean network round trip between a server and Redis. default: 500µs
	RTT time.Duration
	// Jitter spreads each round trip uniformly over RTT ± Jitter. default: 100µs;
	// negative means none.
	Jitter time.Duration
	// ScriptTime is the Redis time one script call costs; Redis runs one command at a
	// time, in arrival order, so more than 1/ScriptTime calls per second queue. default: 8µs
	ScriptTime time.Duration
	// CommandTime is the Redis time of a plain command (HMGET, HSET, PEXPIRE). default: 2µs
	CommandTime time.Duration

	// Rate and Burst are the limit, per key, fleet-wide (tokens per second, bucket size).
	Rate  float64
	Burst int
	// Demand is the fleet-wide request rate, all keys together, requests per second.
	Demand float64
	// Pattern spreads demand over time. default: Steady
	Pattern Pattern
	// Keys is the number of client keys; with more than one, each request's key is drawn
	// from a Zipf distribution with exponent ZipfS (default 1.1). default: 1
	Keys  int
	ZipfS float64
	// Cost is the tokens each request takes. default: 1
	Cost int
	// Balancer spreads requests over servers. default: Uniform
	Balancer Balancer

	// Outage makes Redis a black hole (no answers) during the window.
	Outage Window
	// Partition cuts the first PartitionServers servers off Redis during its window
	// (their calls go nowhere; the other servers' go through): a partial partition. The
	// hybrid strategy sees it; the per-request strategies do not. It is measured as an
	// outage is, in Result.Partition.
	Partition        Window
	PartitionServers int
	// Masters is the number of Redis masters: more than one makes Redis a Cluster, each
	// Redis key served by the master whose contiguous range of the 16384 hash slots holds
	// the slot of its hash tag (wire.Slot), each master a queue of its own. A hybrid
	// server then has a breaker per master, as hybrid.Limiter has on a Cluster: a round
	// trip is split by master, each part through its master's breaker, and a key whose
	// master's breaker is open goes to the policy without waiting. Result.MasterBusy
	// gives each master's busy share. default: 1
	Masters int
	// WindowShards is the number of shards a windowed limit is counted in
	// (engine.LimitConfig.WindowShards): hybrid.Limiter counts in one on one Redis and
	// in wire.WindowShards on a Cluster, of any number of masters. default: 1
	WindowShards int
	// LowShards is the number of sets a charge-later limit marks its low keys in
	// (engine.LimitConfig.LowShards): hybrid.Limiter marks them in one on one Redis and
	// in wire.LowShards on a Cluster. default: 1
	LowShards int
	// MasterDown stops master DownMaster (0-based) during its window: it answers nothing,
	// as an outage does, and the other masters run on. It is measured as an outage is,
	// in Result.MasterDown.
	MasterDown Window
	DownMaster int
	// Starve makes the first StarvedServers servers CPU-starved during its window, while
	// Redis and the network stay healthy: the process of a starved server is scheduled
	// only StarveRun at the start of every StarvePeriod (both required with Starve), as
	// one of many busy processes sharing a few cores is. Between its runs nothing of it
	// happens: requests that reach it and Redis's answers wait to be read, and its timers
	// (each breaker call's deadline, each request's MaxWait, the engine's ticks) fire
	// when it runs again. It runs its timers first, as Go's scheduler runs expired timers
	// before it polls the network, so a call whose answer came back while the process
	// was not running and whose deadline passed meanwhile times out, and the breaker sees
	// how late. The hybrid strategy sees it; the other strategies do not. It is measured
	// as an outage is, in Result.Starve.
	Starve                  Window
	StarvedServers          int
	StarveRun, StarvePeriod time.Duration
	// Policy is the hybrid strategy's failure policy. Required, as for a hybrid.Limit:
	// there is no default.
	Policy Policy
	// MaxWait, PreRate, PreBurst and MaxKeys are the hybrid.Limit fields of the same
	// names, RefillInterval, Lifetime and LowWatermark those of its Lease, with the same
	// defaults (MaxWait 10ms).
	MaxWait        time.Duration
	PreRate        float64
	PreBurst       int
	RefillInterval time.Duration
	Lifetime       time.Duration
	LowWatermark   float64
	MaxKeys        int
	// Async is hybrid.ChargeLater's duration: when positive, a request the lease
	// cannot serve is admitted without waiting for Redis unless the server knows its key
	// is low, and charged to the bucket within Async.
	Async time.Duration
	// Windowed is hybrid.Windowed's report interval: when positive, the limit is
	// windowed, each server reporting every Windowed.
	Windowed time.Duration
	// Reserve makes every request of the hybrid strategies a reservation, as
	// hybrid.Limiter.ReserveN makes it: a request the lease denies but that may pass
	// later claims its tokens from the key's bucket, below zero down to minus the burst,
	// and is admitted when its holder acts, once the bucket is back at zero (source
	// "reserved"); a claim Redis refuses is denied as the lease denied it.
	Reserve bool
	// Breaker configures each server's breaker.Breaker, as breaker.Settings does.
	Breaker BreakerSettings

	// FastServer, when FastBy is non-zero, is the index of a server whose clock runs FastBy
	// ahead of everyone else's.
	FastServer int
	FastBy     time.Duration

	// Churn resizes the fleet during the run.
	Churn []Change
	// LimitChanges change the limit's Rate and Burst during the run, reaching the
	// servers over a spread of time (hybrid strategies only); Result.LimitChanges
	// measures the hottest key around each.
	LimitChanges []LimitChange
	// AlsoLimits are other limits every request counts against, all or nothing
	// (hybrid.Limiter.AllowMulti), before its own key's: per tenant, global (hybrid
	// strategies only). Result.Also measures each.
	AlsoLimits []AlsoLimit
	// Heartbeat, when set, makes the hybrid strategy's servers count each other in Redis,
	// as a hybrid.Config with Fleet set does: each makes a heartbeat call every Heartbeat
	// (a Redis call, counted as one) and divides the limit by the live count it answers.
	// Zero: every server divides by Servers throughout, as with FleetSize alone.
	Heartbeat time.Duration

	// GoModel runs the hybrid strategy's scripts on the simulator's Go model of them instead
	// of on miniredis: much faster with many keys (miniredis ages every key's TTL on every
	// command), and held to the same answers by internal/luamodel's differential tests and
	// TestModelRunsMatchMiniredis. The per-request strategies always run on the model.
	GoModel bool

	// Seed makes the run reproducible: the same scenario, strategy and seed give the same
	// result. default: 1
	Seed uint64

	// cold holds the options of the cold-key scenarios (cold_test.go); the zero value
	// changes nothing.
	cold coldOpts
}

// BreakerSettings are the breaker.Settings a scenario can set; zero fields take the
// breaker package's defaults (Timeout 10ms, FailureThreshold 5, OpenTimeout 1s,
// HalfOpenProbes 1, MaxInFlight 64, MinCountedTimeout Timeout/2).
type BreakerSettings struct {
	Timeout           time.Duration
	MinCountedTimeout time.Duration
	MaxInFlight       int
	FailureThreshold  int
	OpenTimeout       time.Duration
	HalfOpenProbes    int
}

// breakerTimeout is a breaker's Timeout when Settings.Timeout is zero, the call deadline
// a scenario's servers run with unless it sets one (TestBreakerTimeout holds it to
// package breaker's).
const breakerTimeout = 10 * time.Millisecond

// settings returns s as breaker.Settings for server name, its state changes told to
// onChange.
func (s BreakerSettings) settings(name string, onChange func(from, to breaker.State)) breaker.Settings {
	return breaker.Settings{Name: name, Timeout: s.Timeout, MinCountedTimeout: s.MinCountedTimeout,
		MaxInFlight: s.MaxInFlight, FailureThreshold: s.FailureThreshold, OpenTimeout: s.OpenTimeout,
		HalfOpenProbes: s.HalfOpenProbes, OnStateChange: onChange}
}

// ErrInvalidScenario is wrapped by every error Run returns for a scenario it cannot run.
var ErrInvalidScenario = errors.New("sim: invalid scenario")

// withDefaults fills zero fields and checks the rest.
func (sc Scenario) withDefaults() (Scenario, error) {
	if sc.Servers == 0 {
		sc.Servers = 200
	}
	if sc.Duration == 0 {
		sc.Duration = 10 * time.Second
	}
	if sc.RTT == 0 {
		sc.RTT = 500 * time.Microsecond
	}
	switch {
	case sc.Jitter == 0:
		sc.Jitter = 100 * time.Microsecond
	case sc.Jitter < 0:
		sc.Jitter = 0
	}
	if sc.ScriptTime == 0 {
		sc.ScriptTime = 8 * time.Microsecond
	}
	if sc.CommandTime == 0 {
		sc.CommandTime = 2 * time.Microsecond
	}
	if sc.Pattern == "" {
		sc.Pattern = Steady
	}
	if sc.Keys == 0 {
		sc.Keys = 1
	}
	if sc.ZipfS == 0 {
		sc.ZipfS = 1.1
	}
	if sc.Cost == 0 {
		sc.Cost = 1
	}
	if sc.Balancer == "" {
		sc.Balancer = Uniform
	}
	if sc.MaxWait == 0 {
		sc.MaxWait = engine.DefaultMaxWait
	}
	if sc.Breaker.Timeout == 0 {
		sc.Breaker.Timeout = breakerTimeout
	}
	if sc.Seed == 0 {
		sc.Seed = 1
	}
	if sc.Masters == 0 {
		sc.Masters = 1
	}
	bad := func(format string, args ...any) (Scenario, error) {
		return sc, fmt.Errorf("%w: %s", ErrInvalidScenario, fmt.Sprintf(format, args...))
	}
	switch {
	case sc.Servers < 1:
		return bad("servers %d < 1", sc.Servers)
	case sc.Duration < 0 || sc.RTT < 0 || sc.ScriptTime < 0 || sc.CommandTime < 0:
		return bad("negative duration")
	case sc.Jitter > sc.RTT:
		return bad("jitter %v exceeds the round trip %v", sc.Jitter, sc.RTT)
	case tokenbucket.Check(sc.Rate, sc.Burst) != nil:
		return bad("%v", tokenbucket.Check(sc.Rate, sc.Burst))
	case !(sc.Demand >= 0) || math.IsInf(sc.Demand, 0):
		return bad("demand %v must be a finite number >= 0", sc.Demand)
	case sc.Pattern != Steady && sc.Pattern != Bursty:
		return bad("unknown pattern %q", sc.Pattern)
	case sc.Keys < 1:
		return bad("keys %d < 1", sc.Keys)
	case sc.Keys > 1 && !(sc.ZipfS > 1):
		return bad("zipf exponent %v must be > 1", sc.ZipfS)
	case sc.Cost < 1 || sc.Cost > sc.Burst:
		return bad("cost %d must be in [1, burst]", sc.Cost)
	case sc.Balancer != Uniform && sc.Balancer != Skewed && sc.Balancer != Sticky:
		return bad("unknown balancer %q", sc.Balancer)
	case sc.Policy == "":
		return bad("no failure policy: choose what the hybrid strategy does when Redis does not answer, Policy %q, %q or %q",
			FailOpen, FailClosed, FailLocal)
	case sc.Policy != FailOpen && sc.Policy != FailClosed && sc.Policy != FailLocal:
		return bad("unknown policy %q: want %q, %q or %q", sc.Policy, FailOpen, FailClosed, FailLocal)
	case sc.FastBy != 0 && (sc.FastServer < 0 || sc.FastServer >= sc.Servers):
		return bad("fast server %d is not in the fleet", sc.FastServer)
	case sc.PartitionServers < 0 || sc.PartitionServers > sc.Servers:
		return bad("partition of %d servers in a fleet of %d", sc.PartitionServers, sc.Servers)
	case (sc.PartitionServers > 0) != (sc.Partition.End > sc.Partition.Start):
		return bad("a partition needs both PartitionServers and a window (%d servers, %v-%v)",
			sc.PartitionServers, sc.Partition.Start, sc.Partition.End)
	case sc.Partition.End > sc.Partition.Start && sc.Outage.End > sc.Outage.Start:
		return bad("an outage and a partition in one run: measure one at a time")
	case sc.StarvedServers < 0 || sc.StarvedServers > sc.Servers:
		return bad("%d starved servers in a fleet of %d", sc.StarvedServers, sc.Servers)
	case (sc.StarvedServers > 0) != (sc.Starve.End > sc.Starve.Start):
		return bad("a starvation needs both StarvedServers and a window (%d servers, %v-%v)",
			sc.StarvedServers, sc.Starve.Start, sc.Starve.End)
	case sc.StarvedServers > 0 && (sc.StarveRun <= 0 || sc.StarvePeriod < sc.StarveRun):
		return bad("a starved server runs StarveRun %v in every StarvePeriod %v: want 0 < StarveRun <= StarvePeriod", sc.StarveRun, sc.StarvePeriod)
	case sc.StarvedServers == 0 && (sc.StarveRun != 0 || sc.StarvePeriod != 0):
		return bad("StarveRun and StarvePeriod without a starvation (StarvedServers and Starve)")
	case sc.Starve.End > sc.Starve.Start && (sc.Outage.End > sc.Outage.Start || sc.Partition.End > sc.Partition.Start):
		return bad("a starvation and an outage or partition in one run: measure one at a time")
	case sc.Masters < 1 || sc.Masters > wire.Slots:
		return bad("masters %d: want 1 to %d", sc.Masters, wire.Slots)
	case sc.DownMaster < 0 || sc.DownMaster >= sc.Masters:
		return bad("down master %d is not one of the %d masters", sc.DownMaster, sc.Masters)
	case sc.MasterDown.End > sc.MasterDown.Start && sc.Masters < 2:
		return bad("a stopped master needs a Cluster: Masters %d", sc.Masters)
	case sc.MasterDown.End > sc.MasterDown.Start && (sc.Outage.End > sc.Outage.Start || sc.Partition.End > sc.Partition.Start || sc.Starve.End > sc.Starve.Start):
		return bad("a stopped master and another fault in one run: measure one at a time")
	}
	for _, c := range sc.Churn {
		if c.Servers < 1 || c.At < 0 {
			return bad("churn %+v: a fleet keeps at least one server", c)
		}
	}
	if err := sc.checkChanges(); err != nil {
		return bad("%v", err)
	}
	if err := sc.checkAlso(); err != nil {
		return bad("%v", err)
	}
	// The hybrid strategy's limit and breaker are checked by the library's own rules.
	cfg := engineConfig(&sc, 0)
	cfg.NextSeq = func() uint64 { return 0 }
	if _, err := engine.New(cfg); err != nil {
		return bad("%v", err)
	}
	if _, err := breaker.New(sc.Breaker.settings("", nil)); err != nil {
		return bad("%v", err)
	}
	return sc, nil
}

// window is the scenario's accuracy bound over its whole duration: burst + rate·T.
func (sc *Scenario) bound() float64 { return float64(sc.Burst) + sc.Rate*sc.Duration.Seconds() }
