package luamodel

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// newLua returns a Lua that runs the scripts through client c (on miniredis mini, whose
// clock it sets, when mini is not nil) and keeps the first error in *err.
func newLua(c redis.Scripter, mini *miniredis.Miniredis, err *error) *Lua {
	return &Lua{
		Eval: func(s *redis.Script, keys []string, args ...any) (any, error) {
			return s.Run(context.Background(), c, keys, args...).Result()
		},
		Mini: mini,
		OnError: func(e error) {
			if *err == nil {
				*err = e
			}
		},
	}
}

// entropy feeds the operation generator: a seeded PRNG in TestModelMatchesScripts, the
// fuzzer's bytes in FuzzModelMatchesScripts.
type entropy interface{ IntN(n int) int }

type byteEntropy struct {
	b []byte
	i int
}

func (e *byteEntropy) IntN(n int) int {
	var v int
	for k := 0; k < 2; k++ {
		v <<= 8
		if e.i < len(e.b) {
			v |= int(e.b[e.i])
			e.i++
		}
	}
	return v % n
}

// mop is one operation of a differential sequence.
type mop struct {
	kind             string // bucket, caller, take, refund, heartbeat
	key              string
	capacity, rate   float64
	n, min           int // cost / want / amount; min for take
	server           string
	seq              uint64
	version          uint64        // of capacity and rate, for take and refund
	floor            int           // take; refund (a debt's floor)
	ref              float64       // a debt's reference credit; NaN: none
	seen             wire.Seen     // take: what the caller last heard of the bucket (AtMS set when it runs)
	seenAge          int64         // take: how long before it runs, in ms
	ttlMS            int64         // heartbeat; low's memory
	ids, unmark      []string      // low
	dt               time.Duration // clock move before the op (negative: Redis clock steps back)
	callerSkewMillis float64       // caller clock - Redis clock, for kind caller
}

func (o mop) String() string {
	return fmt.Sprintf("%s(%s cap=%v rate=%v v%d n=%d min=%d floor=%d seen=%+v %s seq=%d ttl=%dms) after %v skew %vms",
		o.kind, o.key, o.capacity, o.rate, o.version, o.n, o.min, o.floor, o.seen, o.server, o.seq, o.ttlMS, o.dt, o.callerSkewMillis)
}

// bucketKeys are the bucket hashes of a sequence; fleetKey is its fleet's sorted set.
var bucketKeys = []string{"a", "b", "c"}

const fleetKey = "fleet"

// lowKey is a sequence's low-key set (luascript.Low); lowIDs the key IDs it marks.
const lowKey = "low"

var lowIDs = []string{"k1", "k2", "k3", "k4", "k5"}

var (
	capacities = []float64{1, 2, 3, 10, 100, 10000}
	rates      = []float64{0.5, 1, 3, 7, 10, 100, 1000, 100000}
	// Heartbeat TTLs; the short ones only on miniredis, whose clock the test sets (on a
	// real Redis a key could expire between the script and the test's read of it).
	miniTTLs = []int64{1, 7, 100, 1000, 5000, 30000}
	realTTLs = []int64{1000, 5000, 30000}
)

