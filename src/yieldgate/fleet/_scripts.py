"""The Lua scripts: every shared operation, atomic on the server, one round trip.

Each script starts with ``PRELUDE``: ``now`` is Redis's own ``TIME`` (in
seconds, as a double), so hosts' clocks never matter, and numbers go back as
strings (``%.17g``): Redis truncates a Lua number in a reply to an integer.
Every key a script writes gets an expiry. All keys a script touches carry
the same hash tag (one upstream's), so each runs on one Redis Cluster node.
"""

from __future__ import annotations

from typing import Final

__all__ = ["SCRIPTS"]

PRELUDE: Final = """
if redis.replicate_commands then redis.replicate_commands() end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local function fmt(x) return string.format('%.17g', x) end
local function expire(key, seconds)
  redis.call('PEXPIRE', key, math.max(1, math.ceil(seconds * 1000)))
end
-- Never shortens a key's life: other members may use longer TTLs.
local function extend(key, seconds)
  local ms = math.max(1, math.ceil(seconds * 1000))
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
local function refill(level, updated, limit, rate)
  if now <= updated then return level end
  return math.min(limit, level + (now - updated) * rate)
end
-- Kept twice the time it takes to fill (a minute at least, a week at most):
-- a bucket untouched that long is full again, as a missing one is created.
local function bucket_ttl(limit, rate)
  local full = 604800
  if rate > 0 then full = limit / rate end
  return math.min(math.max(60, 2 * full), 604800)
end
"""

# KEYS[1]: the upstream's send sequence; KEYS[2..]: buckets.
# ARGV: amount, limit, rate for each bucket (limit and rate used only to create it).
# Refused: 0, 0, the longest wait, then each bucket that had no room (its place among
# KEYS[2..], from 1) and the refill it needs, so that only claims spending from it wait.
TAKE: Final = """
local buckets = {}
local wait = 0
local top = 0
local short_of = {}
for i = 2, #KEYS do
  local j = 3 * (i - 2)
  local amount, limit, rate = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
  local h = redis.call('HMGET', KEYS[i], 'limit', 'rate', 'level', 'updated', 'unseen', 'applied')
  local level, updated, unseen = limit, now, 0
  if h[1] then
    limit, rate = tonumber(h[1]), tonumber(h[2])
    updated = tonumber(h[4])
    level = refill(tonumber(h[3]), updated, limit, rate)
    unseen = tonumber(h[5]) or 0
    top = math.max(top, tonumber(h[6]) or 0)
  end
  -- A learnt limit paces, never refuses: a cost past it waits for the whole bucket
  -- and spends that (the caller's own budgets refuse such a cost before asking).
  amount = math.min(amount, limit)
  local short = amount - level
  if short > 0 then
    local need = math.huge
    if rate > 0 then need = short / rate end
    if need > wait then wait = need end
    short_of[#short_of + 1] = i - 1
    short_of[#short_of + 1] = fmt(need)
  end
  buckets[#buckets + 1] = {KEYS[i], amount, limit, rate, level, math.max(updated, now), unseen}
end
if wait > 0 then
  local reply = {0, 0, fmt(wait)}
  for _, v in ipairs(short_of) do reply[#reply + 1] = v end
  return reply
end
local ttl = 60
for _, b in ipairs(buckets) do
  redis.call('HSET', b[1], 'limit', fmt(b[3]), 'rate', fmt(b[4]), 'level', fmt(b[5] - b[2]),
    'updated', fmt(b[6]), 'unseen', fmt(b[7] + b[2]))
  local keep = bucket_ttl(b[3], b[4])
  expire(b[1], keep)
  if keep > ttl then ttl = keep end
end
local seq = redis.call('INCR', KEYS[1])
-- The sequence never falls behind a reading applied (it expired, or was lost).
if seq <= top then
  seq = top + 1
  redis.call('SET', KEYS[1], fmt(seq))
end
extend(KEYS[1], ttl)
return {1, seq, '0'}
"""

