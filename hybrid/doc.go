// Package hybrid is the two-tier rate limiter users call: a local pre-check, token leases
// taken in batches from the global Redis bucket, and a per-limit failure policy when
// Redis does not answer. Each request asks a Limiter's Allow (or WaitN) for a limit and a
// key.
package hybrid
