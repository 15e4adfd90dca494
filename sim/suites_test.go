package sim

import (
	"fmt"
	"strconv"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// run is one simulated run of a suite.
type run struct {
	label string // shown in the table; defaults to the strategy
	sc    Scenario
	st    Strategy
}

func (r run) name() string {
	if r.label != "" {
		return r.label
	}
	return string(r.st)
}

// suite is one built-in scenario, run under several strategies (or variants) and
// printed as one table.
type suite struct {
	name string
	runs []run
	// group, if set, is the name -only selects the suite by besides its own.
	group string
	// optIn keeps the suite out of the default run: -only names it (or its group).
	optIn bool
}

// scale shrinks a scenario for -short: a tenth of the fleet, of the limit and of the
// demand, and a fifth of the time, so CI can run it under -race. The assertions are the
// same; they are ratios.
type scale struct {
	servers  int
	duration time.Duration
	factor   float64 // applied to rates, bursts and demand of the large scenarios
	// model runs every hybrid run on the Go model of the scripts (Scenario.GoModel): the
	// same figures as the real scripts on miniredis (TestModelRunsMatchMiniredis, and
	// TestLuaScriptsMatchModel for the scripts one by one), in a third of the time.
	model bool
}

// fullScale is the built-in suites' scale: 200 servers for 10 s. Its hybrid runs are on
// the Go model of the scripts, or with -long on the real scripts on miniredis where the
// suite does not choose the model itself.
func fullScale() scale {
	return scale{servers: 200, duration: 10 * time.Second, factor: 1, model: !*longFlag}
}

func shortScale() scale { return scale{servers: 20, duration: 2 * time.Second, factor: 0.1} }

// suites returns the built-in scenarios at scale s.
func suites(s scale, seed uint64) []suite {
	T := s.duration
	at := func(frac float64) time.Duration { return time.Duration(float64(T) * frac) }
	f := s.factor
	n := func(x float64) int { return max(int(x*f), 1) }
	// Scenarios without an outage fall back to FailLocal, the conservative policy;
	// redis-outage runs each policy.
	hot := Scenario{Name: "hot-key", Servers: s.servers, Duration: T, Seed: seed,
		Rate: 100000 * f, Burst: n(10000), Demand: 150000 * f, Policy: FailLocal}
	abusive := Scenario{Name: "abusive-client", Servers: s.servers, Duration: T, Seed: seed,
		Rate: 100, Burst: 100, Demand: 10000, Policy: FailLocal}
	// many-keys is also the plain cold-key scenario (cold_test.go): it measures what they
	// measure, and its check holds hybrid-async and hybrid-window to their claims.
	many := Scenario{Name: "many-keys", Servers: s.servers, Duration: T, Seed: seed,
		Rate: 50, Burst: 50, Demand: 20000 * f, Keys: 1000, ZipfS: 1.1, GoModel: true, Policy: FailLocal}
	many.cold.on = true
	skewed := hot
	skewed.Name, skewed.Balancer = "skewed-lb", Skewed
	sticky := abusive
	sticky.Name, sticky.Balancer = "sticky-client", Sticky
	bursty := Scenario{Name: "bursty", Servers: s.servers, Duration: T, Seed: seed,
		Rate: 10000 * f, Burst: n(1000), Demand: 8000 * f, Pattern: Bursty, Policy: FailLocal}
	// The outage and the partition run hybrid on the Go model of the scripts: the same
	// figures as on miniredis (TestModelRunsMatchMiniredis), in a third of the time.
	outage := hot
	outage.Name, outage.Outage, outage.GoModel = "redis-outage", Window{Start: at(0.3), End: at(0.6)}, true
	partition := outage
	partition.Name, partition.Outage = "redis-partition", Window{}
	partition.Partition, partition.PartitionServers = Window{Start: at(0.3), End: at(0.6)}, s.servers/2
	// Half the fleet CPU-starved for the same 3 s, Redis healthy. Each starved process runs
	// 300 µs at the start of every 24 ms, shorter than a round trip: a refill's answer
	// comes back while the process is not running, and its deadline is seen 23.7 ms or
	// more late, more than twice the 10 ms budget. starvedNear runs every 15 ms: the
	// deadlines are seen 5–15 ms late, less than a budget late, and count as failures.
	// Both on the Go model of the scripts (TestModelRunsMatchMiniredis), 3× faster.
	starved := hot
	starved.Name, starved.Starve, starved.StarvedServers = "starved-server", Window{Start: at(0.3), End: at(0.6)}, s.servers/2
	starved.StarveRun, starved.StarvePeriod, starved.GoModel = 300*time.Microsecond, 24*time.Millisecond, true
	starvedNear := starved
	starvedNear.StarvePeriod = 15 * time.Millisecond
	skew := abusive
	skew.Name = "clock-skew"
	fast := skew
	fast.FastServer, fast.FastBy = 0, 2*time.Second
	churn := hot
	churn.Name = "churn"
	churn.Churn = []Change{{At: at(0.3), Servers: s.servers * 3 / 4}, {At: at(0.6), Servers: s.servers * 5 / 4}}
	churn.Heartbeat = time.Second // the servers count each other in Redis
	// A config reload that halves (or doubles) the limit reaches the servers one after
	// another over half the run, from a fifth of it on.
	lower := Scenario{Name: "limit-change", Servers: s.servers, Duration: T, Seed: seed,
		Rate: 2000 * f, Burst: n(2000), Demand: 8000 * f, Policy: FailLocal,
		LimitChanges: []LimitChange{{At: at(0.2), Spread: at(0.5), Rate: 1000 * f, Burst: n(1000)}}}
	// Every request of many-keys also counts against its tenant's limit (10 tenants) and
	// a global one, all or nothing, items in that order: the global limit binds, and the
	// requests that a tenant's or their own key's limit then denies give its tokens back.
	several := many
	several.Name, several.cold = "several-limits", coldOpts{}
	several.AlsoLimits = []AlsoLimit{
		{Name: "global", Rate: 5000 * f, Burst: n(5000), Keys: 1},
		{Name: "tenant", Rate: 1000 * f, Burst: n(1000), Keys: 10},
	}
	// Every request of abusive-client is a reservation (hybrid.Limiter.ReserveN): the
	// requests the lease denies claim from the key's bucket, below zero down to minus
	// the burst, and are admitted when they act.
	reserve := abusive
	reserve.Name, reserve.Reserve = "reservations", true
	raise := lower
	raise.LimitChanges = []LimitChange{{At: at(0.2), Spread: at(0.5), Rate: 4000 * f, Burst: n(4000)}}

	policy := func(p Policy) run {
		sc := outage
		sc.Policy = p
		return run{label: "hybrid " + string(p), sc: sc, st: Hybrid}
	}
	cut := func(p Policy) run {
		sc := partition
		sc.Policy = p
		return run{label: "hybrid " + string(p), sc: sc, st: Hybrid}
	}
	starve := func(sc Scenario, p Policy, label string) run {
		sc.Policy = p
		return run{label: "hybrid " + string(p) + label, sc: sc, st: Hybrid}
	}
	ss := []suite{
		{name: "hot-key", runs: []run{{sc: hot, st: Naive}, {sc: hot, st: Script}, {sc: hot, st: Hybrid}, {sc: hot, st: HybridAsync}, {sc: hot, st: HybridWindow}, {sc: hot, st: LocalOnly}}},
		{name: "abusive-client", runs: []run{{sc: abusive, st: Naive}, {sc: abusive, st: Script}, {sc: abusive, st: Hybrid}, {sc: abusive, st: HybridAsync}, {sc: abusive, st: HybridWindow}, {sc: abusive, st: LocalOnly}}},
		{name: "many-keys", runs: []run{{sc: many, st: Naive}, {sc: many, st: Script}, {sc: many, st: Hybrid}, {sc: many, st: HybridAsync}, {sc: many, st: HybridWindow}, {sc: many, st: LocalOnly}}},
		{name: "skewed-lb", runs: []run{{sc: skewed, st: Script}, {sc: skewed, st: Hybrid}, {sc: skewed, st: LocalOnly}}},
		{name: "sticky-client", runs: []run{{sc: sticky, st: Script}, {sc: sticky, st: Hybrid}, {sc: sticky, st: HybridAsync}, {sc: sticky, st: HybridWindow}, {sc: sticky, st: LocalOnly}}},
		{name: "bursty", runs: []run{{sc: bursty, st: Script}, {sc: bursty, st: Hybrid}, {sc: bursty, st: LocalOnly}}},
		{name: "redis-outage", runs: []run{policy(FailOpen), policy(FailClosed), policy(FailLocal), {sc: outage, st: LocalOnly}}},
		{name: "redis-partition", runs: []run{cut(FailOpen), cut(FailClosed), cut(FailLocal)}},
		{name: "starved-server", runs: []run{starve(starved, FailOpen, ""), starve(starved, FailClosed, ""), starve(starved, FailLocal, ""),
			starve(starvedNear, FailLocal, ", 15ms")}},
		{name: "clock-skew", runs: []run{
			{label: "script (TIME)", sc: skew, st: Script},
			{label: "script (TIME), srv0 +2s", sc: fast, st: Script},
			{label: "caller clock", sc: skew, st: ScriptCallerClock},
			{label: "caller clock, srv0 +2s", sc: fast, st: ScriptCallerClock},
			{label: "hybrid", sc: skew, st: Hybrid},
			{label: "hybrid, srv0 +2s", sc: fast, st: Hybrid},
		}},
		{name: "churn", runs: []run{{sc: churn, st: Script}, {sc: churn, st: Hybrid}, {sc: churn, st: LocalOnly}}},
		{name: "several-limits", runs: []run{{sc: several, st: Hybrid}}},
		{name: "limit-change", runs: []run{{label: "halved", sc: lower, st: Hybrid}, {label: "doubled", sc: raise, st: Hybrid}}},
		{name: "reservations", runs: []run{{sc: reserve, st: Hybrid}}},
	}
	ss = append(ss, clusterSuites(seed)...)
	if s.model {
		for _, x := range ss {
			for i := range x.runs {
				x.runs[i].sc.GoModel = true
			}
		}
	}
	return ss
}

// clusterSuites are the Redis Cluster suites (docs/operations.md, "Sizing a Redis
// Cluster"): 1,000 servers, 1,000,000 per-client keys with a Zipf spread plus one hot
// key, each kind of limit on one master, 3 and 10, and on 3 with the master that holds
// the hot key (and the limit's shared structures) stopped from a fifth of the run on.
// They take minutes, so only -only cluster runs them, at this scale whatever -short says:
// the spread of a Zipf demand over slots is the measure, and a smaller one is lumpier.
func clusterSuites(seed uint64) []suite {
	const T = 4 * time.Second
	const servers, keys, demand = 1000, 1000000, 60000.0
	base := Scenario{Name: "cluster", Servers: servers, Duration: T, Seed: seed,
		Rate: 50, Burst: 50, Demand: demand * 0.95, Keys: keys + 1, ZipfS: 1.1, GoModel: true, Policy: FailLocal,
		WindowShards: wire.WindowShards, LowShards: wire.LowShards} // a windowed limit's shards, a charge-later limit's sets, on a Cluster, as hybrid.Limiter has them there
	base.cold.abuse = demand * 0.05 // the hot key, the last: 5% of the demand
	var all []run
	kinds := []Strategy{Hybrid, HybridAsync, HybridWindow}
	for _, st := range kinds {
		for _, m := range clusterMasters {
			sc := base
			sc.Masters = m
			all = append(all, run{label: fmt.Sprintf("%s, %d master%s", st, m, plural(m)), sc: sc, st: st})
		}
	}
	var down []run
	for _, st := range kinds {
		sc := base
		sc.Name, sc.Masters = "cluster-master-down", 3
		sc.MasterDown = Window{Start: T / 5, End: T}
		sc.DownMaster = sc.masterOf(wire.BucketKey("", limitName, hotKey(keys)))
		down = append(down, run{label: fmt.Sprintf("%s, master %d of 3 down", st, sc.DownMaster), sc: sc, st: st})
	}
	return []suite{
		{name: "cluster", runs: all, optIn: true},
		{name: "cluster-master-down", runs: down, group: "cluster", optIn: true},
	}
}

// clusterMasters are the master counts the cluster suite runs on.
var clusterMasters = []int{1, 3, 10}

// hotKey is the name of the hot key of a cluster suite of keys Zipf keys: the last.
func hotKey(keys int) string { return "k" + strconv.Itoa(keys) }

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
