package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Grant is the answer of a lease take.
type Grant struct {
	// Granted is the number of tokens taken: want, or fewer (at least min), or 0.
	Granted int
	// Remaining is the number of tokens left in the bucket after the take.
	Remaining float64
	// Wait is 0 when tokens were granted; otherwise how long until min tokens are there,
	// if nobody else takes meanwhile.
	Wait time.Duration
	// Now is Redis's clock (TIME) at the decision, to the millisecond.
	Now time.Time
	// First reports that the bucket held no record of this Store's takes (luascript.First): it
	// is new, it expired (nobody wrote it for its TTL: a refund to a full bucket writes
	// nothing), or it was lost (evicted, flushed, deleted). A Store that took from it
	// within the TTL knows it was lost.
	First bool
	// Version is the Limit.Version whose Rate and Burst the bucket runs on: the
	// caller's, or a higher one another server set (the take was then decided on that
	// one's Rate and Burst).
	Version uint64
	// Credit is the refill the bucket has lost to its cap, cumulative: the reference of
	// a later debt (RefundRequest.Ref).
	Credit float64
	// Replayed reports a take Redis had run already under the same sequence number
	// (TakeRequest.Seq): the Grant is that run's, and nothing was spent again.
	Replayed bool
}

// Take takes up to want tokens, and at least min, from the fleet-wide bucket of lim and
// key in one atomic step (luascript.Take): want if the bucket holds that many, else every whole
// token it holds if that is at least min, else none. 1 <= min <= want <= lim.Burst.
//
// Take is idempotent: each call carries this Store's server id and a fresh sequence
// number, and a replay of the same call (a client retry after a timeout) is answered
// from the record in the bucket, spending nothing. Concurrent Takes of one bucket
// through one Store are fine: one that Redis sees after a later one is sent again,
// up to maxStale sends in all (a stale call spent nothing); if every send was
// overtaken, Take answers the last, 0 granted, with no error. Errors wrap
// ErrInvalidLimit (no call made), ErrUnavailable or ErrRedis; a timed-out Take may have
// been granted in Redis.
func (s *Store) Take(ctx context.Context, lim Limit, key string, want, min int) (Grant, error) {
	if err := checkTake(lim, want, min); err != nil {
		return Grant{}, err
	}
	return s.take(ctx, TakeRequest{Limit: lim, Want: want, Min: min}, wire.BucketKey(s.prefix, lim.Name, key))
}

// TakeOne is the take of one TakeRequest, its Floor included: a take with a floor grants
// Want if the bucket holds Want - Floor tokens or more, and may leave it below zero
// (down to -Floor); Grant.Wait is then how long until the bucket is back at zero, when
// the tokens taken are the bucket's again to give. Refund gives them back. Errors are
// Take's, and ErrInvalidLimit for a Floor outside [0, Burst].
func (s *Store) TakeOne(ctx context.Context, r TakeRequest) (Grant, error) {
	bkey, err := s.requestBucket(r.Limit.Name, r.Key, r.ID)
	if err == nil {
		err = checkTakeRequest(r)
	}
	if err != nil {
		return Grant{}, err
	}
	return s.take(ctx, r, bkey)
}

// checkTakeRequest is checkTake with r's floor.
func checkTakeRequest(r TakeRequest) error {
	if err := checkTake(r.Limit, r.Want, r.Min); err != nil {
		return err
	}
	if r.Floor < 0 || r.Floor > r.Limit.Burst {
		return fmt.Errorf("%w: limit %q: floor %d must be between 0 and the burst %d", storeerr.ErrInvalidLimit, r.Limit.Name, r.Floor, r.Limit.Burst)
	}
	return nil
}

// take is the checked take r on the bucket at Redis key bkey, first under r.Seq if it
// is not 0.
func (s *Store) take(ctx context.Context, r TakeRequest, bkey string) (Grant, error) {
	keys := []string{bkey}
	seq := r.Seq
	for attempt := 1; ; attempt++ {
		if attempt > 1 || seq == 0 {
			seq = s.nextSeq()
		}
		reply, err := luascript.Take.Run(ctx, s.c, keys, r.takeArgs(s.serverID, seq)...).Result()
		if err != nil {
			return Grant{}, wrap("take", err)
		}
		g, flag, err := parseGrant(reply)
		if err != nil || flag != luascript.Stale || attempt == maxStale {
			return g, err
		}
	}
}

