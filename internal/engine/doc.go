// Package engine is the per-server core of fleetlimit's hybrid limiter: one state machine
// that both hybrid.Limiter and the simulator (package sim) drive, so that what decides a
// request is written once and the simulator runs it the day it changes.
//
// It is shaped like etcd's raft: the Engine makes no I/O, starts no goroutine, sets no
// timer and reads no clock. Its inputs are method calls that carry their instant:
//
//   - Decide: a request (limit, key, cost) at now; the common path, a lease that holds
//     tokens, is one pass under the key's lock with no allocation;
//   - Claim: a reservation's claim on a key's bucket, for a request Decide denied;
//   - Return: a decision undone (an all-or-nothing request another limit denied, a
//     reservation canceled);
//   - GiveUp: a waiting request's wait is over (MaxWait passed, or its caller left);
//   - Done: the answers of a round trip the driver made;
//   - Tick: time passed (lease expiry, heartbeats, the windowed reports, the charges and
//     low-key exchanges of the charge-later limits);
//   - Stop, Drain, Finish: shutdown.
//
// Its outputs are the decisions (returned by Decide and GiveUp, or, for a request that
// waited, set on its Waiter) and the I/O it wants: Next returns one Trip at a time,
// which the driver carries out and hands back to Done:
//
//   - TakeTrip: refills of the bucket kinds' leases, and reservations' claims on a
//     bucket's refill (Claim), up to MaxBatch per pipelined round trip;
//   - HeartbeatTrip: this server's announcement in its fleet, answered by the live count;
//   - WindowsTrip: the windowed limits' reports, grants and reads;
//   - LowTrip: the charge-later limits' exchange of low keys with the fleet;
//   - RefundTrip: refunds summed per key, or a debt trip: FailLocal's debts and the
//     charge-later limits' charges, in the order first owed.
//
// The scheduling of that I/O is the engine's: one round trip out at a time, in this
// fixed order of precedence: refills and claims, a heartbeat, the windowed reports, a
// low-key exchange, refunds, debts and charges; but neither refills nor windowed reports
// go twice in a row while other work waits, so none starves. A refund trip answered too
// late is sent again in halves with the same sequence numbers.
//
// # Kinds of limit
//
// A limit is one of three kinds, fixed when it is made; each is a unit of its own behind
// one seam (kind.go), and nothing outside a kind's files asks which kind a limit is:
//
//   - exact (the default; decide.go, lease.go, trip.go's refills): a token bucket in
//     Redis, served from leases; a request the lease cannot serve waits for a refill;
//   - charge-later (LimitConfig.Async; async.go): the same bucket; a request the lease
//     cannot serve, on a key not known low, is admitted at once and charged with a
//     later debt trip; it exchanges low keys with the fleet (LowTrip);
//   - windowed (LimitConfig.Windowed; window.go, window_trip.go): counted windows in
//     shared arrays in Redis, no bucket; a server admits without asking and reports its
//     counts with a WindowsTrip every report interval, asks grants for the keys it sees
//     often, and asks and waits for keys the fleet found near their burst. Its window,
//     Burst/Rate, is from MinWindow to MaxWindow, its report interval at most half of
//     it. It has no bucket to claim from: a reservation holds only what it admits now.
//
// The seam is what the engine asks of a kind for one limit: decide a request under the
// key's lock, account for an admission of the failure policy (admitFallback, then
// fellBack with no lock held), undo a decision (Return), claim for a reservation, make
// and let go of a key's state. The two bucket kinds share their unit (bucket) and differ
// only in what they do with a request the lease cannot serve (spill). A kind with
// engine-wide work (the windowed reports, the charge-later exchanges and charges) has
// its part of Tick, NextTick, Next, Done and Stop in its own files, called in the order
// above. A bucket key's entry is at most 300 bytes (TestEntrySize); a windowed key's
// holds its window state besides, allocated only for windowed limits.
//
// The Lease type is the pure per-key lease rule inside it (batch size, prefetch, pacing,
// expiry), with no locks at all.
//
// # Concurrency
//
// An Engine is safe for simultaneous use by multiple goroutines, and its hot path takes
// one lock per key, never one per Engine. What is guarded by what:
//
//   - a key's entry (pre-check bucket, Lease, the refill in flight and the requests
//     waiting for it) by that key's shard lock in the limit's keystore.Store;
//   - a Waiter's decision by the Waiter's own mutex, taken before the key's lock: a
//     refill's answer and the driver's GiveUp race to decide it, and exactly one does;
//   - the outbox (pending refills, queued refunds, refund trips, the expiry heap, the
//     tick and heartbeat schedule, whether a Trip is out) by Engine.mu, which is never
//     held while a key's lock is taken;
//   - the counters are atomics, and a limit's lease configuration is an atomic pointer
//     replaced whole when the live server count changes;
//   - a charge-later limit's low keys by that set's own mutex, always the innermost lock:
//     it may be taken under a key's lock or Engine.mu, and nothing is taken under it;
//     the charge-later schedule (laterSched) by Engine.mu, but for its atomics;
//   - a windowed limit's queue of work for Redis and what it knows of the fleet (marks,
//     Redis's clock, its reads) by that limit's windowed.mu, taken under a key's lock or
//     Engine.mu or alone, and never around anything else. A decision takes it only when
//     it has something to queue or learn: a key served from its grants with nothing to
//     ask is decided under its own lock alone (fastDecide), reading the few fields of
//     the limit it needs as atomics (whether it started, stopped or is warm, whether a
//     trip is due, Redis's clock offset, the marks' generation). An answer finds its key
//     with Peek: a key evicted while its op was out is not made again, and its requests
//     are decided from the op alone.
//
// Lock order: Waiter.mu, then a key's shard lock or Engine.mu. Decide, GiveUp and Tick may
// be called from any goroutine; Next, Done and Stop belong to the driver's loop, one
// goroutine at a time. Only that loop holds two Waiters' mutexes at once (a request it
// rechecks starts a refill that fails at once, and the other requests that joined that
// refill are decided too), so no two goroutines can take them in opposite orders. Driver
// callbacks (Notify, Decided) run with neither Engine.mu nor a key's lock held, but
// possibly under a Waiter's mutex: they must not call the engine (Decided may read the
// Waiter it is given, whose mutex is never the one held).
//
// Given the same inputs in the same order an Engine gives the same outputs: nothing in
// it depends on map order or the scheduler. A driver that makes the same calls at the
// same instants therefore sees the same decisions and the same Trips, which is what
// lets the simulator stand for a fleet of Limiters.
package engine
