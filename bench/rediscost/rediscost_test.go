package rediscost

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

var redisCost = flag.Bool("rediscost", false, "measure the Redis cost of the scripts and commands on a redis-server of the test's own (TestRedisCost)")

// multiTakeSource is a multi-key take, measured for the cold-key designs compared in
// docs/cold-keys.md (one multi-key script per round trip, rejected): for each KEYS[i], the bucket update of take.lua (HMGET tokens, ts and the server's
// record; refill; take or charge; HSET of the three fields; PEXPIRE). ARGV: capacity,
// rate, server id, then one amount per key. It answers one (granted, tokens) pair per key.
const multiTakeSource = `
local capacity, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local field = 't:' .. ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = math.ceil(capacity / rate * 1000) + 1000
local out = {}
for i = 1, #KEYS do
  local want = tonumber(ARGV[3 + i])
  local s = redis.call('HMGET', KEYS[i], 'tokens', 'ts', field)
  local tokens = tonumber(s[1]) or capacity
  local ts = tonumber(s[2]) or now
  tokens = math.min(capacity, tokens + math.max(0, now - ts) / 1000 * rate)
  local g = 0
  if tokens >= want then g = want; tokens = tokens - want end
  redis.call('HSET', KEYS[i], 'tokens', tokens, 'ts', math.max(ts, now), field, g .. ' ' .. now)
  redis.call('PEXPIRE', KEYS[i], ttl)
  out[2 * i - 1] = g
  out[2 * i] = tostring(tokens)
end
return out
`

// leanChargeSource is the leanest per-key update an asynchronous charge needs: the bucket
// as one string "tokens ts" (GET, refill, charge, SET PX). ARGV: capacity, rate, then one
// amount per key; it answers the tokens left per key.
const leanChargeSource = `
local capacity, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = math.ceil(capacity / rate * 1000) + 1000
local out = {}
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  local tokens, ts = capacity, now
  if v then
    local a, b = string.match(v, '^(%S+) (%S+)$')
    tokens, ts = tonumber(a), tonumber(b)
  end
  tokens = math.min(capacity, tokens + math.max(0, now - ts) / 1000 * rate) - tonumber(ARGV[2 + i])
  redis.call('SET', KEYS[i], tokens .. ' ' .. math.max(ts, now), 'PX', ttl)
  out[i] = tostring(tokens)
end
return out
`

// redisRateSource is the script of github.com/go-redis/redis_rate/v10 v10.0.1 (lua.go,
// allowN; BSD-2-Clause, after rwz/redis-gcra), measured beside a take as a yardstick.
// ARGV: burst, rate, period in seconds, cost.
const redisRateSource = `
redis.replicate_commands()
local rate_limit_key = KEYS[1]
local burst = ARGV[1]
local rate = ARGV[2]
local period = ARGV[3]
local cost = tonumber(ARGV[4])
local emission_interval = period / rate
local increment = emission_interval * cost
local burst_offset = emission_interval * burst
local jan_1_2017 = 1483228800
local now = redis.call("TIME")
now = (now[1] - jan_1_2017) + (now[2] / 1000000)
local tat = redis.call("GET", rate_limit_key)
if not tat then
  tat = now
else
  tat = tonumber(tat)
end
tat = math.max(tat, now)
local new_tat = tat + increment
local allow_at = new_tat - burst_offset
local diff = now - allow_at
local remaining = diff / emission_interval
if remaining < 0 then
  local reset_after = tat - now
  local retry_after = diff * -1
  return {0, 0, tostring(retry_after), tostring(reset_after)}
end
local reset_after = new_tat - now
if reset_after > 0 then
  redis.call("SET", rate_limit_key, new_tat, "EX", math.ceil(reset_after))
end
local retry_after = -1
return {cost, remaining, tostring(retry_after), tostring(reset_after)}
`

var usecPerCall = regexp.MustCompile(`cmdstat_(\w+):calls=(\d+),usec=(\d+),usec_per_call=([0-9.]+)`)

