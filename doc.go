// Package fleetlimit enforces rate limits across a fleet of servers: one limit per client
// (API key, tenant, IP) held for the whole fleet, decided in well under a microsecond on
// the common path, and degrading to a policy you chose when Redis is away.
//
// This package holds only this overview; the code lives in its subpackages.
//
// # Two tiers
//
// The global tier (package global, scripts in package lua) keeps one token bucket per
// (limit, key) in Redis. Every change is one Lua script run atomically by Redis on
// Redis's own clock (TIME), so two servers can never both spend the last token, and a
// server whose clock runs fast cannot add tokens. Buckets expire once they would be full
// again, so Redis memory tracks active clients.
//
// The local tier is in process. Each key's pre-check, a token bucket with x/time/rate's
// arithmetic held beside the key's lease, denies a client far over its limit without a
// Redis call. Package local, x/time/rate buckets per key with bounded memory, is the
// conservative fallback (FailLocal) while Redis is down.
//
// # The flow of one decision
//
// Package hybrid combines them. For Allow(ctx, limit, key):
//
//  1. local pre-check: deny fast, no Redis;
//  2. lease: tokens this server already took from the global bucket: allow, no Redis;
//  3. refill: take a batch of tokens from the global bucket (one script call with a
//     tight deadline, through the breaker; refills of many keys go out together in one
//     round trip); unused tokens are refunded;
//  4. fallback: breaker open, timeout or Redis error: the limit's own failure policy
//     (package breaker): FailOpen, FailClosed or FailLocal. There is no default.
//
// Services that want one exact Redis decision per request use global.Store.AllowN,
// the source article's script, directly.
//
// # A sketch
//
//	opts := &redis.Options{Addr: "10.0.0.5:6379"}
//	global.Configure(opts) // the client settings the library needs
//	store, err := global.New(redis.NewClient(opts))
//	...
//	api, err := global.NewLimit("api", 100, 200) // 100/s fleet-wide, bursts of 200
//	...
//	res, err := store.AllowN(ctx, api, apiKey, 1)
//	if err == nil && !res.Allowed {
//		// 429 with Retry-After: res.RetryAfter
//	}
//
// # The simulator
//
// go test ./sim runs package sim: a discrete-event simulation of a 200-server fleet, with
// a Redis that runs the very scripts of package lua, comparing the strategies (naive
// read-modify-write, the script per request, hybrid leases, local only) under load
// skew, bursts, Redis outages and clock skew.
//
// docs/operations.md in the repository covers client settings, keys, and running the
// test suites against a real Redis and a Redis Cluster.
package fleetlimit
