-- Reserve: KEYS[1] reservation record, KEYS[2] bucket state hash, KEYS[3..n+2] bucket names
-- (state hash fields for token and window buckets, sorted-set keys for concurrency),
-- KEYS[n+3] the reservation's tombstone. ARGV[1] n, ARGV[2] reservation id, ARGV[3] ttl (ms),
-- then n groups of GROUP arguments (a concurrency group carries its slot lease in ms at b+3).
-- A tombstone means the caller already cancelled this id (its cancel overtook the reservation):
-- nothing is debited and {2} is returned. An id already recorded is not debited twice ({3}).
-- Every bucket is checked first; all are debited only when all have room.
-- Returns {1, then limit, remaining, reset us of every bucket after the debit} when admitted
-- (the caller picks its tightest bucket for the response headers), or {0, binding index (1-based), wait kind, wait us, limit,
-- remaining, reset us} for the binding bucket: never > longest time wait > on release.
local n, rid, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[n + 3]) == 1 then return { 2 } end
if redis.call('EXISTS', KEYS[1]) == 1 then return { 3 } end
local now = now_us()
local states = load_all(KEYS[2], 3, n, now, nil)
local worst, wkind, wwait = nil, -1, -1
for i = 1, n do
  local kind, wait = check(states[i], tonumber(ARGV[4 + (i - 1) * GROUP + 1]), now)
  if kind and (kind > wkind or (kind == wkind and wait > wwait)) then
    worst, wkind, wwait = i, kind, wait
  end
end
if worst then
  -- Nothing is written on a refusal: levels and windows are recomputed from the stored state.
  local limit, remaining, reset = figures(states[worst], now)
  return { 0, worst, wkind, wwait, limit, remaining, reset }
end
local expiry = now + ttl * 1000
-- The record: 'amount:epoch' per bucket, comma-separated, expiring with the reservation.
local record = {}
for i = 1, n do
  local s, amt = states[i], tonumber(ARGV[4 + (i - 1) * GROUP + 1])
  local epoch = 0
  if s.kind == 'T' then
    s.level = s.level - amt * s.per
    s.changed = true
  elseif s.kind == 'W' then
    s.used = s.used + amt
    epoch = s.e
    s.changed = true
  else
    -- No TTL needed: Redis deletes a sorted set when its last member is removed or pruned.
    -- The slot is leased: it lapses after the lease unless the owning replica renews it
    -- (renew.lua), so a dead replica's slots come back within one lease.
    local lease = tonumber(ARGV[4 + (i - 1) * GROUP + 3]) or 0
    local slot = expiry
    if lease > 0 then slot = math.min(expiry, now + lease * 1000) end
    redis.call('ZADD', s.key, slot, rid)
    s.held = s.held + 1
  end
  record[i] = string.format('%d:%d', amt, epoch)
end
save_all(KEYS[2], states, n)
redis.call('SET', KEYS[1], table.concat(record, ','), 'PX', ttl)
local out = { 1 }
for i = 1, n do
  local limit, remaining, reset = figures(states[i], now)
  out[#out + 1] = limit
  out[#out + 1] = remaining
  out[#out + 1] = reset
end
return out