// arraySource is the leanest token bucket a script can keep for many keys at once: one
// GCRA cell per key (its theoretical arrival time, in ms) in a BITFIELD array of i64, one
// GET and one SET of all the call's cells, the items packed in one argument (cell index
// u32, cost u16, age in ms u16, grant u8: a grant is kept only within the burst, a charge
// always). ARGV: ms per token, burst, the items. It answers the tokens left per item, -1
// for a refused grant.
const arraySource = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local T, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local blob = ARGV[3]
local n = #blob / 9
local get, idx, cnt, age, gr = {}, {}, {}, {}, {}
local pos = 1
for i = 1, n do
  local c, k, a, g
  c, k, a, g, pos = struct.unpack('<I4I2I2B', blob, pos)
  idx[i], cnt[i], age[i], gr[i] = c * 64, k, a, g
  get[3 * i - 2] = 'GET'; get[3 * i - 1] = 'i64'; get[3 * i] = c * 64
end
local cells = redis.call('BITFIELD', KEYS[1], unpack(get))
local val, set, out = {}, {}, {}
local burstT = burst * T
for i = 1, n do
  local o = idx[i]
  local cell = val[o] or cells[i]
  local at = now - age[i]
  local tat = (cell > at and cell or at) + cnt[i] * T
  if gr[i] == 0 or tat - now <= burstT then
    val[o] = tat
    local s = #set
    set[s + 1] = 'SET'; set[s + 2] = 'i64'; set[s + 3] = o; set[s + 4] = tat
    out[i] = math.floor((burstT - (tat - now)) / T)
  else
    out[i] = -1
  end
