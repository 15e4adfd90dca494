-- fleetlimit low keys of a charge-later limit (hybrid.Limit.Async): record the keys
-- this server found low, and return every key some server found low lately.
--
-- KEYS[1] = the limit's low-key set (a sorted set: member = key ID, score = until when,
--           in Redis ms)
-- ARGV[1] = memory ms (how long a mark counts), ARGV[2] = n, ARGV[3] = most (the most
--           key IDs to return, 0 to 10,000), ARGV[4..n+3] = key IDs this server found
--           low, ARGV[n+4..] = key IDs it found no longer low, to unmark
--
-- Uses Redis TIME only. A key's mark only moves later. Drops marks whose time
-- has passed, keeps at most 100,000 (the latest), and keeps the key's own TTL at least
-- memory, so a fleet that stops marking leaves nothing behind.
-- Returns the key IDs marked now, the latest first, at most `most` (none for 0: a
-- caller that splits many marks into several calls reads the set with the last).
-- num is tonumber that also reads '1e-06' (see bucket.lua: yuin/gopher-lua#472).
local function num(s)
  return tonumber(s) or (s and tonumber((string.gsub(s, '^(%s*[-+]?%d+)([eE])', '%1.0%2'))))
end

local memory = num(ARGV[1])
local n = num(ARGV[2])
local most = num(ARGV[3])
if not (memory and memory >= 1 and memory < 2^53) or not (n and n >= 0 and n <= #ARGV - 3)
    or n ~= math.floor(n) or not (most and most >= 0 and most <= 10000) or most ~= math.floor(most) then
  return redis.error_reply('ERR fleetlimit low: invalid arguments')
end
memory = math.ceil(memory)

local t   = redis.call('TIME')
local now = num(t[1]) * 1000 + math.floor(num(t[2]) / 1000)

for i = 4, n + 3 do
  -- ZADD GT would do, from Redis 6.2 on
  local old = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]))
  if not old or old < now + memory then
    redis.call('ZADD', KEYS[1], now + memory, ARGV[i])
  end
end
for i = n + 4, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local card = redis.call('ZCARD', KEYS[1])
if card > 100000 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, card - 100000 - 1)
end
if card > 0 and redis.call('PTTL', KEYS[1]) < memory then
  redis.call('PEXPIRE', KEYS[1], string.format('%d', memory))
end
if most == 0 then
  return {}
end
return redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', '(' .. now, 'LIMIT', 0, most)