// genOps draws a random operation sequence. onMini allows what only miniredis can do: a
// clock that steps back or jumps far, and heartbeats shorter than a round trip.
func genOps(e entropy, n int, onMini bool) []mop {
	type params struct {
		capacity, rate float64
		version        uint64
	}
	p := map[string]params{}
	for _, k := range bucketKeys {
		p[k] = params{capacities[e.IntN(len(capacities))], rates[e.IntN(len(rates))], 0}
	}
	ttls := realTTLs
	if onMini {
		ttls = miniTTLs
	}
	nservers := []int{2, 5, 300}[e.IntN(3)]
	seqs := map[string]uint64{}
	ops := make([]mop, 0, n)
	for range n {
		o := mop{key: bucketKeys[e.IntN(len(bucketKeys))]}
		pp := p[o.key]
		switch e.IntN(10) {
		case 0: // a caller that disagrees about the limit, at the same version
			pp = params{capacities[e.IntN(len(capacities))], rates[e.IntN(len(rates))], pp.version}
		case 1: // a change of the limit, or a server that has not heard of one
			pp = params{capacities[e.IntN(len(capacities))], rates[e.IntN(len(rates))], uint64(e.IntN(4))}
			if e.IntN(2) == 0 {
				p[o.key] = pp
			}
		}
		o.version = pp.version
		o.capacity, o.rate = pp.capacity, pp.rate
		c := int(o.capacity)
		switch e.IntN(8) {
		case 0, 1:
			o.kind, o.n = "bucket", 1+e.IntN(c+1)
		case 2:
			o.kind, o.n = "caller", 1+e.IntN(c+1)
			o.callerSkewMillis = float64(e.IntN(5001) - 1000)
		case 3, 4:
			o.kind, o.n = "take", 1+e.IntN(c+2)
			o.min = e.IntN(o.n + 1)
			if e.IntN(4) == 0 { // a reservation: may leave the bucket below zero
				o.floor = e.IntN(c + 1)
			}
			if e.IntN(2) == 0 { // a caller that heard of the bucket before
				// ages at least 300 ms from every capacity/rate + 500 ms of the draws
				o.seen = wire.Seen{Known: true, Level: []float64{-2, 0, 0.5, 3, o.capacity}[e.IntN(5)]}
				o.seenAge = []int64{0, 10, 4000, 100000}[e.IntN(4)]
			}
		case 5, 6:
			o.kind, o.n = "refund", e.IntN(c+2)
			if e.IntN(4) == 0 { // a debt
				o.n, o.floor = -e.IntN(2*c+1), e.IntN(2*c+1)
				// No reference, one far below any credit (all forgiven), or one above
				// (none forgiven).
				o.ref = []float64{math.NaN(), float64(e.IntN(40)), 1e300}[e.IntN(3)]
			}
		default:
			if e.IntN(2) == 0 {
				o = mop{kind: "heartbeat", key: fleetKey, ttlMS: ttls[e.IntN(len(ttls))]}
				break
			}
			if e.IntN(3) == 0 { // a read by a caller's clock, up to a second off
				o = mop{kind: "lowread", key: lowKey, callerSkewMillis: float64(e.IntN(2001) - 1000)}
				break
			}
			o = mop{kind: "low", key: lowKey, ttlMS: ttls[e.IntN(len(ttls))]}
			for range e.IntN(4) {
				o.ids = append(o.ids, lowIDs[e.IntN(len(lowIDs))])
			}
			for range e.IntN(3) {
				o.unmark = append(o.unmark, lowIDs[e.IntN(len(lowIDs))])
			}
		}
		o.server = fmt.Sprintf("s%d", e.IntN(nservers))
		if o.kind == "take" || o.kind == "refund" {
			s := seqs[o.server]
			switch e.IntN(10) {
			case 0: // replay of the last call
				o.seq = max(s, 1)
			case 1: // stale
				o.seq = max(s, 3) - 2
			default:
				s++
				seqs[o.server] = s
				o.seq = s
			}
		}
		switch r := e.IntN(20); {
		case r < 8:
			o.dt = time.Duration(e.IntN(5000)) * time.Microsecond
		case r < 14:
			o.dt = 0
		case r < 17:
			o.dt = time.Duration(e.IntN(200)) * time.Millisecond
		case !onMini:
			o.dt = time.Duration(e.IntN(3000)) * time.Microsecond
		case r < 19:
			o.dt = time.Duration(e.IntN(200)) * time.Second // past TTLs and the 120 s record age
		default:
			o.dt = -time.Duration(e.IntN(3000)) * time.Millisecond
		}
		ops = append(ops, o)
	}
	return ops
}

// result is one op's answer, the same shape from both sides.
type result struct {
	bucket wire.BucketReply
	take   wire.TakeReply
	refund wire.RefundReply
	live   int
	low    []string
}