end
if #set > 0 then redis.call('BITFIELD', KEYS[1], unpack(set)) end
return out
`

// TestRedisCost measures, on a real redis-server, what Redis spends on the commands of
// fleetlimit and of the cold-key designs compared in docs/cold-keys.md, from INFO
// commandstats (Redis's own time executing each command, network excluded): the lease
// take script (luascript.Take, one key per call, and the bytes a take appends to the
// AOF, which is what each replica is sent), a multi-key take and the leanest charge with
// N keys per call, a token bucket array script, and the plain commands of a windowed
// limit's exchange (BITFIELD, PEXPIREAT, ZADD, ZRANGEBYSCORE), whose figures the
// simulator's cost model (sim's cmdCost) is scaled from. It runs only on a redis-server
// it starts itself on a spare loopback port, and refuses to write to one it did not
// start or that holds keys (ownedAndEmpty): its statistics resets and its 100,000 keys
// touch nothing else.
//
//	go -C bench test ./rediscost -run TestRedisCost -v -args -rediscost
func TestRedisCost(t *testing.T) {
	ctx, c := ownServer(t)
	const keys = 100000
	key := func(i int) string { return "fl:{sim}:k" + strconv.Itoa(i%keys) }
	measureCmd := func(name, cmd string, calls int, run func(i int, p redis.Pipeliner)) float64 {
		c.ConfigResetStat(ctx)
		for i := 0; i < calls; i += 64 { // 64 calls per pipelined round trip
			p := c.Pipeline()
			for j := i; j < min(i+64, calls); j++ {
				run(j, p)
			}
			if _, err := p.Exec(ctx); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		n, us := commandStat(ctx, t, c, cmd)
		return us / n
	}
	measure := func(name string, calls int, run func(i int, p redis.Pipeliner)) float64 {
		return measureCmd(name, "evalsha", calls, run)
	}
	take := luascript.Take
	_ = take.Load(ctx, c)
	perTake := measure("take", 50000, func(i int, p redis.Pipeliner) {
		take.EvalSha(ctx, p, []string{key(i * 7919)}, 50, 50, 1, 1, "srv"+strconv.Itoa(i%200), i+1, 1)
	})
	t.Logf("luascript.Take, one key per call: %.2f µs per call", perTake)
	// redis_rate's GCRA script, one key per call, as a yardstick: it keeps one number per
	// key (GET, SET EX), where a take reads five fields of a hash and writes four, with a
	// TTL, for what a fleet of leases needs besides (a record per server that answers a
	// retried call once, parameters versioned across a deploy, the credit debts are
	// forgiven from). Both on new keys, as above, and on keys each called again (1,000
	// keys in turn), as per-client keys mostly are.
	gcra := redis.NewScript(redisRateSource)
	_ = gcra.Load(ctx, c)
	perGCRA := measure("redis_rate", 50000, func(i int, p redis.Pipeliner) {
		gcra.EvalSha(ctx, p, []string{"rate:" + key(i*7919)}, 50, 50, 1, 1)
	})
	again := func(i int) string { return "fl:{again}:k" + strconv.Itoa(i%1000) }
	takeAgain := measure("take again", 50000, func(i int, p redis.Pipeliner) {
		take.EvalSha(ctx, p, []string{again(i)}, 1e6, 1e6, 1, 1, "srv", i+1, 1)
	})
	gcraAgain := measure("redis_rate again", 50000, func(i int, p redis.Pipeliner) {
		gcra.EvalSha(ctx, p, []string{"rate:" + again(i)}, 1e6, 1e6, 1, 1)
	})
	t.Logf("redis_rate's script (GCRA), one key per call: %.2f µs per call, %.2f× a take's", perGCRA, perGCRA/perTake)
	t.Logf("on keys called again: luascript.Take %.2f µs, redis_rate's %.2f µs per call (%.2f× a take's)", takeAgain, gcraAgain, gcraAgain/takeAgain)
	aofPerTake(ctx, t, c)
	multi := redis.NewScript(multiTakeSource)
	_ = multi.Load(ctx, c)
	var xs, ys []float64
	for _, n := range []int{1, 4, 16, 64, 256} {
		calls := max(200000/n, 2000)
		per := measure(fmt.Sprintf("multi %d", n), calls, func(i int, p redis.Pipeliner) {
			ks := make([]string, n)
			args := []any{50, 50, "srv" + strconv.Itoa(i%200)}
			for j := range ks {
				ks[j] = key((i*n + j) * 7919)
				args = append(args, 1)
			}
			multi.EvalSha(ctx, p, ks, args...)
		})
		xs, ys = append(xs, float64(n)), append(ys, per)
		t.Logf("multi-key take, %3d keys per call: %7.2f µs per call, %5.2f µs per key", n, per, per/float64(n))
	}
	a, b := fit(xs, ys)
	t.Logf("fit: %.2f µs per call + %.2f µs per key", a, b)
	lean := redis.NewScript(leanChargeSource)
	_ = lean.Load(ctx, c)
	for _, n := range []int{1, 16, 256} {
		calls := max(200000/n, 2000)
		per := measure(fmt.Sprintf("lean %d", n), calls, func(i int, p redis.Pipeliner) {
			ks := make([]string, n)
			args := []any{50, 50}
			for j := range ks {
				ks[j] = "lean:" + key((i*n+j)*7919)
				args = append(args, 1)
			}
			lean.EvalSha(ctx, p, ks, args...)
		})
		t.Logf("lean multi-key charge, %3d keys per call: %7.2f µs per call, %5.2f µs per key", n, per, per/float64(n))
	}
	array := redis.NewScript(arraySource)
	_ = array.Load(ctx, c)
	xs, ys = nil, nil
	for _, n := range []int{1, 16, 64, 256} {
		calls := max(100000/n, 2000)
		per := measure(fmt.Sprintf("array %d", n), calls, func(i int, p redis.Pipeliner) {
			b := make([]byte, 0, 9*n)
			for j := range n {
				cell := uint32(((i*n + j) * 7919) % (1 << 18))
				b = binary.LittleEndian.AppendUint32(b, cell)
				b = binary.LittleEndian.AppendUint16(b, 1)
				b = binary.LittleEndian.AppendUint16(b, uint16(j%100))
				b = append(b, byte(j%4/3)) // a quarter are grants
			}
			array.EvalSha(ctx, p, []string{"fl:{sim}:array"}, 20, 50, string(b))
		})
		xs, ys = append(xs, float64(n)), append(ys, per)
		t.Logf("bucket array script, %3d keys per call: %7.2f µs per call, %5.2f µs per key", n, per, per/float64(n))
	}
	a, b = fit(xs, ys)
	t.Logf("bucket array fit: %.2f µs per call + %.2f µs per key", a, b)

	// the commands of a windowed limit's exchange: no script
	xs, ys = nil, nil
	for _, n := range []int{1, 16, 64, 256} {
		calls := max(200000/n, 2000)
		per := measureCmd(fmt.Sprintf("bitfield %d", n), "bitfield", calls, func(i int, p redis.Pipeliner) {
			args := []any{"BITFIELD", "fl:{sim}:win", "OVERFLOW", "SAT"}
			for j := range n {
				args = append(args, "INCRBY", "u16", "#"+strconv.Itoa(((i*n+j)*7919)%(1<<18)), 1)
			}
			p.Do(ctx, args...)
		})
		xs, ys = append(xs, float64(n)), append(ys, per)
		t.Logf("BITFIELD INCRBY u16, %3d sub-commands per call: %6.2f µs per call", n, per)
	}
	a, b = fit(xs, ys)
	t.Logf("BITFIELD fit: %.3f µs per call + %.3f µs per sub-command", a, b)
	// a windowed exchange sets its array's deadline after each BITFIELD
	per := measureCmd("pexpireat", "pexpireat", 100000, func(i int, p redis.Pipeliner) {
		p.Do(ctx, "BITFIELD", "fl:{sim}:win", "OVERFLOW", "SAT", "INCRBY", "u16", "#"+strconv.Itoa((i*7919)%(1<<18)), 1,
			"INCRBY", "u16", "#"+strconv.Itoa((i*7919+1)%(1<<18)), 1)
		p.Do(ctx, "PEXPIREAT", "fl:{sim}:win", 4102444800000)
	})
	t.Logf("PEXPIREAT after a BITFIELD of two sub-commands: %.3f µs per call", per)
	xs, ys = nil, nil
	for _, n := range []int{1, 16, 64} {
		per := measureCmd(fmt.Sprintf("zadd %d", n), "zadd", 20000, func(i int, p redis.Pipeliner) {
			zs := make([]redis.Z, n)
			for j := range zs {
				zs[j] = redis.Z{Score: float64(i), Member: "k" + strconv.Itoa((i*n+j)%1000)}
			}
			p.ZAdd(ctx, "fl:{sim}:marks", zs...)
		})
		xs, ys = append(xs, float64(n)), append(ys, per)
	}
	a, b = fit(xs, ys)
	t.Logf("ZADD fit: %.3f µs per call + %.3f µs per member", a, b)
	xs, ys = nil, nil
	for _, n := range []int{0, 64, 256} {
		c.Del(ctx, "fl:{sim}:read")
		for j := range n {
			c.ZAdd(ctx, "fl:{sim}:read", redis.Z{Score: float64(j), Member: "k" + strconv.Itoa(j)})
		}
		per := measureCmd(fmt.Sprintf("zrange %d", n), "zrangebyscore", 20000, func(i int, p redis.Pipeliner) {
			p.ZRangeByScoreWithScores(ctx, "fl:{sim}:read", &redis.ZRangeBy{Min: "0", Max: "+inf"})
		})
		xs, ys = append(xs, float64(n)), append(ys, per)
	}
	a, b = fit(xs, ys)
	t.Logf("ZRANGEBYSCORE WITHSCORES fit: %.3f µs per call + %.3f µs per member answered", a, b)
}

// ownServer starts the redis-server a measurement runs on, and checks that it is its
// own and empty (ownedAndEmpty); it skips the test without -rediscost.
func ownServer(t *testing.T) (context.Context, *redis.Client) {
	if !*redisCost {
		t.Skip("a measurement: run it with -rediscost")
	}
	ctx := context.Background()
	srv := redistest.StartServer(t)
	c := srv.Client()
	if err := ownedAndEmpty(ctx, t, c); err != nil {
		t.Fatalf("redis-server at %s: %v: refusing to measure on it", srv.Addr, err)
	}
	return ctx, c
}

// commandStat returns INFO commandstats' calls and microseconds of cmd since the last
// CONFIG RESETSTAT.
func commandStat(ctx context.Context, t *testing.T, c *redis.Client, cmd string) (calls, usec float64) {
	s, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range usecPerCall.FindAllStringSubmatch(s, -1) {
		if m[1] == cmd {
			calls, _ = strconv.ParseFloat(m[2], 64)
			usec, _ = strconv.ParseFloat(m[3], 64)
		}
	}
	return calls, usec
}

// aofPerTake logs the bytes a take appends to the AOF, which is also what Redis sends
// each replica (the script's writes, replicated as effects): warm takes on 10,000 keys
// by 8 servers, on a full bucket (a key far within its limit: each take's refill past
// the cap grows its credit) and on one below full (a busy key).
func aofPerTake(ctx context.Context, t *testing.T, c *redis.Client) {
	aofSize := func() int64 {
		deadline := time.Now().Add(time.Minute)
		for {
			s, err := c.Info(ctx, "persistence").Result()
			if err != nil {
				t.Fatal(err)
			}
			f := infoMap(s)
			if f["aof_enabled"] == "1" && f["aof_rewrite_in_progress"] == "0" && f["aof_rewrite_scheduled"] == "0" {
				n, _ := strconv.ParseInt(f["aof_current_size"], 10, 64)
				return n
			}
			if time.Now().After(deadline) {
				t.Fatalf("the AOF rewrite did not end within a minute: %v", f)
			}
			time.Sleep(50 * time.Millisecond) // the rewrite that turning the AOF on starts: INFO is all there is to wait on
		}
	}
	if err := c.ConfigSet(ctx, "appendonly", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	defer c.ConfigSet(ctx, "appendonly", "no")
	take := luascript.Take
	for _, b := range []struct {
		name           string
		capacity, rate float64
	}{{"full bucket", 1e6, 1e6}, {"bucket below full", 1000, 0.01}} {
		const keys, servers = 10000, 8
		run := func(from int) {
			for i := 0; i < keys*servers; i += 64 {
				p := c.Pipeline()
				for j := i; j < i+64; j++ {
					take.EvalSha(ctx, p, []string{"fl:{aof}:" + b.name + strconv.Itoa(j%keys)}, b.capacity, b.rate, 2, 1,
						"srv"+strconv.Itoa(j/keys), from+j, 0)
				}
				if _, err := p.Exec(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		run(1) // every server's record made
		before := aofSize()
		run(1 + keys*servers)
		t.Logf("luascript.Take, %s: %.0f bytes appended to the AOF (and sent each replica) per take", b.name,
			float64(aofSize()-before)/(keys*servers))
	}
}

// infoMap is an INFO section's fields.
func infoMap(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}

// fit returns the least-squares line y = a + b·x.
func fit(xs, ys []float64) (a, b float64) {
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	k := float64(len(xs))
	b = (k*sxy - sx*sy) / (k*sxx - sx*sx)
	return (sy - b*sx) / k, b
}

// ownedAndEmpty reports why c's server is not one to write to: one this test did not start
// (its working directory, which redistest.StartServer makes in the test's temporary
// directory, is elsewhere), or one that holds keys.
func ownedAndEmpty(ctx context.Context, t *testing.T, c *redis.Client) error {
	dir, err := c.ConfigGet(ctx, "dir").Result()
	if err != nil {
		return fmt.Errorf("CONFIG GET dir: %w", err)
	}
	mine, err := filepath.EvalSymlinks(filepath.Dir(t.TempDir())) // the parent of every TempDir of t
	if err != nil {
		return err
	}
	theirs, err := filepath.EvalSymlinks(dir["dir"])
	if err != nil || !strings.HasPrefix(theirs, mine+string(os.PathSeparator)) {
		return fmt.Errorf("its directory %q is not in this test's %q: not the server this test started", dir["dir"], mine)
	}
	ks, err := c.Info(ctx, "keyspace").Result()
	if err != nil {
		return fmt.Errorf("INFO keyspace: %w", err)
	}
	for line := range strings.Lines(ks) {
		if strings.HasPrefix(line, "db") {
			return fmt.Errorf("it holds keys (%s)", strings.TrimSpace(line))
		}
	}
	return nil
}

// TestOwnedAndEmpty: the measurement writes only to the empty redis-server its own test
// started; another test's server, or its own once it holds a key, is refused.
func TestOwnedAndEmpty(t *testing.T) {
	ctx := context.Background()
	c := redistest.StartServer(t).Client()
	if err := ownedAndEmpty(ctx, t, c); err != nil {
		t.Fatalf("its own empty server refused: %v", err)
	}
	t.Run("another test's", func(t2 *testing.T) {
		other := redistest.StartServer(t2).Client()
		if err := ownedAndEmpty(ctx, t, other); err == nil {
			t2.Error("a server another test started was not refused")
		} else {
			t2.Log(err)
		}
	})
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := ownedAndEmpty(ctx, t, c); err == nil {
		t.Error("a server holding a key was not refused")
	} else {
		t.Log(err)
	}
}
