-- fleetlimit lease take: atomically take up to `want` tokens, at least `min`.
--
-- KEYS[1] = bucket key (the same hash as bucket.lua: fields tokens, ts)
-- ARGV[1] = capacity, ARGV[2] = refill per second, ARGV[3] = want, ARGV[4] = min,
-- ARGV[5] = server id, ARGV[6] = seq (a decimal integer, increasing per server id)
--
-- Grants g = want if tokens >= want, else floor(tokens) if that is >= min, else 0.
-- Returns:
--   [1] granted (integer)
--   [2] tokens left after the take (tostring)
--   [3] wait ms (integer): 0 when granted, else how long until `min` tokens are there
--   [4] Redis TIME of the decision, ms (integer)
--   [5] 0 = fresh, 1 = replay of the recorded answer, 2 = stale seq (nothing spent),
--       3 = fresh, and the bucket held no record of this server (new, expired or lost)
--
-- Idempotent per (server id, seq): the answer is recorded in the field 't:<server id>'
-- as '<seq> <granted> <tokens> <wait> <now>'. A replayed call (same seq, e.g. a client
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
-- Every test is written so that NaN fails it (Lua's tonumber reads 'nan' and 'inf'); want
-- and min are whole numbers; the TTL must stay an exact integer (< 2^53 ms) that PEXPIRE
-- accepts, as global.Limit.Validate requires.
if not (capacity and rate and want and min and seq) or not (capacity >= 1 and capacity < math.huge)
    or not (rate > 0 and rate < math.huge) or not (want >= 1 and want < math.huge)
    or not (min >= 0 and min <= want) or want ~= math.floor(want) or min ~= math.floor(min)
    or seq ~= seq or not (math.ceil(capacity / rate * 1000) + 1000 < 2^53) then
  return redis.error_reply('ERR fleetlimit take: invalid arguments')
end
local field = 't:' .. ARGV[5]

local t   = redis.call('TIME')
local now = num(t[1]) * 1000 + math.floor(num(t[2]) / 1000)

local state  = redis.call('HMGET', KEYS[1], 'tokens', 'ts', field)
local tokens = num(state[1]) or capacity
local ts     = num(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) / 1000 * rate)

-- ms until `min` tokens are there, 0 if they are
local function wait_for(tokens)
  if tokens >= min then return 0 end
  return math.ceil((min - tokens) / rate * 1000)
end

local rec = state[3]
if rec then
  local rseq, rg, rtok, rwait, rnow = string.match(rec, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
  rseq = num(rseq)
  if rseq == seq then
    return { num(rg), rtok, num(rwait), num(rnow), 1 }
  end
  if rseq and rseq > seq then
    return { 0, tostring(tokens), wait_for(tokens), now, 2 }
  end
else
  -- first record of this server in this bucket: keep the hash bounded
  if redis.call('HLEN', KEYS[1]) > 256 then
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
      local f = all[i]
      if f ~= 'tokens' and f ~= 'ts' then
        local when = num(string.match(all[i + 1], '(%S+)$'))
        if not when or now - when > 120000 then
          redis.call('HDEL', KEYS[1], f)
        end
      end
    end
  end
end

local granted = 0
if tokens >= want then
  granted = want
elseif math.floor(tokens) >= min then
  granted = math.floor(tokens)
end
tokens = tokens - granted
local wait = 0
if granted == 0 then wait = wait_for(tokens) end

local left = tostring(tokens)
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', math.max(ts, now),
  field, ARGV[6] .. ' ' .. granted .. ' ' .. left .. ' ' .. wait .. ' ' .. now)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000) + 1000)
local flag = 0
if not rec then flag = 3 end
return { granted, left, wait, now, flag }