func applyOp(s Scripts, now time.Time, prefix string, o mop) result {
	key := prefix + o.key
	switch o.kind {
	case "bucket":
		return result{bucket: s.Bucket(now, key, o.capacity, o.rate, float64(o.n))}
	case "caller":
		return result{bucket: s.BucketCallerClock(now, key, o.capacity, o.rate, float64(o.n), NowMillis(now)+o.callerSkewMillis)}
	case "take":
		return result{take: s.Take(now, key, o.capacity, o.rate, o.n, o.min, o.server, o.seq, o.version, o.floor, o.seenAt(now))}
	case "refund":
		return result{refund: s.Refund(now, key, o.capacity, o.rate, o.n, o.server, o.seq, o.version, o.floor, o.ref)}
	case "low":
		return result{low: s.Low(now, key, o.ttlMS, o.ids, o.unmark)}
	case "lowread":
		return result{low: s.LowRead(now, key, int64(NowMillis(now)+o.callerSkewMillis))}
	default:
		return result{live: s.Heartbeat(now, key, o.server, o.ttlMS)}
	}
}

// seenAt is o.seen with its time set, o.seenAge before now.
func (o mop) seenAt(now time.Time) wire.Seen {
	s := o.seen
	if s.Known {
		s.AtMS = int64(NowMillis(now)) - o.seenAge
	}
	return s
}

