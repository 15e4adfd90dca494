-- fleetlimit fleet membership: record that a server is alive, return the live count.
--
-- KEYS[1] = fleet key (a sorted set: member = server id, score = expiry in Redis ms)
-- ARGV[1] = server id, ARGV[2] = ttl ms (how long this heartbeat counts)
--
-- Uses Redis TIME only. Drops members whose expiry has passed, and keeps the key's own
-- TTL at least ttl, so a fleet that stops beating leaves nothing behind.
-- Returns the number of live servers (integer), this one included.
-- num is tonumber that also reads '1e-06' (see bucket.lua: yuin/gopher-lua#472).
local function num(s)
  return tonumber(s) or (s and tonumber((string.gsub(s, '^(%s*[-+]?%d+)([eE])', '%1.0%2'))))
end

local ttl = num(ARGV[2])
if not (ttl and ttl >= 1 and ttl < 2^53) then
  return redis.error_reply('ERR fleetlimit heartbeat: invalid arguments')
end
ttl = math.ceil(ttl)

local t   = redis.call('TIME')
local now = num(t[1]) * 1000 + math.floor(num(t[2]) / 1000)

redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local live = redis.call('ZCARD', KEYS[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], string.format('%d', ttl))
end
return live
