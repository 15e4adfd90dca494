// Package luascript holds the Redis scripts of leases and fleets that package global's
// Store runs: the lease take and refund, the fleet heartbeat and the low-key marks, and
// the source article's token bucket of package lua as a ready script.
//
// Each script is a .lua file in this directory, embedded with go:embed and exposed twice:
// as its source text (for the simulator's miniredis and the Go model in
// internal/luamodel) and as a ready *redis.Script, whose Run sends EVALSHA and falls back
// to EVAL when the server answers NOSCRIPT.
//
// Take and Refund keep package lua's bucket layout (fields tokens and ts, Redis TIME,
// ts never backwards, the TTL rule, set by every call that writes), so that all three
// scripts can be used on the same bucket; for a bucket left below zero the TTL is
// ceil((capacity-tokens)/rate*1000)+1000 ms.
//
// Take and Refund also keep the parameters in force in the field p, '<version> <capacity>
// <rate> <now ms>', so that servers which learn of a change at different instants agree:
// the highest version's capacity and rate are in force. A take with a lower version is
// answered on them; one with a higher version, or the same version and other parameters,
// re-shapes the bucket: refilled on the old rate up to now, then capped at the new
// capacity, so a change never adds tokens. A refund never re-shapes, and gives back
// nothing of tokens leased under other parameters than those in force. Bucket ignores p.
//
// Take and Refund are idempotent per (server id, seq): each records its last answer per
// server in the bucket hash (fields "t:<server id>" and "r:<server id>"; a claim's take,
// one with a floor, "k:<server id>", a debt's refund "d:<server id>"), and a replayed
// call — a client library retrying a timed-out EVALSHA — gets the recorded answer back
// and spends or refunds nothing. A seq lower than the recorded one (a replay that arrives
// after a newer call) spends nothing. The records expire with the hash; when a hash
// holds more than 256 fields, a new record first drops records older than two minutes.
// A refund to a full bucket writes nothing, its record included: it adds nothing, and a
// replay of it runs again, giving its tokens back at most once.
//
// Numbers that may be fractional are returned as strings (tostring). Real Redis formats
// them with %.14g and miniredis with Go's shortest form, so compare parsed numbers,
// never the strings.
package luascript

import (
	_ "embed"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/wire"
	"github.com/fleetlimit/fleetlimit/lua"
)

// TakeSource is the lease take script:
//
//	KEYS[1] bucket key; ARGV[1] capacity, ARGV[2] refill per second, ARGV[3] want,
//	ARGV[4] min, ARGV[5] server id, ARGV[6] seq, ARGV[7] version, ARGV[8] floor (optional)
//	returns {granted, tostring(tokens left), wait ms, Redis now ms, replay flag, version}
//
// It grants want if the bucket holds want tokens, else the whole tokens it holds if that
// is at least min, else 0; wait is 0 when granted, else the milliseconds until min tokens
// are there. With a floor F (0 to capacity) it counts F tokens more, leaving the bucket
// down to -F (a reservation: a claim on its future refill), and a grant's wait is the
// time until the bucket is back at zero. The replay flag is 0 for a fresh answer, 1 for a replayed (same seq) call
// answered from the record, 2 for a stale seq (nothing spent, 0 granted), 3 (First) for a
// fresh answer from a bucket that held no record of this server. version is the version
// of the parameters the call was decided on.
//
//go:embed take.lua
var TakeSource string

// RefundSource is the lease refund script, for one key or several in one call:
//
//	KEYS[i] bucket key, i = 1..n; ARGV[b+1] capacity, ARGV[b+2] refill per second,
//	ARGV[b+3] amount, ARGV[b+4] server id, ARGV[b+5] seq, ARGV[b+6] version,
//	ARGV[b+7] debt floor (optional), ARGV[b+8] debt reference (optional), b = 8(i-1);
//	an optional argument is '' or, for the last key, left out
//	returns {tostring(tokens after), replay flag, version} for each key in turn
//	({Redis's error, Refused, 0} for a key Redis refused)
//
// It refills the bucket, adds amount and caps the result at capacity, on the parameters
// the bucket holds (the caller's only for a bucket without p); amount counts only when
// those are the caller's (the tokens were leased under them). A negative amount is a
// debt (tokens a failure policy admitted without the bucket), charged against the refill
// the bucket accrued since its last use before the cap, never below -capacity, ts left
// where it was. The replay flag is as for TakeSource. The keys' refunds run in order,
// each as if called alone, on one reading of TIME; every key's arguments are checked
// before any refund runs, so a call with one invalid key refunds nothing; a key Redis
// refuses (not a hash: WRONGTYPE; a write refused: OOM, READONLY) is answered Refused,
// with Redis's error, and the others still run. In a Redis Cluster a call's keys must
// share a hash slot.
//
//go:embed refund.lua
var RefundSource string

// HeartbeatSource is the fleet membership script:
//
//	KEYS[1] fleet key (sorted set); ARGV[1] server id, ARGV[2] ttl ms
//	returns the number of live servers (integer)
//
// It records the server as alive until Redis TIME + ttl, drops servers whose time has
// passed, and keeps the key's TTL at least ttl.
//
//go:embed heartbeat.lua
var HeartbeatSource string

// LowSource is the low-key script of a charge-later limit (hybrid.ChargeLater):
//
//	KEYS[1] the limit's low-key set (sorted set); ARGV[1] memory ms, ARGV[2] n,
//	ARGV[3] most, ARGV[4..n+3] key IDs to mark, ARGV[n+4..] key IDs to unmark
//	returns the key IDs marked now (array of strings, the latest first, at most most,
//	0 to 10,000)
//
// It marks each key of the first list as low until Redis TIME + memory (a mark only
// moves later), unmarks those of the second, drops marks whose time has passed, keeps at
// most 100,000, and keeps the key's TTL at least memory.
//
//go:embed low.lua
var LowSource string

// Replay flags returned by Take (slot 5) and Refund (slot 2).
const (
	// Fresh means the call was executed now.
	Fresh = 0
	// Replayed means the same (server id, seq) had already run; the recorded answer was
	// returned and nothing was spent or refunded again.
	Replayed = 1
	// Stale means a newer seq of the same server had already run on this bucket; the
	// call spent or refunded nothing.
	Stale = 2
	// First (Take only) means the call was executed now, and the bucket held no record of
	// this server's takes: the bucket is new, expired, or was lost (evicted, flushed,
	// deleted). A server that took from it moments ago knows which.
	First = 3
	// Refused (Refund only) means Redis refused the key (it is not a hash, or a write was
	// refused: OOM, READONLY): nothing was refunded to it, and the reply's first value is
	// Redis's error. The call's other keys ran.
	Refused = wire.RefundRefused
)

// Ready scripts. Run sends EVALSHA and falls back to EVAL on NOSCRIPT. Inside a pipeline
// that fallback does not happen (go-redis checks the error before the pipeline runs):
// load the script and re-send failed commands yourself, as internal/redisstore does.
var (
	// Bucket runs lua.BucketSource.
	Bucket = redis.NewScript(lua.BucketSource)
	// Take runs TakeSource.
	Take = redis.NewScript(TakeSource)
	// Refund runs RefundSource.
	Refund = redis.NewScript(RefundSource)
	// Heartbeat runs HeartbeatSource.
	Heartbeat = redis.NewScript(HeartbeatSource)
	// Low runs LowSource.
	Low = redis.NewScript(LowSource)
)
