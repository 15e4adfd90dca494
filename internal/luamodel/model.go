// Package luamodel is a Go model of fleetlimit's Redis scripts (package lua): Bucket,
// Take, Refund and Heartbeat, run over an in-memory keyspace whose key TTLs age the way
// miniredis's do with ClockTTL(true) and SetTime.
//
// It exists for speed only. miniredis spends ~300 µs of wall time per script call, and the
// simulator's per-request strategies at 200 servers make 1.5 M calls per run; tests that
// need a fleet-wide bucket in virtual time need one cheaper than a Redis. The model is not
// a second definition of the scripts: the Lua is. TestModelMatchesScripts and
// FuzzModelMatchesScripts run random operation sequences (replays, stale sequence numbers,
// clock jumps past TTLs and the 120 s record age, clock steps back, hashes over 256 fields,
// servers joining and leaving a fleet) through the model and through the Lua on miniredis
// and, when one answers, on a real Redis, and require the same answers and the same keys,
// fields and TTLs after every step. A change to a script that the model does not follow
// fails them.
//
// Arithmetic is done in float64 in the same order as the Lua source, so the answers are the
// same doubles, not approximations of them. Time is a parameter of every call: the instant
// at which Redis runs the command, read by the scripts as TIME (whole milliseconds). A
// Model is not safe for concurrent use.
package luamodel

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/tokenbucket"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// A Model is one Redis keyspace on which the scripts run. The zero value is not usable;
// call New.
type Model struct {
	keys map[string]*entry
	// miniredis ClockTTL: TTLs shrink by the forward movement of the clock since the last
	// tick; a backwards SetTime only moves the baseline. fwd is that accumulated movement.
	fwd      time.Duration
	lastTick time.Time
	ticked   bool
}

// entry is one key: a bucket hash (fields) or a fleet's sorted set (zset).
type entry struct {
	fields map[string]string
	zset   map[string]float64
	ttl    bool
	expire time.Duration // in Model.fwd units
}

// New returns an empty keyspace.
func New() *Model { return &Model{keys: make(map[string]*entry)} }

// NowMillis is the scripts' now at instant t: TIME seconds*1000 + floor(microseconds/1000).
func NowMillis(t time.Time) float64 {
	ns := t.UnixNano()
	sec := ns / 1e9
	usec := (ns / 1e3) % 1e6
	return float64(sec)*1000 + math.Floor(float64(usec)/1000)
}

// tick ages TTLs to now and drops expired keys, as miniredis does on every database access.
func (m *Model) tick(now time.Time) {
	if !m.ticked {
		m.lastTick, m.ticked = now, true
		return
	}
	if now.Before(m.lastTick) {
		m.lastTick = now
		return
	}
	m.fwd += now.Sub(m.lastTick)
	m.lastTick = now
}

// get returns the live entry for key (nil if absent or expired, in which case it is dropped).
func (m *Model) get(key string) *entry {
	e := m.keys[key]
	if e == nil {
		return nil
	}
	if e.ttl && m.fwd >= e.expire {
		delete(m.keys, key)
		return nil
	}
	return e
}

func (m *Model) getOrCreate(key string) *entry {
	if e := m.get(key); e != nil {
		return e
	}
	e := &entry{}
	m.keys[key] = e
	return e
}

func (m *Model) hash(key string) *entry {
	e := m.getOrCreate(key)
	if e.fields == nil {
		e.fields = make(map[string]string, 4)
	}
	return e
}

func (m *Model) pexpire(key string, ms float64) {
	if e := m.get(key); e != nil {
		e.ttl = true
		e.expire = m.fwd + time.Duration(ms)*time.Millisecond
	}
}

// pttl is PTTL as miniredis answers it: -2 without the key, -1 without a TTL, else the
// milliseconds left, rounded down.
func (m *Model) pttl(key string) int64 {
	e := m.get(key)
	switch {
	case e == nil:
		return -2
	case !e.ttl:
		return -1
	}
	return (e.expire - m.fwd).Milliseconds()
}