# KEYS: buckets. ARGV: the amount given back to each.
REFUND: Final = """
for i = 1, #KEYS do
  local amount = tonumber(ARGV[i])
  local h = redis.call('HMGET', KEYS[i], 'limit', 'rate', 'level', 'updated', 'unseen')
  if h[1] then
    local limit, rate, updated = tonumber(h[1]), tonumber(h[2]), tonumber(h[4])
    local level = math.min(limit, refill(tonumber(h[3]), updated, limit, rate) + amount)
    local unseen = math.max(0, (tonumber(h[5]) or 0) - amount)
    redis.call('HSET', KEYS[i], 'level', fmt(level), 'updated', fmt(math.max(updated, now)),
      'unseen', fmt(unseen))
  end
end
return 1
"""

# KEYS[1]: the send sequence; KEYS[2]: the bucket; KEYS[3]: the upstream's shapes (a hash,
# bucket -> "resource limit rate", for members that have not had an answer yet).
# ARGV: limit, rate, remaining, amount (of the take with seq), seq, then the bucket's name
# and its resource (the shape is recorded only when both are given), then the seconds
# since the request was sent ('' when not known: the highest seq is then the newest).
OBSERVE: Final = """
local limit, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local remaining, amount, seq = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local age = tonumber(ARGV[8] or '')
local h = redis.call('HMGET', KEYS[2], 'level', 'updated', 'applied', 'unseen', 'sent')
local unseen = math.max(0, (tonumber(h[4]) or 0) - amount)
local candidate = remaining - unseen
local level, updated, applied = candidate, now, seq
local sent = 0
if seq > 0 and age then sent = now - age end
local old = tonumber(h[3]) or 0
local newest = tonumber(h[5]) or 0
-- The sequence never falls behind a reading applied (it expired, or was lost).
local top = math.max(seq, old)
if (tonumber(redis.call('GET', KEYS[1])) or -1) < top then
  redis.call('SET', KEYS[1], fmt(top))
end
extend(KEYS[1], bucket_ttl(limit, rate))
if h[1] then
  local was = tonumber(h[2])
  updated = math.max(was, now)
  local newer = seq > old
  if age then newer = seq > 0 and sent > newest end
  if newer then
    sent = math.max(sent, newest)
  else
    applied, sent = old, newest
    level = math.min(refill(tonumber(h[1]), was, limit, rate), candidate)
  end
  applied = math.max(applied, old)
end
redis.call('HSET', KEYS[2], 'limit', fmt(limit), 'rate', fmt(rate), 'level', fmt(level),
  'updated', fmt(updated), 'applied', fmt(applied), 'unseen', fmt(unseen), 'sent', fmt(sent))
expire(KEYS[2], bucket_ttl(limit, rate))
if KEYS[3] and ARGV[7] and ARGV[7] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[6], ARGV[7] .. ' ' .. fmt(limit) .. ' ' .. fmt(rate))
  extend(KEYS[3], bucket_ttl(limit, rate))
end
return 1
"""

# KEYS[1]: the upstream's shapes. Returns bucket, "resource limit rate", ... (HGETALL).
SHAPES: Final = """
return redis.call('HGETALL', KEYS[1])
"""

# KEYS[1]: the upstream's shapes; KEYS[2]: its first-reading probe. ARGV: member, TTL in ms.
# A member with no reading yet asks: 'known' and the shapes (HGETALL) when the fleet has
# them and no probe is out; 'none' when the probe's answer carried no quota; else 'mine'
# (this member sends the one probe: it took the key, or holds it) or 'other' (another
# member does; the shapes it may have written so far are not all of them yet).
FIRST: Final = """
local holder = redis.call('GET', KEYS[2])
if holder == '{none}' then return {'none'} end
if holder == ARGV[1] then return {'mine'} end
if holder and holder ~= '{done}' then return {'other'} end
local shapes = redis.call('HGETALL', KEYS[1])
if #shapes > 0 then
  table.insert(shapes, 1, 'known')
  return shapes
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return {'mine'}
"""

