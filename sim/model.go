package sim

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// model is a Go re-implementation of the bucket scripts of package lua (Bucket, Take,
// Refund) over an in-memory keyspace whose key TTLs age the way miniredis's do with
// ClockTTL(true) and SetTime. It exists for speed only: miniredis spends ~300 µs of wall
// time per script call, and the per-request strategies at 200 servers make 1.5 M calls.
// TestModelMatchesScripts runs random operation sequences through both (and through a real
// Redis when one answers) and requires the same answers, so the model cannot drift from
// the scripts unnoticed.
//
// Arithmetic is done in float64 in the same order as the Lua source, so the answers are the
// same doubles, not approximations of them.
type model struct {
	keys map[string]*mhash
	// miniredis ClockTTL: TTLs shrink by the forward movement of the clock since the last
	// tick; a backwards SetTime only moves the baseline. fwd is that accumulated movement.
	fwd      time.Duration
	lastTick time.Time
	ticked   bool
}

// mhash is one bucket hash.
type mhash struct {
	fields map[string]string
	ttl    bool
	expire time.Duration // in model.fwd units
}

func newModel() *model { return &model{keys: make(map[string]*mhash)} }

// tick ages TTLs to now and drops expired keys, as miniredis does on every database access.
func (m *model) tick(now time.Time) {
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

// get returns the live hash for key (nil if absent or expired, in which case it is dropped).
func (m *model) get(key string) *mhash {
	h := m.keys[key]
	if h == nil {
		return nil
	}
	if h.ttl && m.fwd >= h.expire {
		delete(m.keys, key)
		return nil
	}
	return h
}

func (m *model) getOrCreate(key string) *mhash {
	if h := m.get(key); h != nil {
		return h
	}
	h := &mhash{fields: make(map[string]string, 4)}
	m.keys[key] = h
	return h
}

func (m *model) pexpire(key string, ms float64) {
	if h := m.get(key); h != nil {
		h.ttl = true
		h.expire = m.fwd + time.Duration(ms)*time.Millisecond
	}
}

// luaMillis is the scripts' now: TIME seconds*1000 + floor(microseconds/1000).
func luaMillis(t time.Time) float64 {
	ns := t.UnixNano()
	sec := ns / 1e9
	usec := (ns / 1e3) % 1e6
	return float64(sec)*1000 + math.Floor(float64(usec)/1000)
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

// refill is the shared first half of every bucket script: read tokens and ts, refill.
func (h *mhash) refill(capacity, rate, now float64) (tokens, ts float64) {
	var ok bool
	if h != nil {
		tokens, ok = tonumber(h.fields["tokens"], hasField(h, "tokens"))
	}
	if !ok {
		tokens = capacity
	}
	if h != nil {
		ts, ok = tonumber(h.fields["ts"], hasField(h, "ts"))
	}
	if !ok {
		ts = now
	}
	tokens = math.Min(capacity, tokens+math.Max(0, now-ts)/1000*rate)
	return tokens, ts
}

func hasField(h *mhash, f string) bool {
	if h == nil {
		return false
	}
	_, ok := h.fields[f]
	return ok
}

func bucketTTL(capacity, rate float64) float64 { return math.Ceil(capacity/rate*1000) + 1000 }

// Bucket runs lua.Bucket: the source article's script with ts = max(ts, now).
func (m *model) Bucket(now time.Time, key string, capacity, rate, cost float64) (allowed int, tokens float64) {
	m.tick(now)
	ms := luaMillis(now)
	h := m.get(key)
	tokens, ts := h.refill(capacity, rate, ms)
	if tokens >= cost {
		tokens -= cost
		allowed = 1
	}
	h = m.getOrCreate(key)
	h.fields["tokens"] = luaNum(tokens)
	h.fields["ts"] = luaNum(math.Max(ts, ms))
	m.pexpire(key, bucketTTL(capacity, rate))
	return allowed, tokens
}

// BucketCallerClock runs the article's script as it would be if it trusted the caller's
// clock: now comes from the caller (callerMillis) instead of Redis TIME, and, as in the
// article, ts = now. It is the mistake the article warns about, kept for the clock-skew
// scenario; see callerClockSource for its Lua text.
func (m *model) BucketCallerClock(now time.Time, key string, capacity, rate, cost, callerMillis float64) (allowed int, tokens float64) {
	m.tick(now)
	h := m.get(key)
	tokens, _ = h.refill(capacity, rate, callerMillis)
	if tokens >= cost {
		tokens -= cost
		allowed = 1
	}
	h = m.getOrCreate(key)
	h.fields["tokens"] = luaNum(tokens)
	h.fields["ts"] = luaNum(callerMillis)
	m.pexpire(key, bucketTTL(capacity, rate))
	return allowed, tokens
}

// takeReply is lua.Take's answer.
type takeReply struct {
	Granted int
	Tokens  float64
	WaitMS  int64
	NowMS   int64
	Flag    int
}

// prune is the scripts' bound on the hash: on a server's first record, when the hash holds
// more than 256 fields, records older than 120 s (or unparsable) are dropped.
func (h *mhash) prune(now float64) {
	if h == nil || len(h.fields) <= 256 {
		return
	}
	for f, v := range h.fields {
		if f == "tokens" || f == "ts" {
			continue
		}
		parts := strings.Fields(v)
		when, ok := 0.0, false
		if len(parts) > 0 {
			when, ok = tonumber(parts[len(parts)-1], true)
		}
		if !ok || now-when > 120000 {
			delete(h.fields, f)
		}
	}
}

// Take runs lua.Take.
func (m *model) Take(now time.Time, key string, capacity, rate float64, want, minimum int, server string, seq uint64) takeReply {
	m.tick(now)
	ms := luaMillis(now)
	h := m.get(key)
	field := "t:" + server
	tokens, ts := h.refill(capacity, rate, ms)
	fseq := float64(seq)
	if rec, ok := fieldOf(h, field); ok {
		p := strings.Fields(rec)
		if len(p) == 5 {
			rseq, _ := tonumber(p[0], true)
			if rseq == fseq {
				g, _ := tonumber(p[1], true)
				t, _ := tonumber(p[2], true)
				w, _ := tonumber(p[3], true)
				n, _ := tonumber(p[4], true)
				return takeReply{Granted: int(g), Tokens: t, WaitMS: int64(w), NowMS: int64(n), Flag: 1}
			}
			if rseq > fseq {
				return takeReply{Tokens: tokens, WaitMS: int64(waitFor(tokens, minimum, rate)), NowMS: int64(ms), Flag: 2}
			}
		}
	} else {
		h.prune(ms)
	}
	granted := 0.0
	if tokens >= float64(want) {
		granted = float64(want)
	} else if math.Floor(tokens) >= float64(minimum) {
		granted = math.Floor(tokens)
	}
	tokens -= granted
	wait := 0.0
	if granted == 0 {
		wait = waitFor(tokens, minimum, rate)
	}
	left := luaNum(tokens)
	h = m.getOrCreate(key)
	h.fields["tokens"] = left
	h.fields["ts"] = luaNum(math.Max(ts, ms))
	h.fields[field] = strconv.FormatUint(seq, 10) + " " + luaNum(granted) + " " + left + " " + luaNum(wait) + " " + luaNum(ms)
	m.pexpire(key, bucketTTL(capacity, rate))
	return takeReply{Granted: int(granted), Tokens: tokens, WaitMS: int64(wait), NowMS: int64(ms)}
}

// waitFor is take.lua's wait: the ms until minimum tokens are there, 0 if they are.
func waitFor(tokens float64, minimum int, rate float64) float64 {
	if tokens >= float64(minimum) {
		return 0
	}
	return math.Ceil((float64(minimum) - tokens) / rate * 1000)
}

// Refund runs lua.Refund; it returns the tokens after and the replay flag.
func (m *model) Refund(now time.Time, key string, capacity, rate float64, amount int, server string, seq uint64) (float64, int) {
	m.tick(now)
	ms := luaMillis(now)
	h := m.get(key)
	field := "r:" + server
	tokens, ts := h.refill(capacity, rate, ms)
	fseq := float64(seq)
	if rec, ok := fieldOf(h, field); ok {
		p := strings.Fields(rec)
		if len(p) == 3 {
			rseq, _ := tonumber(p[0], true)
			if rseq == fseq {
				t, _ := tonumber(p[1], true)
				return t, 1
			}
			if rseq > fseq {
				return tokens, 2
			}
		}
	} else {
		h.prune(ms)
	}
	tokens = math.Min(capacity, tokens+float64(amount))
	left := luaNum(tokens)
	h = m.getOrCreate(key)
	h.fields["tokens"] = left
	h.fields["ts"] = luaNum(math.Max(ts, ms))
	h.fields[field] = strconv.FormatUint(seq, 10) + " " + left + " " + luaNum(ms)
	m.pexpire(key, bucketTTL(capacity, rate))
	return tokens, 0
}

func fieldOf(h *mhash, f string) (string, bool) {
	if h == nil {
		return "", false
	}
	v, ok := h.fields[f]
	return v, ok
}

// HMGet is the naive strategy's read: tokens and ts of key (ok false when absent).
func (m *model) HMGet(now time.Time, key string) (tokens, ts float64, okTokens, okTS bool) {
	m.tick(now)
	h := m.get(key)
	tokens, okTokens = tonumber(fieldOf(h, "tokens"))
	ts, okTS = tonumber(fieldOf(h, "ts"))
	return
}

// HSetExpire is the naive strategy's write: HSET tokens ts, then PEXPIRE.
func (m *model) HSetExpire(now time.Time, key string, tokens, ts, ttlMS float64) {
	m.tick(now)
	h := m.getOrCreate(key)
	h.fields["tokens"] = luaNum(tokens)
	h.fields["ts"] = luaNum(ts)
	m.pexpire(key, ttlMS)
}

// Fields returns key's hash fields, sorted by name (for tests).
func (m *model) Fields(now time.Time, key string) map[string]string {
	m.tick(now)
	h := m.get(key)
	if h == nil {
		return nil
	}
	out := make(map[string]string, len(h.fields))
	for k, v := range h.fields {
		out[k] = v
	}
	return out
}

// Keys returns the live keys, sorted (for tests).
func (m *model) Keys(now time.Time) []string {
	m.tick(now)
	var ks []string
	for k := range m.keys {
		if m.get(k) != nil {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}