// luaNum formats a Lua number the way miniredis passes it to redis.call (integers as
// integers, else Go's shortest round-trip form). Real Redis uses %.17g; both parse back to
// the same double, which is all the model relies on.
func luaNum(x float64) string {
	if x == math.Trunc(x) && math.Abs(x) < 1<<63 {
		return strconv.FormatInt(int64(x), 10)
	}
	return fmt.Sprint(x)
}

// tonumber is Lua's tonumber on a stored field; ok is false for a missing or non-numeric one.
func tonumber(s string, present bool) (float64, bool) {
	if !present {
		return 0, false
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, false
	}
	return f, true
}

func (e *entry) field(f string) (string, bool) {
	if e == nil {
		return "", false
	}
	v, ok := e.fields[f]
	return v, ok
}

// refill is the shared first half of every bucket script: read tokens and ts, refill.
func (e *entry) refill(capacity, rate, now float64) (tokens, ts float64) {
	tokens, ts = e.refillHeld(capacity, capacity, rate, now)
	return tokens, ts
}

// refillHeld is refill on the parameters the bucket held until now (heldCap, heldRate),
// capped at the capacity in force from now on, as take.lua and refund.lua do.
func (e *entry) refillHeld(capacity, heldCap, heldRate, now float64) (tokens, ts float64) {
	tokens, ok := tonumber(e.field("tokens"))
	if !ok {
		tokens = heldCap
	}
	if ts, ok = tonumber(e.field("ts")); !ok {
		ts = now
	}
	tokens = math.Min(math.Min(capacity, heldCap), tokens+math.Max(0, now-ts)/1000*heldRate)
	return tokens, ts
}

// credit is the field c of take.lua and refund.lua at now for a bucket held at heldCap and
// heldRate until now, of capacity and rate from now on: the refill it lost to its cap,
// cumulative, from now·rate for a bucket with no history.
func (e *entry) credit(capacity, rate, heldCap, heldRate, now float64) float64 {
	stored, okTokens := tonumber(e.field("tokens"))
	c, okCredit := e.heldCredit()
	if !okTokens || !okCredit {
		c = now / 1000 * rate
	}
	if !okTokens {
		stored = heldCap
	}
	ts, ok := tonumber(e.field("ts"))
	if !ok {
		ts = now
	}
	capped := math.Min(capacity, heldCap)
	if raw := stored + math.Max(0, now-ts)/1000*heldRate; raw > capped {
		c += raw - capped
	}
	return c
}

// creditField is the value of c: string.format('%.17g %d', credit, now).
func creditField(c, now float64) string { return fmt.Sprintf("%.17g %d", c, int64(now)) }

// Params are a bucket's parameters: capacity, rate and the version that orders them.
type Params struct {
	Capacity, Rate float64
	Version        uint64
}

// held reads the field p of take.lua and refund.lua: the parameters the bucket holds, and
// whether it holds any.
func (e *entry) held() (Params, bool) {
	v, ok := e.field("p")
	if !ok {
		return Params{}, false
	}
	p := strings.Fields(v)
	if len(p) != 4 {
		return Params{}, false
	}
	pv, ok1 := tonumber(p[0], true)
	pc, ok2 := tonumber(p[1], true)
	pr, ok3 := tonumber(p[2], true)
	if !ok1 || !ok2 || !ok3 || !(pc >= 1) || !(pr > 0) {
		return Params{}, false
	}
	return Params{Capacity: pc, Rate: pr, Version: uint64(pv)}, true
}

// params is take.lua's choice: the parameters the bucket held (the caller's when it holds
// none) and those in force from now on, the highest version's (the caller's on a tie).
func (e *entry) params(caller Params) (held, force Params) {
	held, ok := e.held()
	if !ok {
		return caller, caller
	}
	if held.Version > caller.Version {
		return held, held
	}
	return held, caller
}