// maxStale is how many times Take sends a take that Redis answered as stale.
//
// A Store is safe for concurrent use, so two goroutines may take from one bucket at
// once, and their sequence numbers may reach Redis out of order (two connections). The
// script then answers the older call as stale: it spent nothing and granted 0, to guard
// against a late replay. That is not the bucket's answer, so the take goes again with
// a fresh (larger) sequence number. This does not spend twice: a stale call spent
// nothing. It repeats only while other takes of the same bucket keep overtaking it.
const maxStale = 4

func checkTake(lim Limit, want, min int) error {
	if err := lim.Validate(); err != nil {
		return err
	}
	if err := lim.CheckCost(want); err != nil {
		return err
	}
	if min < 1 || min > want {
		return fmt.Errorf("%w: limit %q: min %d must be between 1 and want %d", storeerr.ErrInvalidLimit, lim.Name, min, want)
	}
	return nil
}

// parseGrant decodes luascript.Take's reply and its replay flag (luascript.Fresh, luascript.Replayed,
// luascript.Stale or luascript.First; First comes back as luascript.Fresh with Grant.First set).
func parseGrant(reply any) (Grant, int, error) {
	r, err := wire.ParseTake(reply)
	if err != nil {
		return Grant{}, 0, unexpected("take", err.Error())
	}
	flag := r.Flag
	if flag == luascript.First {
		flag = luascript.Fresh
	}
	return Grant{
		Granted:   r.Granted,
		Remaining: r.Tokens,
		Wait:      tokenbucket.FromMillis(float64(r.WaitMS)),
		Now:       time.UnixMilli(r.NowMS),
		First:     r.Flag == luascript.First,
		Version:   r.Version,
		Credit:    r.Credit,
		Replayed:  r.Flag == luascript.Replayed,
	}, flag, nil
}

// Refund puts n unused tokens back into the bucket of lim and key, capped at its
// capacity (luascript.Refund). n == 0 does nothing; -MaxDebt <= n <= lim.Burst. Like Take it
// is idempotent: a replayed refund adds nothing; one overtaken by a concurrent refund of
// the same bucket is sent again. Refunds do not loosen the fleet-wide
// bound: a refunded token was taken and not used.
//
// A negative n is a debt: tokens admitted without the bucket (a failure policy's, while
// Redis did not answer) charged to it. It is charged against the refill the bucket
// accrued since its last use before its cap, so a bucket nobody used meanwhile pays it
// from refill a full bucket would have lost, and only the rest takes the bucket below
// zero, never below -Burst (RefundRequest.Floor sets another floor for RefundBatch).
func (s *Store) Refund(ctx context.Context, lim Limit, key string, n int) error {
	return s.refundOne(ctx, RefundRequest{Limit: lim, Key: key, N: n}).Err
}

// refundOne is Refund, answering the bucket's level too.
func (s *Store) refundOne(ctx context.Context, r RefundRequest) RefundResult {
	if err := checkRefund(r); err != nil || r.N == 0 {
		return RefundResult{Err: err}
	}
	bkey, err := s.requestBucket(r.Limit.Name, r.Key, r.ID)
	if err != nil {
		return RefundResult{Err: err}
	}
	keys := []string{bkey}
	for attempt := 1; ; attempt++ {
		seq := r.Seq
		if seq == 0 {
			seq = s.nextSeq()
		}
		reply, err := luascript.Refund.Run(ctx, s.c, keys, r.refundArgs(s.serverID, seq)...).Result()
		if err != nil {
			return RefundResult{Seq: seq, Err: wrap("refund", err)}
		}
		left, flag, err := parseRefund(reply)
		// Stale: overtaken by a concurrent refund of this bucket from this Store; it
		// refunded nothing, so send it again (see maxStale) — unless the caller chose
		// the seq (a retry), which may have run before the newer refund.
		if err != nil || flag != luascript.Stale || attempt == maxStale || r.Seq != 0 {
			return RefundResult{Remaining: left, Seq: seq, Err: err}
		}
	}
}

