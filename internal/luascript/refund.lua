-- fleetlimit lease refund: put unused tokens back, capped at capacity, to one bucket or
-- to several in one call.
--
-- KEYS[i] = a bucket key (the same hash as take.lua: fields tokens, ts, p), i = 1..n
-- ARGV[b+1..b+8], b = 8(i-1): the refund to KEYS[i]:
--   [b+1] = capacity, [b+2] = refill per second, [b+3] = amount,
--   [b+4] = server id, [b+5] = seq (a decimal integer, increasing per server id),
--   [b+6] = version of capacity and rate
--   [b+7] = debt floor (optional, default capacity; an integer >= 0): how far below zero
--           a debt may take the bucket
--   [b+8] = for a debt (optional): the credit the debtor last saw (take.lua's reply)
-- An optional argument is left out at the end of the last key's, or given as '' (every
-- key but the last has all eight).
--
-- The refunds run in order, each as if called alone, on one reading of Redis's TIME;
-- every key's arguments are checked before any is refunded, so a call with an invalid
-- one refunds nothing. A key Redis refuses (one that is not a hash: WRONGTYPE; a
-- write refused: OOM, READONLY) is answered refused, with nothing refunded to it, and
-- the others still run: a call either fails before any refund or answers every key.
-- In a Redis Cluster a call's keys must share a slot.
--
-- A refund to a bucket that does not exist writes nothing: the bucket expired, full, and
-- the tokens would be capped away, or Redis lost it (evicted, flushed) while in use, and
-- starting it full would hand the fleet a burst it may have spent (take.lua re-creates
-- it from what its caller saw). A debt to one starts it full, less the debt.
--
-- A refund gives tokens back and never re-shapes a bucket: it runs on the parameters
-- the bucket holds (field p, see take.lua), and on the caller's only for a bucket
-- without them. Tokens leased under other parameters than those in force (another
-- version, or the same version and another capacity or rate: a key that moved tier) add
-- nothing: the bucket was re-shaped since they left it, and giving them back could
-- exceed its new capacity.
--
-- A negative amount is a debt: tokens admitted without the bucket (by a failure policy
-- while Redis did not answer) charged to it afterwards, leaving it below zero if need
-- be, never below -floor. The refill the bucket lost to its cap meanwhile paid for them
-- already: a bucket nobody used during an outage sat full while the servers admitted
-- their local shares. So a debt is first forgiven what the bucket's credit (field c, see
-- take.lua) grew since the debtor's reference, the credit it last saw (ARGV[8]), and the
-- credit shrinks by what it forgives, so that no refill pays two debts. Without a
-- reference nothing is forgiven.
--
-- Returns, for each key in turn (3n values):
--   [3i-2] tokens in the bucket afterwards (tostring)
--   [3i-1] 0 = fresh, 1 = replay of the recorded answer, 2 = stale seq (nothing refunded),
--          4 = refused by Redis (nothing refunded): [3i-2] is then Redis's error
--   [3i]   the version of the parameters in force (integer; 0 when refused)
--
-- Idempotent per (server id, seq), like take.lua: the answer is recorded in the field
-- 'r:<server id>' as '<seq> <tokens> <now>', a debt's (a negative amount) in
-- 'd:<server id>'; a replay returns it and refunds nothing. Debts have a record of their
-- own: a debt that timed out goes again under its seq, and a refund of the same bucket
-- sent meanwhile under a later seq must not make it stale (nothing charged).
--
-- A refund (not a debt) to a full bucket writes nothing, its record included, when p and
-- c need no writing either (they hold what it would write, written less than 30 s
-- before): it adds nothing, and writing it would change nothing a later call reads. The
-- bucket reads as full then too, its TTL set when it was last written stands (a full
-- bucket that expires is one that reads full), and the credit counts, from ts, the same
-- refill lost to the cap. This is the common refund of per-client keys, whose buckets
-- sit full, and it costs Redis about a third of one that writes. A replay of it is not
-- recognised: it runs again, and gives the tokens back once at most.
-- num is tonumber that also reads '1e-06' (see bucket.lua: yuin/gopher-lua#472).
local function num(s)
  return tonumber(s) or (s and tonumber((string.gsub(s, '^(%s*[-+]?%d+)([eE])', '%1.0%2'))))
end

local n = #KEYS
if n < 1 or #ARGV < 8 * n - 2 or #ARGV > 8 * n then
  return redis.error_reply('ERR fleetlimit refund: invalid arguments')
end
-- opt is an optional argument: nil when left out or ''.
local function opt(s)
  if s == '' then return nil end
  return s
end
-- Every key's arguments, read and checked before any refund runs.
local items = {}
for i = 1, n do
  local b = 8 * (i - 1)
  local capacity = num(ARGV[b + 1])
  local rate     = num(ARGV[b + 2])
  local amount   = num(ARGV[b + 3])
  local seq      = num(ARGV[b + 5])
  local version  = num(ARGV[b + 6])
  local floor    = capacity
  if opt(ARGV[b + 7]) then floor = num(ARGV[b + 7]) end
  -- Every test is written so that NaN fails it (see take.lua).
  if not (capacity and rate and amount and seq and version and floor) or not (capacity >= 1 and capacity < math.huge)
      or not (rate > 0 and rate < math.huge) or not (amount > -math.huge and amount < math.huge)
      or seq ~= seq or not (version >= 0 and version < 2^53) or version ~= math.floor(version)
      or not (floor >= 0 and floor < 2^53) or floor ~= math.floor(floor)
      or not (math.ceil((capacity + floor) / rate * 1000) + 1000 < 2^53) then
    return redis.error_reply('ERR fleetlimit refund: invalid arguments')
  end
  items[i] = { capacity, rate, amount, ARGV[b + 4], seq, ARGV[b + 5], version, floor, num(opt(ARGV[b + 8]) or '') }
end

local t   = redis.call('TIME')
local now = num(t[1]) * 1000 + math.floor(num(t[2]) / 1000)
-- p and c only when their value changes, or 30 s after they were written (see take.lua)
local function fresh(ms) return ms and now - ms < 30000 end

-- refund runs one key's refund: its reply's three values.
local function refund(key, capacity, rate, amount, server, seq, seq_s, version, floor, ref)
  local field = 'r:' .. server
  if amount < 0 then field = 'd:' .. server end
  local state  = redis.pcall('HMGET', key, 'tokens', 'ts', field, 'p', 'c')
  if state.err then return state.err, 4, 0 end
  local pv, pc, pr, p_at = string.match(state[4] or '', '^(%S+) (%S+) (%S+) (%S+)$')
  pv, pc, pr, p_at = num(pv), num(pc), num(pr), num(p_at)
  -- p stands when it holds parameters (a refund never re-shapes, so they stay); a bucket
  -- without gets the caller's
  local p_stands = false
  if pv and pc and pr and pc >= 1 and pr > 0 then
    if amount > 0 and (pv ~= version or pc ~= capacity or pr ~= rate) then amount = 0 end
    capacity, rate, version = pc, pr, pv
    p_stands = true
  end
  local stored = num(state[1])
  if not stored and amount > 0 then
    return tostring(capacity), 0, version
  end
  local ts     = num(state[2]) or now
  local raw    = (stored or capacity) + math.max(0, now - ts) / 1000 * rate
  local tokens = math.min(capacity, raw)
  -- the refill lost to the cap, counted in c (see take.lua)
  local held_credit, c_at = string.match(state[5] or '', '^(%S+) (%S+)$')
  held_credit, c_at = num(held_credit), num(c_at)
  local credit = held_credit
  if not stored or not credit then credit = now / 1000 * rate end
  if raw > capacity then credit = credit + (raw - capacity) end

  local rec = state[3]
  if rec then
    -- the record's seq first: the whole record is read only for a replay or a stale call
    local rseq = num(string.match(rec, '^(%S+) '))
    if rseq and rseq >= seq then
      local rtok
      rseq, rtok = string.match(rec, '^(%S+) (%S+) (%S+)$')
      rseq = num(rseq)
      if rseq == seq then
        return rtok, 1, version
      end
      if rseq and rseq > seq then
        return tostring(tokens), 2, version
      end
    end
  end
  -- a full bucket: nothing to write (see the top)
  if amount >= 0 and stored and raw >= capacity and p_stands and fresh(p_at) and held_credit and fresh(c_at) then
    return tostring(capacity), 0, version
  end
  if not rec then
    if state[1] and redis.call('HLEN', key) > 256 then
      local all = redis.call('HGETALL', key)
      for i = 1, #all, 2 do
        local f = all[i]
        if f ~= 'tokens' and f ~= 'ts' and f ~= 'p' and f ~= 'c' then
          local when = num(string.match(all[i + 1], '(%S+)$'))
          if not when or now - when > 120000 then
            redis.call('HDEL', key, f)
          end
        end
      end
    end
  end

  if amount < 0 then
    -- a debt: first forgiven the credit grown since the debtor's reference
    if ref and credit > ref then
      local forgiven = math.min(-amount, credit - ref)
      amount, credit = amount + forgiven, credit - forgiven
    end
    tokens = math.max(tokens + amount, math.min(tokens, -floor))
  else
    tokens = math.min(capacity, tokens + amount)
  end
  local left = tostring(tokens)
  -- now as text once (see take.lua)
  local now_s = tostring(now)
  local ts_new = now_s
  if ts > now then ts_new = ts end
  local set = { 'tokens', tokens, 'ts', ts_new, field, seq_s .. ' ' .. left .. ' ' .. now_s }
  if not (p_stands and fresh(p_at)) then
    set[7], set[8] = 'p', string.format('%d %.17g %.17g %d', version, capacity, rate, now)
  end
  if credit ~= held_credit or not fresh(c_at) then
    set[#set + 1], set[#set + 2] = 'c', string.format('%.17g ', credit) .. now_s
  end
  local wrote = redis.pcall('HSET', key, unpack(set))
  if type(wrote) == 'table' and wrote.err then return wrote.err, 4, 0 end
  -- the TTL: until the bucket is full again (a bucket below zero needs longer), plus 1 s.
  -- The refund is made: an error here (none the checks above leave possible) must not
  -- hide it.
  redis.pcall('PEXPIRE', key, string.format('%d', math.ceil(math.max(capacity, capacity - tokens) / rate * 1000) + 1000))
  return left, 0, version
end

local out = {}
for i = 1, n do
  local it = items[i]
  local left, flag, version = refund(KEYS[i], unpack(it, 1, 9))
  out[3 * i - 2], out[3 * i - 1], out[3 * i] = left, flag, version
end
return out
