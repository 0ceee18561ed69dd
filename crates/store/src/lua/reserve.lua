-- Reserve a batch of reservations, in order (layout in `batch_items`; an item's number is its
-- ttl in ms, its amounts the units to debit; a concurrency group carries its slot lease in ms
-- at b+3). A bucket named by
-- several items is read once (one HMGET for the batch), debited by each admitted item in turn
-- and written once (one HSET), so a batch costs one script call instead of one per item.
--
-- Per item, in item order:
-- {2} its tombstone exists: the caller already cancelled this id (its cancel overtook the
--     reservation); nothing is debited;
-- {3} the id is already recorded: not debited twice;
-- {1, then limit, remaining, reset us of every bucket after the debit} when admitted (every
--     bucket is checked first; all are debited only when all have room; the caller picks its
--     tightest bucket for the response headers);
-- {0, binding index (1-based), wait kind, wait us, limit, remaining, reset us} for the binding
--     bucket of a refusal: never > longest time wait > on release. Nothing is written for it.
local buckets, items = batch_items()
local now = now_us()
local states = load_many(KEYS[1], buckets, now)

local function reserve_one(it)
  local bucket = function(i) return states[it.refs[i].bucket.name] end
  local amount = function(i) return it.refs[i].amount end
  local worst, wkind, wwait = nil, -1, -1
  for i = 1, it.n do
    local kind, wait = check(bucket(i), amount(i), now)
    if kind and (kind > wkind or (kind == wkind and wait > wwait)) then
      worst, wkind, wwait = i, kind, wait
    end
  end
  if worst then
    local limit, remaining, reset = figures(bucket(worst), now)
    return { 0, worst, wkind, wwait, limit, remaining, reset }
  end
  local expiry = now + it.ms * 1000
  -- The record: 'amount:epoch' per bucket, comma-separated, expiring with the reservation.
  local record = {}
  for i = 1, it.n do
    local s, amt = bucket(i), amount(i)
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
      local lease = tonumber(ARGV[it.refs[i].bucket.b + 3]) or 0
      local slot = expiry
      if lease > 0 then slot = math.min(expiry, now + lease * 1000) end
      redis.call('ZADD', s.key, slot, it.rid)
      s.held = s.held + 1
    end
    record[i] = string.format('%d:%d', amt, epoch)
  end
  redis.call('SET', it.rec, table.concat(record, ','), 'PX', it.ms)
  local out = { 1 }
  for i = 1, it.n do
    local limit, remaining, reset = figures(bucket(i), now)
    out[#out + 1] = limit
    out[#out + 1] = remaining
    out[#out + 1] = reset
  end
  return out
end

local out = {}
for j, it in ipairs(items) do
  -- One EXISTS for both keys in the usual case (neither exists).
  if redis.call('EXISTS', it.tomb, it.rec) == 0 then
    out[j] = reserve_one(it)
  elseif redis.call('EXISTS', it.tomb) == 1 then
    out[j] = { 2 }
  else
    out[j] = { 3 }
  end
end
save_many(KEYS[1], states)
return out
