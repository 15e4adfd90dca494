-- fleetlimit lease take: atomically take up to `want` tokens, at least `min`.
--
-- KEYS[1] = bucket key (the same hash as bucket.lua: fields tokens, ts; and p, below)
-- ARGV[1] = capacity, ARGV[2] = refill per second, ARGV[3] = want, ARGV[4] = min,
-- ARGV[5] = server id, ARGV[6] = seq (a decimal integer, increasing per server id),
-- ARGV[7] = version of capacity and rate (an integer, 0 <= version < 2^53)
-- ARGV[8] = floor (optional, default 0; an integer, 0 <= floor <= capacity): how far
--           below zero the take may leave the bucket, a claim on its future refill
--           (a reservation)
-- ARGV[9], ARGV[10] = seen (optional, both or neither): the bucket's level this server
--           was last answered (a number) and Redis's TIME then, in ms (the [4] of that
--           take's reply; an integer >= 0)
--
-- A bucket that does not exist starts full, unless its caller saw it within the time
-- every write keeps a bucket alive (the TTL is at least capacity/rate + 1 s; less 500 ms,
-- for a failover to a replica whose clock differs): then Redis lost it (evicted,
-- flushed, deleted) while in use, and it starts empty (or at the level
-- seen, if that was below zero), refilling from now. A lost bucket that came back full
-- would hand the fleet up to a burst more per loss, and one started at the level seen
-- what the other servers took since; started empty it hands them nothing, and costs the
-- key at most the tokens the bucket held when it was lost (a busy bucket holds few).
--
-- The parameters in force are the highest version's: the field p holds
-- '<version> <capacity> <rate> <now>'. A caller with a lower version is answered on the
-- bucket's parameters; one with a higher version, or the same version and other
-- parameters, re-shapes the bucket: it refills on the old parameters up to now, then
-- holds at most the new capacity. A bucket without p (new, or written by a release
-- before versions) takes the caller's. p ends with the time it was written. A call
-- writes p and c only when their value changes or they were written 30 s or more
-- before: two fields fewer to write, and to replicate, for a bucket in steady use, and
-- never older than 30 s when a call comes, so that the record pruning of the release
-- before versions (which drops any field whose last number is a time 120 s old) keeps
-- them while the fleet uses the bucket.
--
-- Grants g = want if tokens + floor >= want, else floor(tokens + floor) if that is >= min,
-- else 0. With floor 0 (every lease take) the bucket never goes below zero.
-- Returns:
--   [1] granted (integer)
--   [2] tokens left after the take (tostring)
--   [3] wait ms (integer): when granted, how long until the bucket is back at zero (0
--       unless the take left it below); else how long until it can grant `min`
--   [4] Redis TIME of the decision, ms (integer)
--   [5] 0 = fresh, 1 = replay of the recorded answer, 2 = stale seq (nothing spent),
--       3 = fresh, and the bucket held no record of this server (new, expired or lost)
--   [6] the version of the parameters in force (integer)
--   [7] the credit after the call (%.17g, exact): the refill the bucket lost to its cap
--
-- Every take and refund counts, in the field c ('<credit> <now>'), the refill the bucket
-- lost to its cap (it sat full): a cumulative credit. A bucket with no history (new,
-- expired, or written by a release before it) starts at now·rate, more than any earlier
-- life of the bucket could have counted, since it lost at most its rate. refund.lua
-- forgives a debt what the credit grew since the debtor last saw it (see there). Take
-- returns it.
--
-- Idempotent per (server id, seq): the answer is recorded in the field 't:<server id>'
-- as '<seq> <granted> <tokens> <wait> <now>', a claim's (floor above 0) in 'k:<server
-- id>', so that a claim's seq never makes a refill sent again under its own seq (whose
-- answer was lost) older than the record. A replayed call (same seq, e.g. a client
-- retry of a timed-out EVALSHA) returns that answer and spends nothing; an older seq
-- spends nothing and grants 0. The records live in the bucket hash and expire with it;
-- once the hash holds more than 256 fields, a new record first drops records older than
-- 120 s, so a hot bucket that never expires stays bounded.
-- num is tonumber that also reads '1e-06' (see bucket.lua: yuin/gopher-lua#472).
local function num(s)
  return tonumber(s) or (s and tonumber((string.gsub(s, '^(%s*[-+]?%d+)([eE])', '%1.0%2'))))
end

local capacity = num(ARGV[1])
local rate     = num(ARGV[2])
local want     = num(ARGV[3])
local min      = num(ARGV[4])
local seq      = num(ARGV[6])
local version  = num(ARGV[7])
local floor    = 0
if ARGV[8] and ARGV[8] ~= '0' then floor = num(ARGV[8]) end
local seen     = num(ARGV[9] or '')
local seen_at  = num(ARGV[10] or '')
-- Every test is written so that NaN fails it (Lua's tonumber reads 'nan' and 'inf'); want
-- and min are whole numbers; the TTL must stay an exact integer (< 2^53 ms) that PEXPIRE
-- accepts, as global.Limit.Validate requires.
if not (capacity and rate and want and min and seq and version and floor) or not (capacity >= 1 and capacity < math.huge)
    or not (rate > 0 and rate < math.huge) or not (want >= 1 and want < math.huge)
    or not (min >= 0 and min <= want) or want ~= math.floor(want) or min ~= math.floor(min)
    or seq ~= seq or not (version >= 0 and version < 2^53) or version ~= math.floor(version)
    or not (floor >= 0 and floor <= capacity) or floor ~= math.floor(floor)
    or not (math.ceil(2 * capacity / rate * 1000) + 1000 < 2^53)
    or (ARGV[9] and not (seen and seen_at and seen > -math.huge and seen < math.huge
      and seen_at >= 0 and seen_at < 2^53 and seen_at == math.floor(seen_at))) then
  return redis.error_reply('ERR fleetlimit take: invalid arguments')
end
local field = 't:' .. ARGV[5]
if floor > 0 then field = 'k:' .. ARGV[5] end

local t   = redis.call('TIME')
local now = num(t[1]) * 1000 + math.floor(num(t[2]) / 1000)

local state  = redis.call('HMGET', KEYS[1], 'tokens', 'ts', field, 'p', 'c')
-- refill on the parameters the bucket held until now, then take the ones in force
local held_cap, held_rate = capacity, rate
local pv, pc, pr, p_at = string.match(state[4] or '', '^(%S+) (%S+) (%S+) (%S+)$')
pv, pc, pr, p_at = num(pv), num(pc), num(pr), num(p_at)
if pv and pc and pr and pc >= 1 and pr > 0 then
  held_cap, held_rate = pc, pr
  if pv > version then capacity, rate, version = pc, pr, pv end
end
-- p stands when it holds the parameters in force
local p_stands = pv == version and pc == capacity and pr == rate
-- fresh reports whether a field written at ms (its last number) need not be written again
local function fresh(ms) return ms and now - ms < 30000 end
local stored = num(state[1])
local ts     = num(state[2]) or now
if not stored and seen and now - seen_at < capacity / rate * 1000 + 500 then
  stored, ts = math.min(seen, 0), now
end
local cap    = math.min(capacity, held_cap)
local raw    = (stored or held_cap) + math.max(0, now - ts) / 1000 * held_rate
local tokens = math.min(cap, raw)
-- the refill lost to the cap, counted in c
local held_credit, c_at = string.match(state[5] or '', '^(%S+) (%S+)$')
held_credit = num(held_credit)
local credit = held_credit
if not stored or not credit then credit = now / 1000 * rate end
if raw > cap then credit = credit + (raw - cap) end

-- ms until `min` tokens can be granted, 0 if they can
local function wait_for(tokens)
  if tokens + floor >= min then return 0 end
  return math.ceil((min - floor - tokens) / rate * 1000)
end

local rec = state[3]
if rec then
  -- the record's seq first: the whole record is read only for a replay or a stale call
  local rseq = num(string.match(rec, '^(%S+) '))
  if rseq and rseq >= seq then
    local rg, rtok, rwait, rnow
    rseq, rg, rtok, rwait, rnow = string.match(rec, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
    rseq = num(rseq)
    if rseq == seq then
      return { num(rg), rtok, num(rwait), num(rnow), 1, version, string.format('%.17g', credit) }
    end
    if rseq and rseq > seq then
      return { 0, tostring(tokens), wait_for(tokens), now, 2, version, string.format('%.17g', credit) }
    end
  end
else
  -- first record of this server in this bucket: keep the hash bounded (a hash without
  -- tokens is none of ours, or none at all: an expired bucket)
  if state[1] and redis.call('HLEN', KEYS[1]) > 256 then
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
      local f = all[i]
      if f ~= 'tokens' and f ~= 'ts' and f ~= 'p' and f ~= 'c' then
        local when = num(string.match(all[i + 1], '(%S+)$'))
        if not when or now - when > 120000 then
          redis.call('HDEL', KEYS[1], f)
        end
      end
    end
  end
end

local granted = 0
if tokens + floor >= want then
  granted = want
elseif math.floor(tokens + floor) >= min then
  granted = math.floor(tokens + floor)
end
tokens = tokens - granted
local wait = 0
if granted == 0 then
  wait = wait_for(tokens)
elseif tokens < 0 then
  wait = math.ceil(-tokens / rate * 1000)
end

local left = tostring(tokens)
local credit_s = string.format('%.17g', credit)
-- now as text once, for the three fields that hold it (a whole number of ms below 1e14:
-- the same digits as %d and %.17g)
local now_s = tostring(now)
local ts_new = now_s
if ts > now then ts_new = ts end
-- the record (a wait of 0 as a literal: every number written as text is a conversion)
local set = { 'tokens', tokens, 'ts', ts_new,
  field, ARGV[6] .. ' ' .. string.format('%d', granted) .. ' ' .. left .. ' ' .. (wait == 0 and '0' or wait) .. ' ' .. now_s }
if not (p_stands and fresh(p_at)) then
  set[7], set[8] = 'p', string.format('%d %.17g %.17g %d', version, capacity, rate, now)
end
if credit ~= held_credit or not fresh(num(c_at)) then
  set[#set + 1], set[#set + 2] = 'c', credit_s .. ' ' .. now_s
end
redis.call('HSET', KEYS[1], unpack(set))
-- the TTL: until the bucket is full again (a bucket below zero needs longer), plus 1 s, as
-- digits (Redis 7.2.0-7.2.4 would pass 100000000 as "1e+08", which PEXPIRE refuses)
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(math.max(capacity, capacity - tokens) / rate * 1000) + 1000))
local flag = 0
if not rec then flag = 3 end
return { granted, left, wait, now, flag, version, credit_s }
