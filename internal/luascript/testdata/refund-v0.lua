-- fleetlimit lease refund: put unused tokens back, capped at capacity.
--
-- KEYS[1] = bucket key (the same hash as bucket.lua: fields tokens, ts)
-- ARGV[1] = capacity, ARGV[2] = refill per second, ARGV[3] = amount,
-- ARGV[4] = server id, ARGV[5] = seq (a decimal integer, increasing per server id)
--
-- Returns:
--   [1] tokens in the bucket afterwards (tostring)
--   [2] 0 = fresh, 1 = replay of the recorded answer, 2 = stale seq (nothing refunded)
--
-- Idempotent per (server id, seq), like take.lua: the answer is recorded in the field
-- 'r:<server id>' as '<seq> <tokens> <now>'; a replay returns it and refunds nothing.
-- num is tonumber that also reads '1e-06' (see bucket.lua: yuin/gopher-lua#472).
local function num(s)
  return tonumber(s) or (s and tonumber((string.gsub(s, '^(%s*[-+]?%d+)([eE])', '%1.0%2'))))
end

local capacity = num(ARGV[1])
local rate     = num(ARGV[2])
local amount   = num(ARGV[3])
local seq      = num(ARGV[5])
-- Every test is written so that NaN fails it (see take.lua).
if not (capacity and rate and amount and seq) or not (capacity >= 1 and capacity < math.huge)
    or not (rate > 0 and rate < math.huge) or not (amount >= 0 and amount < math.huge)
    or seq ~= seq or not (math.ceil(capacity / rate * 1000) + 1000 < 2^53) then
  return redis.error_reply('ERR fleetlimit refund: invalid arguments')
end
local field = 'r:' .. ARGV[4]

local t   = redis.call('TIME')
local now = num(t[1]) * 1000 + math.floor(num(t[2]) / 1000)

local state  = redis.call('HMGET', KEYS[1], 'tokens', 'ts', field)
local tokens = num(state[1]) or capacity
local ts     = num(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) / 1000 * rate)

local rec = state[3]
if rec then
  local rseq, rtok = string.match(rec, '^(%S+) (%S+) (%S+)$')
  rseq = num(rseq)
  if rseq == seq then
    return { rtok, 1 }
  end
  if rseq and rseq > seq then
    return { tostring(tokens), 2 }
  end
else
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

tokens = math.min(capacity, tokens + amount)
local left = tostring(tokens)
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', math.max(ts, now),
  field, ARGV[5] .. ' ' .. left .. ' ' .. now)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000) + 1000)
return { left, 0 }