// refreshMS is how old p and c may be before a take or refund writes them again though
// they hold what it would write (take.lua's and refund.lua's fresh).
const refreshMS = 30000

// setParams writes p and c after a take or refund on the parameters p, at ms, as the
// scripts do: each only when its value changes (p when it holds other parameters or
// none, c when the credit differs from what it holds or it holds none) or when it was
// written (its last number) refreshMS or more before ms.
func (e *entry) setParams(p Params, credit, ms float64) {
	if held, ok := e.held(); !ok || held != p || !e.fresh("p", 4, ms) {
		e.fields["p"] = paramsField(p, ms)
	}
	if old, ok := e.heldCredit(); !ok || old != credit || !e.fresh("c", 2, ms) {
		e.fields["c"] = creditField(credit, ms)
	}
}

// fresh reports whether the field f (p or c) holds n words, the last a time less than
// refreshMS before ms: the scripts' fresh.
func (e *entry) fresh(f string, n int, ms float64) bool {
	v, _ := e.field(f)
	w := strings.Fields(v)
	if len(w) != n {
		return false
	}
	at, ok := tonumber(w[n-1], true)
	return ok && ms-at < refreshMS
}

// heldCredit reads the credit the field c holds ('<credit> <ms>'), and whether it holds
// one.
func (e *entry) heldCredit() (float64, bool) {
	v, _ := e.field("c")
	if w := strings.Fields(v); len(w) == 2 {
		return tonumber(w[0], true)
	}
	return 0, false
}

// restsFull reports whether refund.lua writes nothing for a refund to the bucket of
// capacity, holding tokens at ms once refilled (refill: capped at capacity, so full
// exactly when its refill reached the cap): it holds tokens, and its p and c are fresh.
func (e *entry) restsFull(tokens, capacity, ms float64) bool {
	_, stored := tonumber(e.field("tokens"))
	_, held := e.held()
	_, credit := e.heldCredit()
	return stored && tokens == capacity && held && credit && e.fresh("p", 4, ms) && e.fresh("c", 2, ms)
}

// paramsField is the value take.lua and refund.lua store in p: string.format('%d %.17g
// %.17g %d', version, capacity, rate, now).
func paramsField(p Params, now float64) string {
	return fmt.Sprintf("%d %.17g %.17g %d", p.Version, p.Capacity, p.Rate, int64(now))
}

// ttlOf is the TTL of a bucket of capacity and rate that holds tokens: the time it takes
// to be full again, from below zero too, plus 1 s.
func ttlOf(capacity, rate, tokens float64) float64 {
	return tokenbucket.TTLMillis(math.Max(capacity, capacity-tokens), rate)
}

// storeTTL is the scripts' shared second half: HSET tokens and ts (and a record when
// field is not empty), then PEXPIRE ttl: every script keeps a bucket until it is full
// again, a bucket below zero longer, ceil(max(capacity, capacity - tokens) / rate * 1000)
// + 1000 (ttlOf).
func (m *Model) storeTTL(key string, ttl float64, tokens, ts string, field, record string) {
	e := m.hash(key)
	e.fields["tokens"] = tokens
	e.fields["ts"] = ts
	if field != "" {
		e.fields[field] = record
	}
	m.pexpire(key, ttl)
}

// Bucket runs luascript.Bucket: the source article's script with ts = max(ts, now).
func (m *Model) Bucket(now time.Time, key string, capacity, rate, cost float64) wire.BucketReply {
	m.tick(now)
	ms := NowMillis(now)
	tokens, ts := m.get(key).refill(capacity, rate, ms)
	allowed := tokens >= cost
	if allowed {
		tokens -= cost
	}
	m.storeTTL(key, ttlOf(capacity, rate, tokens), luaNum(tokens), luaNum(math.Max(ts, ms)), "", "")
	return wire.BucketReply{Allowed: allowed, Tokens: tokens}
}

