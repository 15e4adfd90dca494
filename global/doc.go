// Package global is fleetlimit's Redis tier: fleet-wide token buckets held in Redis and
// changed only by the Lua scripts of package lua, so that every decision is one atomic
// step on Redis's clock.
//
// A Store wraps the caller's go-redis client and offers two ways to use a bucket:
//
//   - AllowN decides one request with one call of the source article's script: exact,
//     one round trip per request. Use it where requests are few or the limit is strict.
//   - Take and Refund move tokens in batches (leases): a server takes up to want tokens
//     (at least min) and spends them locally, refunding what it did not use. TakeBatch
//     sends the takes of many keys in one pipelined round trip. Package hybrid builds the
//     two-tier limiter on these.
//
// Every bucket is one Redis hash (fields tokens and ts), keyed by limit name and user
// key under a documented prefix with a per-bucket hash tag, and expires once it would be
// full again. Take and Refund are idempotent, so a client that re-sends a timed-out call
// cannot spend or refund twice; AllowN is not, so New refuses a client that would retry
// it (see New and Configure).
//
// Errors are classified for a circuit breaker: ErrUnavailable (the store did not
// answer usefully), ErrRedis (it answered with an error), ErrInvalidLimit and
// ErrInvalidConfig (nothing was sent). A denial is a result, never an error.
//
// The Store reads no clock of its own: refill, TTLs and Grant.Now come from Redis TIME.
package global