# KEYS[1]: the upstream's shapes; KEYS[2]: the first-reading probe. ARGV: member, TTL in
# ms, then each bucket the probe's answer taught and its shape ("resource limit rate").
# Written at once, so that no member paces by some of them only; with none, the answer
# carried no quota, and members stop waiting for one (braces are no member's name).
PROBED: Final = """
for i = 3, #ARGV - 1, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  local limit, rate = string.match(ARGV[i + 1], ' (%S+) (%S+)$')
  extend(KEYS[1], bucket_ttl(tonumber(limit), tonumber(rate)))
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  local mark = '{none}'
  if #ARGV > 2 then mark = '{done}' end
  redis.call('SET', KEYS[2], mark, 'PX', ARGV[2])
end
return 1
"""

# KEYS[1]: the first-reading probe. ARGV: member. The probe this member holds and whose
# answer never came goes back, for the next member that asks; another member's, or a
# reading settled ('{done}', '{none}'), stays.
ABANDON_FIRST: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# KEYS: buckets. ARGV: each one's correction, signed (+: given back, -: taken more).
# The caller's own budgets, settled by what an answered request really used.
SETTLE: Final = """
for i = 1, #KEYS do
  local delta = tonumber(ARGV[i])
  local h = redis.call('HMGET', KEYS[i], 'limit', 'rate', 'level', 'updated')
  if h[1] then
    local limit, rate, updated = tonumber(h[1]), tonumber(h[2]), tonumber(h[4])
    local level = math.min(limit, refill(tonumber(h[3]), updated, limit, rate) + delta)
    redis.call('HSET', KEYS[i], 'level', fmt(level), 'updated', fmt(math.max(updated, now)))
  end
end
return 1
"""

# KEYS: buckets. ARGV: the amount of each that is answered (no longer unseen).
FINISHED: Final = """
for i = 1, #KEYS do
  local unseen = redis.call('HGET', KEYS[i], 'unseen')
  if unseen then
    redis.call('HSET', KEYS[i], 'unseen', fmt(math.max(0, tonumber(unseen) - tonumber(ARGV[i]))))
  end
end
return 1
"""

# KEYS[1]: holds (rank -> the hold's end, Redis time), or the scopes' holds ("rank scope"
# -> its end: a provider's quota refused that scope). ARGV: rank, for_s, then the scope
# (none: the upstream's own hold).
HOLD: Final = """
local rank, ends = tonumber(ARGV[1]), now + tonumber(ARGV[2])
local suffix = ''
if ARGV[3] and ARGV[3] ~= '' then suffix = ' ' .. ARGV[3] end
for r = 0, rank do
  local field = fmt(r) .. suffix
  local current = tonumber(redis.call('HGET', KEYS[1], field)) or 0
  if ends > current then redis.call('HSET', KEYS[1], field, fmt(ends)) end
end
local latest = now
local all = redis.call('HGETALL', KEYS[1])
for i = 2, #all, 2 do
  local e = tonumber(all[i])
  if e > latest then latest = e end
end
expire(KEYS[1], latest - now + 1)
return 1
"""

# KEYS: holds, and the scopes' holds if asked. Returns the field (rank, or "rank scope")
# and the seconds left, ..., for holds still in force.
HOLDS: Final = """
local out = {}
for k = 1, #KEYS do
  local all = redis.call('HGETALL', KEYS[k])
  for i = 1, #all, 2 do
    local left = tonumber(all[i + 1]) - now
    if left > 0 then
      out[#out + 1] = all[i]
      out[#out + 1] = fmt(left)
    end
  end
end
return out
"""