// BucketCallerClock runs CallerClockSource: luascript.Bucket as it would be if it trusted the
// caller's clock, callerMillis, instead of Redis TIME, and stored ts = now as the source
// article does. It is the mistake the article warns about, kept for the simulator's
// clock-skew scenario.
func (m *Model) BucketCallerClock(now time.Time, key string, capacity, rate, cost, callerMillis float64) wire.BucketReply {
	m.tick(now)
	tokens, _ := m.get(key).refill(capacity, rate, callerMillis)
	allowed := tokens >= cost
	if allowed {
		tokens -= cost
	}
	m.storeTTL(key, ttlOf(capacity, rate, tokens), luaNum(tokens), luaNum(callerMillis), "", "")
	return wire.BucketReply{Allowed: allowed, Tokens: tokens}
}

// prune is the scripts' bound on the hash: on a server's first record, when the hash holds
// tokens and more than 256 fields, records older than 120 s (or unparsable) are dropped.
func (e *entry) prune(now float64) {
	if _, ok := e.field("tokens"); !ok || len(e.fields) <= 256 {
		return
	}
	for f, v := range e.fields {
		if f == "tokens" || f == "ts" || f == "p" || f == "c" {
			continue
		}
		parts := strings.Fields(v)
		when, ok := 0.0, false
		if len(parts) > 0 {
			when, ok = tonumber(parts[len(parts)-1], true)
		}
		if !ok || now-when > 120000 {
			delete(e.fields, f)
		}
	}
}

// record returns the fields of server's record in field, if it holds n of them, and
// whether it does; without a record it first prunes the hash, as the scripts do.
func (e *entry) record(field string, n int, now float64) ([]float64, bool) {
	e.firstRecord(field, now)
	return e.peekRecord(field, n)
}

// firstRecord prunes the hash, as the scripts do, when it holds no record in field.
func (e *entry) firstRecord(field string, now float64) {
	if _, ok := e.field(field); !ok {
		e.prune(now)
	}
}

// peekRecord is record without the pruning.
func (e *entry) peekRecord(field string, n int) ([]float64, bool) {
	rec, ok := e.field(field)
	if !ok {
		return nil, false
	}
	p := strings.Fields(rec)
	if len(p) != n {
		return nil, false
	}
	out := make([]float64, n)
	for i := range p {
		out[i], _ = tonumber(p[i], true)
	}
	return out, true
}

// open is the first half of take.lua and refund.lua: the scripts' now, the parameters in
// force, the refilled bucket, and the record of the caller's last call in field (n
// numbers), when there is one (without one, the hash is pruned first).
func (m *Model) open(now time.Time, key string, caller Params, field string, n int) (ms float64, p Params, tokens, ts float64, rec []float64, found bool) {
	m.tick(now)
	ms = NowMillis(now)
	e := m.get(key)
	held, p := e.params(caller)
	tokens, ts = e.refillHeld(p.Capacity, held.Capacity, held.Rate, ms)
	rec, found = e.record(field, n, ms)
	return ms, p, tokens, ts, rec, found
}

