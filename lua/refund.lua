-- fleetlimit lease refund: put unused tokens back, capped at capacity.
--
-- KEYS[1] = bucket key (the same hash as take.lua: fields tokens, ts, p)
-- ARGV[1] = capacity, ARGV[2] = refill per second, ARGV[3] = amount,
-- ARGV[4] = server id, ARGV[5] = seq (a decimal integer, increasing per server id),
-- ARGV[6] = version of capacity and rate
--
-- A refund gives tokens back and never re-shapes a bucket: it runs on the parameters
-- the bucket holds (field p, see take.lua), and on the caller's only for a bucket
-- without them. Tokens leased under other parameters than those in force (another
-- version, or the same version and another capacity or rate: a key that moved tier) add
-- nothing: the bucket was re-shaped since they left it, and giving them back could
-- exceed its new capacity.
--
-- A negative amount is a debt: tokens admitted without the bucket (by a failure policy
-- while Redis did not answer) charged to it afterwards. It is charged against the
-- bucket's refill since its last use before the cap, which a bucket nobody used during
-- an outage kept accruing: the refill a full outage would have lost to the cap pays
-- for what the servers admitted meanwhile, and only admissions beyond it (a partial
-- partition, where the connected servers kept the bucket drained) leave the bucket
-- below zero, never below -capacity. ts stays where it was, so the charge does not
-- forfeit that refill for the next caller.
--
-- Returns:
--   [1] tokens in the bucket afterwards (tostring)
--   [2] 0 = fresh, 1 = replay of the recorded answer, 2 = stale seq (nothing refunded)
--   [3] the version of the parameters in force (integer)
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
local version  = num(ARGV[6])
-- Every test is written so that NaN fails it (see take.lua).
if not (capacity and rate and amount and seq and version) or not (capacity >= 1 and capacity < math.huge)
    or not (rate > 0 and rate < math.huge) or not (amount >= -capacity and amount < math.huge)
    or seq ~= seq or not (version >= 0 and version < 2^53) or version ~= math.floor(version)
    or not (math.ceil(2 * capacity / rate * 1000) + 1000 < 2^53) then
  return redis.error_reply('ERR fleetlimit refund: invalid arguments')
end
local field = 'r:' .. ARGV[4]

local t   = redis.call('TIME')
local now = num(t[1]) * 1000 + math.floor(num(t[2]) / 1000)

local state  = redis.call('HMGET', KEYS[1], 'tokens', 'ts', field, 'p')
local pv, pc, pr = string.match(state[4] or '', '^(%S+) (%S+) (%S+) %S+$')
pv, pc, pr = num(pv), num(pc), num(pr)
if pv and pc and pr and pc >= 1 and pr > 0 then
  if amount > 0 and (pv ~= version or pc ~= capacity or pr ~= rate) then amount = 0 end
  capacity, rate, version = pc, pr, pv
end
local stored = num(state[1]) or capacity
local ts     = num(state[2]) or now
local refill = math.max(0, now - ts) / 1000 * rate
local tokens = math.min(capacity, stored + refill)

local rec = state[3]
if rec then
  local rseq, rtok = string.match(rec, '^(%S+) (%S+) (%S+)$')
  rseq = num(rseq)
  if rseq == seq then
    return { rtok, 1, version }
  end
  if rseq and rseq > seq then
    return { tostring(tokens), 2, version }
  end
else
  if redis.call('HLEN', KEYS[1]) > 256 then
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
      local f = all[i]
      if f ~= 'tokens' and f ~= 'ts' and f ~= 'p' then
        local when = num(string.match(all[i + 1], '(%S+)$'))
        if not when or now - when > 120000 then
          redis.call('HDEL', KEYS[1], f)
        end
      end
    end
  end
end

local new_ts = math.max(ts, now)
if amount < 0 then
  -- a debt: charged before the cap, against the refill since ts, which stays
  stored = math.max(stored + amount, -capacity - refill)
  tokens = math.min(capacity, stored + refill)
  new_ts = ts
else
  tokens = math.min(capacity, tokens + amount)
  stored = tokens
end
local left = tostring(tokens)
redis.call('HSET', KEYS[1], 'tokens', stored, 'ts', new_ts,
  field, ARGV[5] .. ' ' .. left .. ' ' .. now,
  'p', string.format('%d %.17g %.17g %d', version, capacity, rate, now))
-- the TTL: until the bucket is full again (a bucket below zero needs longer), plus 1 s
redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(capacity, capacity - tokens) / rate * 1000) + 1000)
return { left, 0, version }
