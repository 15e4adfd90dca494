// Package sim simulates a fleet of servers enforcing one fleet-wide rate limit, in virtual
// time, so that `go test ./sim` shows how a 200-server fleet behaves under each limiting
// strategy and fault before anyone deploys.
//
// A run is a discrete-event simulation, deterministic for its seed: N servers behind a load
// balancer (uniform, skewed or sticky), clients with a demand pattern (steady, bursty, one hot key,
// many keys with a Zipf spread, an abusive client), a network with a round-trip time and
// jitter, and one Redis that runs commands one at a time in arrival order, each costing
// Redis time, so a strategy that saturates it queues.
//
// The strategies are the library's own code where the library has code: Hybrid drives
// hybrid.Lease (the lease state machine hybrid.Limiter uses), local.Limiter for the
// pre-check, breaker.Breaker and breaker.Fallback for failures, and the Lua scripts of
// package lua on an embedded miniredis whose clock follows the virtual one. The breaker
// reads time.Now, so hybrid runs happen inside a testing/synctest bubble whose clock the
// event loop keeps on the virtual one. LocalOnly uses local.FallbackLimit. The per-request
// strategies (Naive, Script, ScriptCallerClock) make a Redis call per request, 1.5 M per
// run; they run on a Go model of the scripts (internal/luamodel), which its
// TestModelMatchesScripts holds to the Lua (on miniredis and on a real Redis when one
// answers).
//
// `go test ./sim -v` prints a table per scenario; `-args -report FILE` writes one JSON
// object per scenario and strategy; `-args -plots DIR` writes SVG plots. See
// docs/simulation.md for the results and what they mean.
package sim
