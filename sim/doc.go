// Package sim simulates a fleet of servers enforcing one fleet-wide rate limit, in virtual
// time, so that `go test ./sim` shows how a 200-server fleet behaves under each limiting
// strategy and fault before anyone deploys.
//
// A run is a discrete-event simulation, deterministic for its seed: N servers behind a load
// balancer (uniform, skewed or sticky), clients with a demand pattern (steady, bursty, one hot key,
// many keys with a Zipf spread, an abusive client), a network with a round-trip time and
// jitter, and one Redis that runs commands one at a time in arrival order, each costing
// Redis time, so a strategy that saturates it queues; or a Redis Cluster of several such
// masters, each key on the master of its hash slot, one of which a fault may stop.
//
// The strategies are the library's own code where the library has code: Hybrid runs, on
// every simulated server, the very engine hybrid.Limiter runs (pre-check, leases, refills
// and the requests waiting for them, refunds, expiry, the failure policy), with a real
// breaker.Breaker per server and the Lua scripts of package lua on an embedded miniredis
// whose clock follows the virtual one; only the Limiter's goroutine loop and its timers are
// events here. The breaker reads time.Now, so hybrid runs happen inside a testing/synctest
// bubble whose clock the event loop keeps on the virtual one. LocalOnly gives each server
// FailLocal's share. The per-request strategies (Naive, Script, ScriptCallerClock) make a
// Redis call per request, 1.5 M per run; they run on the Go model of the scripts
// (internal/luamodel), which its differential test and fuzz hold to the Lua (on miniredis
// and on a real Redis when one answers).
//
// `go test ./sim` runs the built-in scenarios at 200 servers and checks their claims, the
// hybrid runs on the Go model of the scripts (TestModelRunsMatchMiniredis holds whole runs
// on it to the Lua on miniredis, figure for figure); `-args -long` runs them on the Lua on
// miniredis instead, and adds fleets of real processes on a redis-server of the test's own
// (TestAsyncProcesses, TestWindowProcesses); `-args -only cluster` runs the Redis Cluster
// suites (1,000 servers, a million keys, 1 to 10 masters), which the default run leaves
// out. `go test ./sim -v` prints a table per
// scenario; `-args -report FILE` writes one JSON object per scenario and strategy;
// `-args -plots DIR` writes that report into DIR and logs the command that draws its SVG
// plots there with the nested module sim/plot (a module of its own, so that the plotting
// library stays out of this module's graph). `-args -scenario FILE` runs, instead of the
// built-in scenarios, one read from a JSON file (see Scenario.UnmarshalJSON) under every
// strategy: a model of the user's own fleet. See docs/simulation.md for the results and
// what they mean.
package sim
