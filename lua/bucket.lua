-- KEYS[1] = bucket key; ARGV = capacity, refill per second, cost
-- fleetlimit: num is tonumber that also reads '1e-06'. miniredis runs gopher-lua, whose
-- tonumber returns nil for an exponent without a decimal point (yuin/gopher-lua#472);
-- the bucket would then read as full. Real Redis is unaffected.
local function num(s)
  return tonumber(s) or (s and tonumber((string.gsub(s, '^(%s*[-+]?%d+)([eE])', '%1.0%2'))))
end

local capacity = num(ARGV[1])
local rate     = num(ARGV[2])
local cost     = num(ARGV[3])

local t   = redis.call('TIME')                       -- Redis's clock, not the caller's
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local state  = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = num(state[1]) or capacity
local ts     = num(state[2]) or now

tokens = math.min(capacity, tokens + math.max(0, now - ts) / 1000 * rate)
local allowed = 0
if tokens >= cost then
  tokens  = tokens - cost
  allowed = 1
end

-- fleetlimit's one change to the article's behaviour: the stored timestamp never moves
-- backwards (ts = max(ts, now)), so a Redis clock that steps back cannot refill the
-- same period twice once it catches up again.
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', math.max(ts, now))
-- The TTL: until the bucket is full again (one a lease's take or a debt left below zero
-- needs longer), plus 1 s; written as digits, since Redis 7.2.0-7.2.4 pass a Lua number
-- such as 100000000 as "1e+08", which PEXPIRE refuses.
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(math.max(capacity, capacity - tokens) / rate * 1000) + 1000))
return { allowed, tostring(tokens) }
