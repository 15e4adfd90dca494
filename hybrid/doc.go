// Package hybrid is the two-tier rate limiter users call: a local pre-check, token leases
// taken in batches from the global Redis bucket, and a per-limit failure policy when Redis
// does not answer. A Limiter holds one or more named Limits; each request asks Allow (or
// Wait) for a limit and a key, and gets a Decision that says whether it may pass, when to
// retry, and which tier decided. A request that counts against several limits at once
// asks AllowMulti: all or nothing.
//
// The per-server logic runs in a deterministic engine (no I/O, no clock of its own) that
// the fleet simulator in package sim drives too, in virtual time; the Limiter around it
// carries out its Redis calls through go-redis and a breaker.Breaker.
package hybrid