// near compares numbers parsed from both sides. A real Redis prints tostring() with %.14g
// (deps.md §1.5), so its tostring values may differ from the exact double in the last
// digits; tol is that relative tolerance (0 means exact).
func near(a, b, tol float64) bool {
	if a == b {
		return true
	}
	return math.Abs(a-b) <= tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

func sameResult(x, y result, tol float64) bool {
	return x.bucket.Allowed == y.bucket.Allowed && near(x.bucket.Tokens, y.bucket.Tokens, tol) &&
		x.take.Granted == y.take.Granted && near(x.take.Tokens, y.take.Tokens, tol) &&
		x.take.WaitMS == y.take.WaitMS && x.take.NowMS == y.take.NowMS && x.take.Flag == y.take.Flag &&
		x.take.Version == y.take.Version && x.refund.Version == y.refund.Version &&
		near(x.refund.Tokens, y.refund.Tokens, tol) && x.refund.Flag == y.refund.Flag &&
		x.live == y.live && slices.Equal(x.low, y.low)
}

// sameFields compares a bucket hash. With tol 0 (miniredis, whose Lua formats numbers as
// the model does) every field holds the same bytes. Else (real Redis, which passes
// numbers to commands as %.17g and concatenates them as %.14g) the fields hold the same
// words, their numbers equal: tokens and ts, stored with full precision on both sides,
// exactly, the others within tol.
func sameFields(want, got map[string]string, tol float64) error {
	if len(want) != len(got) {
		return fmt.Errorf("fields %v, model %v", got, want)
	}
	for f, wv := range want {
		gv, ok := got[f]
		if !ok {
			return fmt.Errorf("field %s missing (model has %q)", f, wv)
		}
		if tol == 0 && gv != wv {
			return fmt.Errorf("field %s = %q, model %q (not the same bytes)", f, gv, wv)
		}
		t := tol
		if f == "tokens" || f == "ts" {
			t = 0
		}
		wp, gp := strings.Fields(wv), strings.Fields(gv)
		if len(wp) != len(gp) {
			return fmt.Errorf("field %s = %q, model %q", f, gv, wv)
		}
		for i := range wp {
			a, ok1 := tonumber(wp[i], true)
			b, ok2 := tonumber(gp[i], true)
			if !ok1 || !ok2 || !near(a, b, t) {
				return fmt.Errorf("field %s = %q, model %q", f, gv, wv)
			}
		}
	}
	return nil
}

// sameMembers compares a fleet's sorted set: scores are whole milliseconds (exact).
func sameMembers(want map[string]float64, got []redis.Z) error {
	if len(want) != len(got) {
		return fmt.Errorf("members %v, model %v", got, want)
	}
	for _, z := range got {
		if s, ok := want[z.Member.(string)]; !ok || s != z.Score {
			return fmt.Errorf("member %v score %v, model %v (%v)", z.Member, z.Score, s, ok)
		}
	}
	return nil
}

// checkState compares every key of the sequence on the server with the model, in one
// round trip. TTLs agree to ttlTol ms: 0 (exact) on miniredis, whose clock the test sets.
// A real Redis's TTLs run on while the test reads them, and the model's instants are the
// whole milliseconds that matched each call, a millisecond or two off Redis's own.
func checkState(ctx context.Context, c *redis.Client, m *Model, now time.Time, prefix string, tol float64, ttlTol int64) error {
	pipe := c.Pipeline()
	hashes := make([]*redis.MapStringStringCmd, len(bucketKeys))
	for i, k := range bucketKeys {
		hashes[i] = pipe.HGetAll(ctx, prefix+k)
	}
	members := pipe.ZRangeWithScores(ctx, prefix+fleetKey, 0, -1)
	lows := pipe.ZRangeWithScores(ctx, prefix+lowKey, 0, -1)
	all := append(bucketKeys[:len(bucketKeys):len(bucketKeys)], fleetKey, lowKey)
	ttls := make([]*redis.DurationCmd, len(all))
	for i, k := range all {
		ttls[i] = pipe.PTTL(ctx, prefix+k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	for i, k := range bucketKeys {
		got := hashes[i].Val()
		if len(got) == 0 {
			got = nil
		}
		if err := sameFields(m.Fields(now, prefix+k), got, tol); err != nil {
			return fmt.Errorf("key %s: %w", k, err)
		}
	}
	if err := sameMembers(m.Members(now, prefix+fleetKey), members.Val()); err != nil {
		return fmt.Errorf("key %s: %w", fleetKey, err)
	}
	if err := sameMembers(m.Members(now, prefix+lowKey), lows.Val()); err != nil {
		return fmt.Errorf("key %s: %w", lowKey, err)
	}
	// A real Redis's TTLs ran on until it answered the read: as far below the model's as
	// the time since now, however long the machine took to get there.
	below := ttlTol
	if ttlTol > 0 {
		below = max(below, time.Since(now).Milliseconds()+25)
	}
	for i, k := range all {
		got, want := pttlMillis(ttls[i].Val()), m.PTTL(now, prefix+k)
		if got != want && (want < 0 || got > want+ttlTol || got < want-below) {
			return fmt.Errorf("key %s: PTTL %d ms, model %d ms", k, got, want)
		}
	}
	return nil
}

// pttlMillis reads go-redis's PTTL answer: the sentinels -1 and -2 come back as -1ns and
// -2ns (deps.md §1.2), anything else as a Duration.
func pttlMillis(d time.Duration) int64 {
	if d < 0 {
		return int64(d)
	}
	return d.Milliseconds()
}

// runMini runs ops on miniredis (clock set per op) and on the model, failing at the first
// difference.
func runMini(t testing.TB, mr *miniredis.Miniredis, c *redis.Client, prefix string, ops []mop) {
	t.Helper()
	ctx := context.Background()
	mr.ClockTTL(true)
	var err error
	lua := newLua(c, mr, &err)
	m := New()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for i, o := range ops {
		now = now.Add(o.dt)
		want := applyOp(m, now, prefix, o)
		got := applyOp(lua, now, prefix, o)
		if err != nil {
			t.Fatalf("op %d %v: %v", i, o, err)
		}
		if !sameResult(want, got, 0) {
			t.Fatalf("op %d %v at %v: scripts answered %+v, model %+v", i, o, now, got, want)
		}
		if err := checkState(ctx, c, m, now, prefix, 0, 0); err != nil {
			t.Fatalf("op %d %v: %v", i, o, err)
		}
	}
}

// runReal runs ops on a real Redis, whose clock the test cannot set: each op's instant is
// bracketed by the wall clock read before and after the call, and the model must give the
// same answer and state for one of the milliseconds in that bracket.
func runReal(t testing.TB, c *redis.Client, prefix string, ops []mop) {
	t.Helper()
	ctx := context.Background()
	var err error
	lua := newLua(c, nil, &err)
	m := New()
	// lag is the widest bracket so far, in ms: the model writes a key at the first instant
	// of its op's bracket that matches, Redis at some instant of it, so a key's TTL may run
	// on Redis up to that much longer than on the model, for as long as the key lives.
	var lag int64
	for i, o := range ops {
		if o.dt > 0 {
			time.Sleep(o.dt / 10) // real time has to pass for a real Redis to refill
		}
		before := time.Now()
		got := applyOp(lua, before, prefix, o)
		after := time.Now()
		if err != nil {
			t.Fatalf("op %d %v: %v", i, o, err)
		}
		lag = max(lag, int64(NowMillis(after))-int64(NowMillis(before))+2)
		var errs []string
		matched := false
		for ms := int64(NowMillis(before)) - 1; ms <= int64(NowMillis(after))+1 && !matched; ms++ {
			at := time.UnixMilli(ms).UTC()
			cand := m.Clone()
			want := applyOp(cand, at, prefix, o)
			if !sameResult(want, got, 1e-12) {
				errs = append(errs, fmt.Sprintf("at %dms model answered %+v", ms, want))
				continue
			}
			ttlTol := time.Since(before).Milliseconds() + 25 + lag
			if err := checkState(ctx, c, cand, at, prefix, 1e-12, ttlTol); err != nil {
				errs = append(errs, fmt.Sprintf("at %dms: %v", ms, err))
				continue
			}
			m, matched = cand, true
		}
		if !matched {
			t.Fatalf("op %d %v: Redis answered %+v; no instant in the call's bracket matches:\n%s", i, o, got, strings.Join(errs, "\n"))
		}
	}
}

// TestModelMatchesScripts is the differential test that licenses the Go model: random
// operation sequences of Bucket, the caller-clock variant, Take, Refund and Heartbeat (with
// replays, stale sequence numbers, clock jumps forward past TTLs and the 120 s record age,
// clock steps backwards, hashes over 256 fields, fleet members expiring) must get the same
// answers and leave the same keys, fields, members and TTLs on the model as the Lua scripts
// on miniredis and, when one answers, on a real Redis.
func TestModelMatchesScripts(t *testing.T) {
	seqs, n := 24, 250
	if testing.Short() {
		seqs, n = 6, 200
	}
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		for s := range seqs {
			r := rand.New(rand.NewPCG(uint64(s), 0x5eed))
			if tg.Real() {
				runReal(t, tg.Client, redistest.Unique(t)+":", genOps(r, n/4, false))
				continue
			}
			runMini(t, tg.Mini, tg.Client, fmt.Sprintf("seq%d:", s), genOps(r, n, true))
		}
	})
}

// FuzzModelMatchesScripts lets the fuzzer choose the operation sequences (miniredis only):
// go test ./internal/luamodel -run '^$' -fuzz FuzzModelMatchesScripts
func FuzzModelMatchesScripts(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte(strings.Repeat("\xff\x00\x7f\x10", 64)))
	f.Add([]byte(strings.Repeat("take refund bucket caller heartbeat", 8)))
	f.Fuzz(func(t *testing.T, b []byte) {
		mr, c := redistest.Mini(t)
		e := &byteEntropy{b: b}
		runMini(t, mr, c, "f:", genOps(e, min(len(b)/4+1, 150), true))
	})
}