// Take runs luascript.Take: up to want tokens, at least minimum, idempotent per (server, seq),
// on the parameters of the highest version, leaving the bucket no lower than -floor; a
// bucket that does not exist although the caller saw it within capacity/rate + 500 ms starts
// empty (or at the level seen, if below zero).
func (m *Model) Take(now time.Time, key string, capacity, rate float64, want, minimum int, server string, seq, version uint64, floor int, seen wire.Seen) wire.TakeReply {
	field := "t:" + server
	if floor > 0 {
		field = "k:" + server // a claim's record (take.lua)
	}
	m.tick(now)
	held, force := m.get(key).params(Params{capacity, rate, version})
	credit := m.get(key).credit(force.Capacity, force.Rate, held.Capacity, held.Rate, NowMillis(now))
	_, stored := tonumber(m.get(key).field("tokens"))
	ms, p, tokens, ts, rec, found := m.open(now, key, Params{capacity, rate, version}, field, 5)
	if !stored && seen.Known && NowMillis(now)-float64(seen.AtMS) < force.Capacity/force.Rate*1000+500 {
		tokens, ts = math.Min(seen.Level, 0), ms
	}
	capacity, rate, version = p.Capacity, p.Rate, p.Version
	switch {
	case found && rec[0] == float64(seq):
		return wire.TakeReply{Granted: int(rec[1]), Tokens: rec[2], WaitMS: int64(rec[3]), NowMS: int64(rec[4]), Flag: 1, Version: version, Credit: credit}
	case found && rec[0] > float64(seq):
		wait := tokenbucket.WaitMillis(float64(minimum)-float64(floor)-tokens, rate)
		return wire.TakeReply{Tokens: tokens, WaitMS: int64(wait), NowMS: int64(ms), Flag: 2, Version: version, Credit: credit}
	}
	granted := 0.0
	if avail := tokens + float64(floor); avail >= float64(want) {
		granted = float64(want)
	} else if math.Floor(avail) >= float64(minimum) {
		granted = math.Floor(avail)
	}
	tokens -= granted
	wait := 0.0
	if granted == 0 {
		wait = tokenbucket.WaitMillis(float64(minimum)-float64(floor)-tokens, rate)
	} else if tokens < 0 {
		wait = math.Ceil(-tokens / rate * 1000)
	}
	left := luaNum(tokens)
	m.storeTTL(key, ttlOf(capacity, rate, tokens), left, luaNum(math.Max(ts, ms)), field,
		strconv.FormatUint(seq, 10)+" "+luaNum(granted)+" "+left+" "+luaNum(wait)+" "+luaNum(ms))
	m.get(key).setParams(p, credit, ms)
	flag := 0
	if !found {
		flag = 3 // luascript.First
	}
	return wire.TakeReply{Granted: int(granted), Tokens: tokens, WaitMS: int64(wait), NowMS: int64(ms), Flag: flag, Version: version, Credit: credit}
}

// Refund runs luascript.Refund: amount tokens back, capped at capacity, idempotent per (server,
// seq), on the parameters the bucket holds (the caller's if it holds none); nothing back
// when those are not the caller's; nothing, and nothing written, to a bucket that does
// not exist. A negative amount is a debt: forgiven first what the bucket's credit grew
// since ref (none when ref is NaN), then charged, never below -floor.
func (m *Model) Refund(now time.Time, key string, capacity, rate float64, amount int, server string, seq, version uint64, floor int, ref float64) wire.RefundReply {
	field := "r:" + server
	if amount < 0 {
		field = "d:" + server // a debt's record (see refund.lua)
	}
	m.tick(now)
	ms := NowMillis(now)
	e := m.get(key)
	p := Params{capacity, rate, version}
	if held, ok := e.held(); ok {
		if held != p && amount > 0 {
			amount = 0 // leased under other parameters
		}
		p = held // a refund never re-shapes
	}
	capacity, rate = p.Capacity, p.Rate
	if _, stored := tonumber(e.field("tokens")); !stored && amount > 0 {
		return wire.RefundReply{Tokens: capacity, Version: p.Version}
	}
	credit := e.credit(capacity, rate, capacity, rate, ms)
	tokens, ts := e.refill(capacity, rate, ms)
	rec, found := e.peekRecord(field, 3)
	switch {
	case found && rec[0] == float64(seq):
		return wire.RefundReply{Tokens: rec[1], Flag: 1, Version: p.Version}
	case found && rec[0] > float64(seq):
		return wire.RefundReply{Tokens: tokens, Flag: 2, Version: p.Version}
	}
	if amount >= 0 && e.restsFull(tokens, capacity, ms) {
		return wire.RefundReply{Tokens: capacity, Version: p.Version}
	}
	e.firstRecord(field, ms)
	if amount < 0 {
		debt := float64(amount)
		if credit > ref { // false for NaN
			forgiven := math.Min(-debt, credit-ref)
			debt, credit = debt+forgiven, credit-forgiven
		}
		tokens = math.Max(tokens+debt, math.Min(tokens, -float64(floor)))
	} else {
		tokens = math.Min(capacity, tokens+float64(amount))
	}
	left := luaNum(tokens)
	m.storeTTL(key, ttlOf(capacity, rate, tokens), left, luaNum(math.Max(ts, ms)), field,
		strconv.FormatUint(seq, 10)+" "+left+" "+luaNum(ms))
	m.get(key).setParams(p, credit, ms)
	return wire.RefundReply{Tokens: tokens, Version: p.Version}
}