// MaxDebt is the largest debt one refund may charge, and the largest Floor: the scripts
// hold counts in Lua numbers.
const MaxDebt = 1<<53 - 1

// checkRefund reports what luascript.Refund would refuse in r: so that an invalid item
// of a RefundBatch fails alone, never the script call it would share.
func checkRefund(r RefundRequest) error {
	lim, n := r.Limit, r.N
	if err := lim.Validate(); err != nil {
		return err
	}
	if n < -MaxDebt || n > lim.Burst {
		return fmt.Errorf("%w: limit %q: refund %d must be between -%d and the burst %d", storeerr.ErrInvalidLimit, lim.Name, n, MaxDebt, lim.Burst)
	}
	// The TTL of a bucket a debt leaves at -floor must be an exact integer PEXPIRE takes.
	if f := r.DebtFloor(); f > MaxDebt || !(tokenbucket.TTLMillis(float64(lim.Burst)+float64(f), lim.Rate) < 1<<53) {
		return fmt.Errorf("%w: limit %q: a debt floor of %d leaves a bucket whose refill time Redis cannot expire", storeerr.ErrInvalidLimit, lim.Name, f)
	}
	return nil
}

// parseRefund decodes luascript.Refund's reply: the tokens after, and the replay flag.
func parseRefund(reply any) (float64, int, error) {
	r, err := wire.ParseRefund(reply)
	if err != nil {
		return 0, 0, unexpected("refund", err.Error())
	}
	return r.Tokens, r.Flag, refundErr(r)
}

// refundErr is the error of a key luascript.Refund answered refused, nil for another.
func refundErr(r wire.RefundReply) error {
	if r.Flag != luascript.Refused {
		return nil
	}
	return wrap("refund", refusal(r.Refused))
}

// Reset deletes the bucket of lim and key: the next call finds it full, but for a take
// from a server that heard of the bucket within its lifetime (TakeRequest.Seen), which
// takes it for lost and starts it empty.
func (s *Store) Reset(ctx context.Context, lim Limit, key string) error {
	if err := lim.Validate(); err != nil {
		return err
	}
	d, ok := s.c.(interface {
		Del(ctx context.Context, keys ...string) *redis.IntCmd
	})
	if !ok {
		return fmt.Errorf("%w: the client has no DEL", storeerr.ErrInvalidConfig)
	}
	return wrap("reset", d.Del(ctx, wire.BucketKey(s.prefix, lim.Name, key)).Err())
}

// TakeRequest is one item of a TakeBatch.
type TakeRequest struct {
	Limit Limit
	Key   string
	// ID, if not empty, names the bucket instead of Key: IDOf(key), for a caller that
	// keeps keys in memory as their IDs.
	ID        KeyID
	Want, Min int
	// Floor, if not 0, lets the take leave the bucket below zero, down to -Floor (at most
	// the burst): a claim on its future refill, as a reservation makes. Grant.Wait is
	// then the time until the bucket is back at zero. See TakeOne.
	Floor int
	// Seq, if not 0, is the take's sequence number (NextSeq), instead of a fresh one: a
	// take sent again under the Seq of one whose answer was lost (it timed out) is
	// answered from Redis's record if that one ran (Grant.Replayed), spending nothing
	// again, and runs now if it did not. One overtaken meanwhile by a later take of this
	// Store from the same bucket runs now under a fresh number.
	Seq uint64
	// Seen is what this Store last heard of the bucket (Grant.Remaining, and how long
	// ago): a take that finds the bucket gone although it was seen within its lifetime
	// knows Redis lost it (evicted, flushed) and starts it empty, not full (luascript.Take).
	Seen wire.Seen
}

// takeArgs are luascript.Take's arguments for r from server id with sequence number seq.
func (r TakeRequest) takeArgs(id string, seq uint64) []any {
	args := []any{r.Limit.Burst, r.Limit.Rate, r.Want, r.Min, id, seq, r.Limit.Version, r.Floor}
	return append(args, r.Seen.Args()...)
}

