// Package global is fleetlimit's Redis tier: fleet-wide token buckets held in Redis and
// changed only by the Lua scripts of package lua, so that every decision is one atomic
// step on Redis's clock.
//
// A Store wraps the caller's go-redis client. It is what a hybrid.Limiter runs on: the
// Limiter takes tokens from the buckets in batches (leases), spends them locally and
// refunds what it did not use. On its own, AllowN decides one request with one call of
// the source article's script: exact, one round trip per request, for where requests
// are few or the limit is strict.
//
// Every bucket is one Redis hash (fields tokens and ts), keyed by limit name and user
// key under a documented prefix with a per-bucket hash tag, and expires once it would be
// full again. A Limiter's takes and refunds are idempotent, so a client that re-sends a
// timed-out call cannot spend or refund twice; AllowN is not, so New refuses a client
// that would retry it (see New and Configure).
//
// Errors are classified for a circuit breaker: ErrUnavailable (the store did not
// answer usefully), ErrRedis (it answered with an error), ErrInvalidLimit and
// ErrInvalidConfig (nothing was sent). A denial is a result, never an error.
//
// The Store reads no clock of its own: refill and TTLs come from Redis TIME.
package global