// Heartbeat runs luascript.Heartbeat on the fleet's sorted set key: server is live until now +
// ttlMS, members whose time has passed go, and the key lives at least ttlMS. It returns the
// number of live servers, this one included. ttlMS must be at least 1 (the script refuses
// less).
func (m *Model) Heartbeat(now time.Time, key, server string, ttlMS int64) int {
	m.tick(now)
	ms := NowMillis(now)
	e := m.getOrCreate(key)
	if e.zset == nil {
		e.zset = make(map[string]float64)
	}
	ttl := float64(ttlMS)
	e.zset[server] = ms + ttl
	for s, expiry := range e.zset {
		if expiry <= ms {
			delete(e.zset, s)
		}
	}
	live := len(e.zset)
	if float64(m.pttl(key)) < ttl {
		m.pexpire(key, ttl)
	}
	return live
}

// Low runs luascript.Low on the limit's sorted set key: each of ids is marked low until now +
// memoryMS (a mark only moves later), each of unmark is not, marks whose time has passed go, at most 100,000
// stay (the latest), and the key lives at least memoryMS. It returns the ids marked, the
// latest first (equal marks by id, descending, as ZREVRANGEBYSCORE orders them), at most
// 10,000. memoryMS must be at least 1 (the script refuses less).
func (m *Model) Low(now time.Time, key string, memoryMS int64, ids, unmark []string) []string {
	m.tick(now)
	ms := NowMillis(now)
	mem := float64(memoryMS)
	e := m.get(key)
	if e == nil && len(ids) > 0 {
		e = m.getOrCreate(key)
	}
	if e == nil {
		return []string{}
	}
	if e.zset == nil {
		e.zset = make(map[string]float64)
	}
	for _, id := range ids {
		if old, ok := e.zset[id]; !ok || ms+mem > old {
			e.zset[id] = ms + mem
		}
	}
	for _, id := range unmark {
		delete(e.zset, id)
	}
	for id, until := range e.zset {
		if until <= ms {
			delete(e.zset, id)
		}
	}
	marks := latestFirst(e.zset, math.Inf(-1))
	if len(marks) > 100000 {
		for _, x := range marks[100000:] {
			delete(e.zset, x.id)
		}
		marks = marks[:100000]
	}
	if len(e.zset) == 0 {
		delete(m.keys, key)
		return []string{}
	}
	if float64(m.pttl(key)) < mem {
		m.pexpire(key, mem)
	}
	return idsOf(marks)
}

// idsOf returns the ids of the first wire.MaxLowReply of marks: what a read answers.
func idsOf(marks []mark) []string {
	marks = marks[:min(len(marks), wire.MaxLowReply)]
	out := make([]string, len(marks))
	for i, x := range marks {
		out[i] = x.id
	}
	return out
}

// mark is a member of a sorted set of marks and its score, the time it lasts until.
type mark struct {
	id    string
	until float64
}