// TestTokens: Tokens reads the level the next script would find, and writes nothing.
func TestTokens(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m := New()
	if got := m.Tokens(t0, "k", 100, 10); got != 100 {
		t.Fatalf("no bucket: %v tokens, want 100 (a missing bucket is full)", got)
	}
	if keys := m.Keys(t0); keys != nil {
		t.Fatalf("Tokens created %v", keys)
	}
	m.Take(t0, "k", 100, 10, 60, 1, "s", 1, 0, 0, wire.Seen{})
	tests := []struct {
		at   time.Duration
		take int // taken at this instant after the read, to see that reads spent nothing
		want float64
	}{
		{0, 0, 40},
		{500 * time.Millisecond, 0, 45},
		{-time.Second, 0, 40}, // a clock behind the bucket's ts refills nothing
		{500 * time.Millisecond, 5, 45},
		{500 * time.Millisecond, 0, 40},
		{10 * time.Second, 0, 100},
		{time.Hour, 0, 100}, // expired: full
	}
	for i, tt := range tests {
		at := t0.Add(tt.at)
		if got := m.Tokens(at, "k", 100, 10); got != tt.want {
			t.Errorf("read %d at %v: %v tokens, want %v", i, tt.at, got, tt.want)
		}
		if tt.take > 0 {
			m.Take(at, "k", 100, 10, tt.take, tt.take, "s", uint64(i+2), 0, 0, wire.Seen{})
		}
	}
	if keys := m.Keys(t0.Add(time.Hour)); keys != nil {
		t.Fatalf("keys %v after an hour, want none (the bucket's TTL is 11 s)", keys)
	}
}