// TakeResult is the answer to one TakeRequest: a Grant, or an error (classified as for
// Take).
type TakeResult struct {
	Grant
	Err error
}

// TakeBatch runs the takes in reqs in one pipelined round trip (per cluster node) and
// writes each answer to out[i]. It is what a server uses when the refills of many keys
// fall due together. Each item is an independent atomic take with its own sequence
// number, so the batch is idempotent item by item.
//
// Scripts go out as EVALSHA. Inside a pipeline go-redis does not fall back to EVAL on
// NOSCRIPT (a restarted or failed-over Redis has an empty script cache), so TakeBatch
// re-sends only the items that got NOSCRIPT, as EVAL, in a second round trip: an empty
// cache costs one extra round trip, never an error.
//
// Invalid items get an error wrapping ErrInvalidLimit and are not sent. The returned
// error is the first item error (nil when every item has a Grant); out must be at least
// as long as reqs.
func (s *Store) TakeBatch(ctx context.Context, reqs []TakeRequest, out []TakeResult) error {
	if len(out) < len(reqs) {
		return fmt.Errorf("%w: TakeBatch: out has %d slots for %d requests", storeerr.ErrInvalidConfig, len(out), len(reqs))
	}
	out = out[:len(reqs)]
	items := make([]batchItem, len(reqs))
	for i, r := range reqs {
		bkey, err := s.requestBucket(r.Limit.Name, r.Key, r.ID)
		if err == nil {
			err = checkTakeRequest(r)
		}
		if err != nil {
			out[i] = TakeResult{Err: err}
			continue
		}
		if s.pipe == nil {
			g, err := s.take(ctx, r, bkey)
			out[i] = TakeResult{Grant: g, Err: err}
			continue
		}
		seq := r.Seq
		if seq == 0 {
			seq = s.nextSeq()
		}
		items[i] = batchItem{
			keys: []string{bkey},
			args: r.takeArgs(s.serverID, seq),
		}
	}
	if s.pipe == nil || !s.runBatch(ctx, s.pipe.Pipeline(), luascript.Take, items) {
		return firstErr(out, TakeResult.err)
	}
	for i := range items {
		it := &items[i]
		if it.cmd == nil {
			continue
		}
		reply, err := it.cmd.Result()
		if err != nil {
			out[i] = TakeResult{Err: wrap("take", err)}
			continue
		}
		g, flag, err := parseGrant(reply)
		if err == nil && flag == luascript.Stale {
			// Overtaken by a concurrent take of the same bucket (see maxStale): it
			// spent nothing; take again on its own.
			r := reqs[i]
			r.Seq = 0
			g, err = s.take(ctx, r, it.keys[0])
		}
		out[i] = TakeResult{Grant: g, Err: err}
	}
	return firstErr(out, TakeResult.err)
}

// batchItem is one script call of a pipelined batch; keys == nil means not sent.
type batchItem struct {
	keys []string
	args []any
	cmd  *redis.Cmd
}