// latestFirst returns the marks of zset that last past after, the latest first, equal
// marks by id, descending (as ZREVRANGEBYSCORE orders them).
func latestFirst(zset map[string]float64, after float64) []mark {
	marks := make([]mark, 0, len(zset))
	for id, until := range zset {
		if until > after {
			marks = append(marks, mark{id, until})
		}
	}
	slices.SortFunc(marks, func(a, b mark) int {
		if a.until != b.until {
			if a.until > b.until {
				return -1
			}
			return 1
		}
		return -strings.Compare(a.id, b.id)
	})
	return marks
}

// LowRead is the ZREVRANGEBYSCORE with which redisstore.Store.LowBatch reads a set that
// has nothing to write (LowSet.ReadOnly), on the sorted set key at now: the ids marked
// after fromMS (the caller's estimate of Redis's clock, in ms), the latest first (equal
// marks by id, descending), at most wire.MaxLowReply. It changes nothing but the keyspace's
// clock.
func (m *Model) LowRead(now time.Time, key string, fromMS int64) []string {
	m.tick(now)
	e := m.get(key)
	if e == nil {
		return []string{}
	}
	return idsOf(latestFirst(e.zset, float64(fromMS)))
}

// Tokens is what the bucket of key holds at now, for a limit of capacity and rate at
// version 0: what the next take or refund would find after its refill, on the parameters
// the bucket holds if it holds any (capacity for a bucket that does not exist or has
// expired). It changes nothing but the keyspace's clock.
func (m *Model) Tokens(now time.Time, key string, capacity, rate float64) float64 {
	m.tick(now)
	e := m.get(key)
	held, p := e.params(Params{Capacity: capacity, Rate: rate})
	tokens, _ := e.refillHeld(p.Capacity, held.Capacity, held.Rate, NowMillis(now))
	return tokens
}

// HMGet is the naive strategy's read, HMGET key tokens ts: the two fields and whether each
// is there.
func (m *Model) HMGet(now time.Time, key string) (tokens, ts float64, okTokens, okTS bool) {
	m.tick(now)
	e := m.get(key)
	tokens, okTokens = tonumber(e.field("tokens"))
	ts, okTS = tonumber(e.field("ts"))
	return
}

// HSetExpire is the naive strategy's write: HSET key tokens ts, then PEXPIRE ttlMS.
func (m *Model) HSetExpire(now time.Time, key string, tokens, ts, ttlMS float64) {
	m.tick(now)
	e := m.hash(key)
	e.fields["tokens"] = luaNum(tokens)
	e.fields["ts"] = luaNum(ts)
	m.pexpire(key, ttlMS)
}

// Fields returns a copy of key's hash fields (HGETALL); nil if the key is not a live hash.
func (m *Model) Fields(now time.Time, key string) map[string]string {
	m.tick(now)
	if e := m.get(key); e != nil && e.fields != nil {
		return maps.Clone(e.fields)
	}
	return nil
}

// Members returns a copy of key's sorted set, member to score (ZRANGE WITHSCORES); nil if
// the key is not a live sorted set.
func (m *Model) Members(now time.Time, key string) map[string]float64 {
	m.tick(now)
	if e := m.get(key); e != nil && e.zset != nil {
		return maps.Clone(e.zset)
	}
	return nil
}

// PTTL is key's time to live in milliseconds, rounded down, as miniredis answers PTTL: -2
// for a key that does not exist, -1 for one without a TTL.
func (m *Model) PTTL(now time.Time, key string) int64 {
	m.tick(now)
	return m.pttl(key)
}

// Keys returns the live keys, sorted.
func (m *Model) Keys(now time.Time) []string {
	m.tick(now)
	var ks []string
	for k := range m.keys {
		if m.get(k) != nil {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}

// Clone returns a copy of the keyspace that shares nothing with m: a caller can try an
// operation at several instants and keep the copy that matches.
func (m *Model) Clone() *Model {
	c := *m
	c.keys = make(map[string]*entry, len(m.keys))
	for k, e := range m.keys {
		ce := *e
		ce.fields = maps.Clone(e.fields)
		ce.zset = maps.Clone(e.zset)
		c.keys[k] = &ce
	}
	return &c
}
