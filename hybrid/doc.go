// Package hybrid is the two-tier rate limiter users call: a local pre-check, token leases
// taken in batches from the global Redis bucket, and a per-limit failure policy when Redis
// does not answer.
//
// The lease logic is a pure state machine, [Lease], with no I/O and an explicit now: the
// production limiter drives it with go-redis, the simulator in virtual time.
package hybrid