# KEYS[1]: leases (a ZSET, lease id "member#n" -> expiry), KEYS[2]: waiters (a ZSET,
# member -> expiry). ARGV: cap, lease id, ttl_s, member, wait_ttl_s.
# Fair between members: while another member waits, one that holds its share of the
# cap (cap over the members holding or waiting, rounded up) is refused too, and waits.
ACQUIRE: Final = """
local ttl = tonumber(ARGV[3])
local me = ARGV[4]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. fmt(now))
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. fmt(now))
local held = redis.call('ZRANGE', KEYS[1], 0, -1)
local seen, count, mine = {}, 0, 0
for _, id in ipairs(held) do
  local m = string.match(id, '^(.*)#')
  if m == me then mine = mine + 1 end
  if m and not seen[m] then seen[m] = true; count = count + 1 end
end
local others = 0
for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if w ~= me then
    others = others + 1
    if not seen[w] then seen[w] = true; count = count + 1 end
  end
end
if not seen[me] then count = count + 1 end
local cap = tonumber(ARGV[1])
if #held >= cap or (others > 0 and mine >= math.ceil(cap / count)) then
  local wait = tonumber(ARGV[5])
  redis.call('ZADD', KEYS[2], fmt(now + wait), me)
  extend(KEYS[2], wait + 1)
  return 0
end
redis.call('ZREM', KEYS[2], me)
redis.call('ZADD', KEYS[1], fmt(now + ttl), ARGV[2])
extend(KEYS[1], ttl + 1)
return 1
"""

# KEYS[1]: leases. ARGV: ttl_s, lease ids. 1 if every lease was still held.
RENEW: Final = """
local ttl = tonumber(ARGV[1])
local all = 1
for i = 2, #ARGV do
  local expiry = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]))
  if expiry and expiry >= now then
    redis.call('ZADD', KEYS[1], 'XX', fmt(now + ttl), ARGV[i])
  else
    all = 0
  end
end
extend(KEYS[1], ttl + 1)
return all
"""

# KEYS[1]: members (a ZSET, member -> expiry). ARGV: member, ttl_s. The members alive.
HEARTBEAT: Final = """
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. fmt(now))
redis.call('ZADD', KEYS[1], fmt(now + ttl), ARGV[1])
extend(KEYS[1], ttl + 1)
return redis.call('ZCARD', KEYS[1])
"""

# KEYS[1]: members. The members alive.
MEMBERS: Final = """
return redis.call('ZCOUNT', KEYS[1], fmt(now), '+inf')
"""

# KEYS[1]: the budget (a hash: q:<epoch> requests, r:<epoch> retries, in ten
# buckets of window_s / 10). ARGV: op (deposit, withdraw, refund), window_s,
# ratio, min_per_s, and n (deposit) or the receipt (refund).
# withdraw returns its receipt (the bucket's epoch) or 0.
BUDGET: Final = """
local op, window = ARGV[1], tonumber(ARGV[2])
local ratio, floor = tonumber(ARGV[3]), tonumber(ARGV[4])
local epoch = math.floor(now / (window / 10))
local requests, retries = 0, 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local e = tonumber(string.sub(all[i], 3))
  if e == nil or e <= epoch - 10 then
    redis.call('HDEL', KEYS[1], all[i])
  elseif string.sub(all[i], 1, 1) == 'q' then
    requests = requests + tonumber(all[i + 1])
  else
    retries = retries + tonumber(all[i + 1])
  end
end
local result = '1'
if op == 'deposit' then
  redis.call('HINCRBY', KEYS[1], 'q:' .. fmt(epoch), ARGV[5])
elseif op == 'withdraw' then
  if ratio * requests + floor * window - retries < 1 then return '0' end
  redis.call('HINCRBY', KEYS[1], 'r:' .. fmt(epoch), 1)
  result = fmt(epoch)
elseif op == 'refund' then
  local receipt = tonumber(ARGV[5])
  if receipt and epoch - receipt >= 0 and epoch - receipt < 10 then
    local field = 'r:' .. fmt(receipt)
    if (tonumber(redis.call('HGET', KEYS[1], field)) or 0) > 0 then
      redis.call('HINCRBY', KEYS[1], field, -1)
    end
  end
end
expire(KEYS[1], 2 * window)
return result
"""