// runBatch queues script on pipe as EVALSHA for every item with keys, sends pipe (with
// whatever the caller queued on it before) in one round trip, then the items answered
// NOSCRIPT again as EVAL in a second one, and leaves each answer in item.cmd. It
// reports whether anything was sent.
func (s *Store) runBatch(ctx context.Context, pipe redis.Pipeliner, script *redis.Script, items []batchItem) bool {
	for i := range items {
		if it := &items[i]; it.keys != nil {
			it.cmd = script.EvalSha(ctx, pipe, it.keys, it.args...)
		}
	}
	if pipe.Len() == 0 {
		return false
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	var retry redis.Pipeliner
	for i := range items {
		if it := &items[i]; it.cmd != nil && isNoScript(it.cmd.Err()) {
			if retry == nil {
				retry = s.pipe.Pipeline()
			}
			it.cmd = script.Eval(ctx, retry, it.keys, it.args...)
		}
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}
	return true
}

// RefundRequest is one item of a RefundBatch: give N unused tokens back to the bucket of
// Limit and Key.
type RefundRequest struct {
	Limit Limit
	Key   string
	// ID, if not empty, names the bucket instead of Key, as in TakeRequest.
	ID KeyID
	// N is the tokens given back; a negative N is a debt (see Refund).
	N int
	// Floor is how far below zero a debt may take the bucket; 0 means the burst.
	Floor int
	// Ref, when HasRef is set, is a debt's reference: the Grant.Credit of the debtor's
	// last take before the admissions it owes. The refill the bucket lost to its cap
	// since then (it sat full, as during an outage of every server) is forgiven first
	// (luascript.Refund). Without one nothing is forgiven.
	Ref    float64
	HasRef bool
	// Seq is 0 for a new refund: RefundBatch gives it a fresh sequence number and
	// reports it in RefundResult.Seq. To send again a refund whose answer was lost (a
	// timeout), set Seq to that number: where the first attempt ran, Redis answers it
	// as a replay and adds nothing, so the retry cannot refund twice. Such an item is
	// not re-sent when Redis answers it stale (a later refund of the bucket from this
	// Store already ran): that errs on the safe side.
	Seq uint64
}

// refundArgs are r's eight arguments of a luascript.Refund call, from server id with
// sequence number seq, "" for no debt reference: a call of one key or one of several.
func (r RefundRequest) refundArgs(id string, seq uint64) []any {
	var ref any = ""
	if x := r.Reference(); !math.IsNaN(x) {
		ref = x
	}
	return []any{r.Limit.Burst, r.Limit.Rate, r.N, id, seq, r.Limit.Version, r.DebtFloor(), ref}
}

// Reference is the debt reference luascript.Refund is given for r: Ref, or NaN for none.
func (r RefundRequest) Reference() float64 {
	if r.HasRef && r.N < 0 {
		return r.Ref
	}
	return math.NaN()
}

// DebtFloor is the floor the refund script is given for r: Floor, or the burst.
func (r RefundRequest) DebtFloor() int {
	if r.Floor > 0 {
		return r.Floor
	}
	return r.Limit.Burst
}

// RefundResult is the answer to one RefundRequest: the tokens in the bucket after the
// refund (0 when nothing was sent, for N == 0), or an error (classified as for Refund).
type RefundResult struct {
	Remaining float64
	Seq       uint64 // the sequence number sent (see RefundRequest.Seq); 0 if not sent
	Err       error
}

// RefundBatch runs the refunds in reqs in one pipelined round trip (per cluster node)
// and writes each answer to out[i]. It is what a server uses to give back the unused
// tokens of many keys at once: expired leases, evicted keys, or everything it holds when
// it shuts down. Each item is an independent atomic refund (luascript.Refund) with its own
// sequence number, so the batch is idempotent item by item, as Refund is: a replayed
// item adds nothing, and one overtaken by a concurrent refund of the same bucket from
// this Store (answered stale, nothing refunded) is sent again on its own.
//
// Up to RefundsPerCall items go in one script call, in order (on a Redis Cluster, items
// whose keys share a hash slot; on a client that shards by key otherwise, such as a
// Ring, one item a call): a call of several keys costs Redis less than as many calls of
// one (RefundsPerCall). A key Redis refuses within a call (one that is not a bucket:
// WRONGTYPE; a write refused: OOM, READONLY) fails alone, refunded nothing, and the
// call's other items run (luascript.Refused): a call fails whole only before any of its
// refunds ran, or when its answer is lost (a timeout: its items may have run; send them
// again with their Seq).
//
// Scripts go out as EVALSHA; calls answered NOSCRIPT are re-sent as EVAL in a second
// round trip, as in TakeBatch. Items with N == 0 are not sent; a negative N is a debt
// (Refund); invalid items (a bad limit, N < -MaxDebt or N > Burst, a debt floor Redis
// cannot expire) get an error wrapping ErrInvalidLimit and are not sent.
// Two items for one bucket are two refunds, run in their order. The returned error is
// the first item error (nil when every item was refunded); out must be at least as long
// as reqs. An item that timed out may have been refunded in Redis.
func (s *Store) RefundBatch(ctx context.Context, reqs []RefundRequest, out []RefundResult) error {
	if len(out) < len(reqs) {
		return fmt.Errorf("%w: RefundBatch: out has %d slots for %d requests", storeerr.ErrInvalidConfig, len(out), len(reqs))
	}
	out = out[:len(reqs)]
	if s.pipe == nil {
		for i, r := range reqs {
			out[i] = s.refundOne(ctx, r)
		}
		return firstErr(out, RefundResult.err)
	}
	var calls []batchItem // the script calls
	var of [][]int        // each call's items, indices in reqs
	open := map[int]int{} // a group's call still taking keys: its index in calls
	for i, r := range reqs {
		out[i] = RefundResult{}
		if err := checkRefund(r); err != nil || r.N == 0 {
			out[i].Err = err
			continue
		}
		bkey, err := s.requestBucket(r.Limit.Name, r.Key, r.ID)
		if err != nil {
			out[i].Err = err
			continue
		}
		seq := r.Seq
		if seq == 0 {
			seq = s.nextSeq()
		}
		out[i].Seq = seq
		group := s.together.of(bkey)
		c, ok := open[group]
		if !ok || len(of[c]) == RefundsPerCall {
			c = len(calls)
			calls, of = append(calls, batchItem{}), append(of, nil)
			if group >= 0 {
				open[group] = c
			}
		}
		call := &calls[c]
		call.keys = append(call.keys, bkey)
		call.args = append(call.args, r.refundArgs(s.serverID, seq)...)
		of[c] = append(of[c], i)
	}
	if !s.runBatch(ctx, s.pipe.Pipeline(), luascript.Refund, calls) {
		return firstErr(out, RefundResult.err)
	}
	var got [RefundsPerCall]wire.RefundReply
	for c, items := range of {
		answers := got[:len(items)]
		reply, err := calls[c].cmd.Result()
		if err != nil {
			err = wrap("refund", err)
		} else if perr := wire.ParseRefunds(reply, answers); perr != nil {
			err = unexpected("refund", perr.Error())
		}
		for k, i := range items {
			if err != nil {
				out[i].Err = err
				continue
			}
			if answers[k].Flag == luascript.Stale && reqs[i].Seq == 0 {
				// Overtaken by a concurrent refund of the same bucket (see maxStale): it
				// refunded nothing; refund again on its own.
				out[i] = s.refundOne(ctx, reqs[i])
				continue
			}
			out[i].Remaining, out[i].Err = answers[k].Tokens, refundErr(answers[k])
		}
	}
	return firstErr(out, RefundResult.err)
}

// RefundsPerCall is the most refunds one script call carries (RefundBatch). On
// redis-server 7.0, refunds of a Close (256 a round trip) to per-client keys of 8
// servers cost Redis 15.4–17.6 µs of CPU one a call, 12.6–13.4 four a call, 12.0–13.1
// at 32 (bench/rediscost's TestRefundCalls, two runs). Redis runs a call's refunds back
// to back, as it runs a pipeline's commands: a call of 32 holds other clients no longer
// than 32 calls of one in a pipeline did.
const RefundsPerCall = 32

// NextSeq returns a fresh sequence number of this Store, for RefundRequest.Seq: a caller
// that may give up on a batch before its answer arrives (a deadline) picks the numbers
// first, so that it can send the same refunds again without refunding twice.
func (s *Store) NextSeq() uint64 { return s.nextSeq() }

func (r TakeResult) err() error   { return r.Err }
func (r RefundResult) err() error { return r.Err }

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// firstErr returns the first item error of a batch's answers.
func firstErr[R any](out []R, errOf func(R) error) error {
	for _, r := range out {
		if err := errOf(r); err != nil {
			return err
		}
	}
	return nil
}

// Heartbeat records serverID as a live member of fleet until ttl from now by Redis's
// clock, drops members whose time has passed, and returns how many are live, this one
// included (luascript.Heartbeat). The hybrid tier divides a bucket among the live servers.
// Call it every ttl/3 or so; the fleet's key expires when every member has stopped.
func (s *Store) Heartbeat(ctx context.Context, fleet, serverID string, ttl time.Duration) (int, error) {
	if err := validName("fleet name", fleet); err != nil {
		return 0, err
	}
	if serverID == "" || len(serverID) > MaxNameLen {
		return 0, fmt.Errorf("%w: server id %q: 1 to %d bytes", storeerr.ErrInvalidLimit, serverID, MaxNameLen)
	}
	if ttl < time.Millisecond {
		return 0, fmt.Errorf("%w: heartbeat ttl %v is shorter than 1ms", storeerr.ErrInvalidLimit, ttl)
	}
	reply, err := luascript.Heartbeat.Run(ctx, s.c, []string{wire.FleetKey(s.prefix, fleet)}, serverID, ttl.Milliseconds()).Result()
	if err != nil {
		return 0, wrap("heartbeat", err)
	}
	n, err := wire.ParseHeartbeat(reply)
	if err != nil {
		return 0, unexpected("heartbeat", err.Error())
	}
	return n, nil
}

// Low is how the servers of a charge-later limit (hybrid.ChargeLater) tell each other
// which keys' buckets are low (luascript.Low): it marks ids, keys of limit this server found
// low, until memory from now by Redis's clock (a mark only moves later), unmarks those
// of unmark (found no longer low), drops the marks whose time has passed,
// and returns the IDs marked now, the latest first, at most wire.MaxLowReply. The marks
// live in the sorted set shard of shards of the limit (wire.LowKey: one, or
// wire.LowShards on a Cluster, each its own slot); ids and unmark are keys of that set
// (wire.LowShard).
func (s *Store) Low(ctx context.Context, limit string, shards, shard int, ids, unmark []KeyID, memory time.Duration) ([]KeyID, error) {
	got, errs := make([][]KeyID, 1), make([]error, 1)
	err := s.LowBatch(ctx, []LowSet{{Limit: limit, Shards: shards, Shard: shard, Mark: ids, Unmark: unmark}}, memory, got, errs)
	return got[0], err
}

// LowSet is one set of a LowBatch: set Shard of Shards of Limit's low keys, the keys to
// mark in it and to unmark, and ReadAt, the caller's estimate of Redis's time, by which
// a set with nothing to write is read (ReadOnly).
type LowSet struct {
	Limit         string
	Shards, Shard int
	Mark, Unmark  []KeyID
	ReadAt        time.Time
}

// ReadOnly reports whether x is only read, with one plain command (ZREVRANGEBYSCORE)
// judging marks by ReadAt, rather than run luascript.Low, whose bookkeeping (dropping
// passed marks, the set's TTL) only a write needs: x has nothing to write, and a ReadAt.
func (x *LowSet) ReadOnly() bool { return len(x.Mark)+len(x.Unmark) == 0 && !x.ReadAt.IsZero() }

// LowBatch makes Low, with memory, for each set of sets that is not ReadOnly, and reads
// the others at their ReadAt, in one pipelined round trip (per Cluster node), and
// writes each set's answer to got[i] and its error to errs[i]: the exchanges of a
// limit's sets with one master in one round trip. A set with more than
// wire.MaxLowWrite marks and unmarks writes them in runs of the script of at most that
// many each, the last of which reads the set: one run of many thousands would keep
// Redis from every other client for tens of milliseconds. As in TakeBatch, scripts go
// out as EVALSHA, and those answered NOSCRIPT again as EVAL in a second round trip. It
// returns the first error; got and errs must be at least as long as sets.
func (s *Store) LowBatch(ctx context.Context, sets []LowSet, memory time.Duration, got [][]KeyID, errs []error) error {
	if len(got) < len(sets) || len(errs) < len(sets) {
		return fmt.Errorf("%w: LowBatch: %d and %d answers for %d sets", storeerr.ErrInvalidConfig, len(got), len(errs), len(sets))
	}
	var scripts []batchItem
	runs := make([][2]int, len(sets)) // the set's runs of the script: scripts[from:to]
	reads := make([]*redis.StringSliceCmd, len(sets))
	var pipe redis.Pipeliner
	if s.pipe != nil {
		pipe = s.pipe.Pipeline()
	}
	for i := range sets {
		x := &sets[i]
		got[i], errs[i] = nil, checkLowSet(*x, memory)
		if errs[i] != nil {
			continue
		}
		key := wire.LowKey(s.prefix, x.Limit, x.Shards, x.Shard)
		if pipe != nil && x.ReadOnly() {
			reads[i] = pipe.ZRevRangeByScore(ctx, key, &redis.ZRangeBy{
				Max: "+inf", Min: "(" + strconv.FormatInt(x.ReadAt.UnixMilli(), 10), Count: wire.MaxLowReply})
			continue
		}
		runs[i][0] = len(scripts)
		for _, args := range lowRuns(*x, memory) {
			it := batchItem{keys: []string{key}, args: args}
			if pipe == nil {
				it.cmd = luascript.Low.Run(ctx, s.c, it.keys, it.args...)
			}
			scripts = append(scripts, it)
		}
		runs[i][1] = len(scripts)
	}
	if pipe != nil {
		s.runBatch(ctx, pipe, luascript.Low, scripts) // the reads queued above go with it
	}
	for i := range sets {
		if reads[i] != nil {
			if ids, err := reads[i].Result(); err != nil {
				errs[i] = wrap("low keys", err)
			} else {
				got[i] = keyIDs(ids)
			}
			continue
		}
		for _, it := range scripts[runs[i][0]:runs[i][1]] { // the last one's reply is the set's
			if got[i], errs[i] = lowReply(it.cmd.Result()); errs[i] != nil {
				break
			}
		}
	}
	for _, err := range errs[:len(sets)] {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkLowSet reports what is wrong with x, a set of a LowBatch, or memory.
func checkLowSet(x LowSet, memory time.Duration) error {
	if err := validName("limit name", x.Limit); err != nil {
		return err
	}
	if !validShard(x.Shards, x.Shard) {
		return fmt.Errorf("%w: limit %q: low-key set %d of %d (at most %d)", storeerr.ErrInvalidLimit, x.Limit, x.Shard, x.Shards, MaxWindowShards)
	}
	if memory < time.Millisecond {
		return fmt.Errorf("%w: low-key memory %v is shorter than 1ms", storeerr.ErrInvalidLimit, memory)
	}
	return nil
}

// lowRuns are luascript.Low's arguments for x with memory: one run of the script, or,
// for more than wire.MaxLowWrite marks and unmarks, a run for every MaxLowWrite of them,
// the marks first, of which only the last returns what the set marks.
func lowRuns(x LowSet, memory time.Duration) [][]any {
	m, n := len(x.Mark), len(x.Mark)+len(x.Unmark)
	runs := make([][]any, 0, wire.LowRuns(n))
	for from := 0; from == 0 || from < n; from += wire.MaxLowWrite {
		to := min(from+wire.MaxLowWrite, n)
		most := 0
		if to == n {
			most = wire.MaxLowReply
		}
		runs = append(runs, lowArgs(x.Mark[min(from, m):min(to, m)], x.Unmark[max(from-m, 0):max(to-m, 0)], memory, most))
	}
	return runs
}

// lowArgs are luascript.Low's arguments with memory: to mark mark and unmark unmark, and
// return at most most of the set's marks.
func lowArgs[S ~string](mark, unmark []S, memory time.Duration, most int) []any {
	args := make([]any, 0, 3+len(mark)+len(unmark))
	args = append(args, memory.Milliseconds(), len(mark), most)
	for _, id := range mark {
		args = append(args, string(id))
	}
	for _, id := range unmark {
		args = append(args, string(id))
	}
	return args
}

// lowReply decodes luascript.Low's answer.
func lowReply(reply any, err error) ([]KeyID, error) {
	if err != nil {
		return nil, wrap("low keys", err)
	}
	ids, err := wire.ParseLow(reply)
	if err != nil {
		return nil, unexpected("low keys", err.Error())
	}
	return keyIDs(ids), nil
}

// keyIDs converts ids to KeyIDs.
func keyIDs(ids []string) []KeyID {
	out := make([]KeyID, len(ids))
	for i, id := range ids {
		out[i] = KeyID(id)
	}
	return out
}