# KEYS[1]: the breaker (a hash); KEYS[2]: the half-open probe (SET NX, with a TTL).
# ARGV[1]: op.
#   report: success (0/1), probe (0/1), fail_max, reset_timeout_s, success_threshold, keep_s
#   probe: member, ttl_ms
#   unprobe: member (drop the probe if this member holds it)
#   state: nothing more
# Returns state, seconds until an open breaker may probe, whether a probe is
# out (0/1), and for op probe whether this member got it (0/1).
BREAKER: Final = """
local h = redis.call('HMGET', KEYS[1], 'state', 'failures', 'opened', 'reset', 'successes')
local state = h[1] or 'closed'
local failures = tonumber(h[2]) or 0
local opened = tonumber(h[3]) or 0
local reset = tonumber(h[4]) or 0
local successes = tonumber(h[5]) or 0
local op = ARGV[1]
if op == 'report' then reset = tonumber(ARGV[5]) end
if state == 'open' and now >= opened + reset then state = 'half-open' end
local got = 0
if op == 'report' then
  local success, probe = ARGV[2] == '1', ARGV[3] == '1'
  if state == 'closed' then
    if success then
      failures = 0
    else
      failures = failures + 1
      if failures >= tonumber(ARGV[4]) then
        state, opened, failures, successes = 'open', now, 0, 0
        redis.call('DEL', KEYS[2])
      end
    end
  elseif state == 'half-open' and probe then
    redis.call('DEL', KEYS[2])
    if success then
      successes = successes + 1
      if successes >= tonumber(ARGV[6]) then state, failures, successes = 'closed', 0, 0 end
    else
      state, opened, successes = 'open', now, 0
    end
  end
  redis.call('HSET', KEYS[1], 'state', state, 'failures', failures, 'opened', fmt(opened),
    'reset', fmt(reset), 'successes', successes)
  expire(KEYS[1], tonumber(ARGV[7]))
elseif op == 'probe' and state == 'half-open' then
  if redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then got = 1 end
elseif op == 'unprobe' then
  if redis.call('GET', KEYS[2]) == ARGV[2] then
    redis.call('DEL', KEYS[2])
    got = 1
  end
end
local wait = 0
if state == 'open' then wait = opened + reset - now end
return {state, fmt(wait), redis.call('EXISTS', KEYS[2]), got}
"""

# KEYS[1]: leases; KEYS[2]: the breaker's half-open probe; KEYS[3]: the first reading's
# probe. ARGV: the pattern of the upstream's buckets' keys. What nothing in flight accounts
# for, when no member has a call running: the leases in force, the holders of the two
# probes ('' for none; the first reading's '{done}' and '{none}' are settled, not held),
# then each bucket whose unseen count is not 0, and that count. A SCAN: for tests and
# debugging, not for a busy Redis's hot path.
AUDIT: Final = """
local out = {redis.call('ZCOUNT', KEYS[1], fmt(now), '+inf')}
out[2] = redis.call('GET', KEYS[2]) or ''
local first = redis.call('GET', KEYS[3]) or ''
if first == '{done}' or first == '{none}' then first = '' end
out[3] = first
local cursor = '0'
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    local unseen = tonumber(redis.call('HGET', key, 'unseen') or '0') or 0
    if unseen ~= 0 then
      out[#out + 1] = key
      out[#out + 1] = fmt(unseen)
    end
  end
until cursor == '0'
return out
"""

SCRIPTS: Final = {
    name: PRELUDE + body
    for name, body in {
        "take": TAKE,
        "refund": REFUND,
        "observe": OBSERVE,
        "finished": FINISHED,
        "shapes": SHAPES,
        "first": FIRST,
        "probed": PROBED,
        "abandon_first": ABANDON_FIRST,
        "settle": SETTLE,
        "hold": HOLD,
        "holds": HOLDS,
        "acquire": ACQUIRE,
        "renew": RENEW,
        "heartbeat": HEARTBEAT,
        "members": MEMBERS,
        "budget": BUDGET,
        "breaker": BREAKER,
        "audit": AUDIT,
    }.items()
}
"""Every script by name, each with the prelude."""
