-- Settle a batch of reservations, in order (layout in `batch_items`; an item's number is its
-- tombstone ttl in ms, 0 = none; its amounts the units really used, -1 keeps the estimate).
-- Each item credits exactly what its record says was debited. With a tombstone ttl, a
-- reservation script for that id that runs later debits nothing (a cancel that
-- overtakes its reservation wins). Only buckets whose charge changes are read and written,
-- each once for the whole batch. Returns per item 1 when settled, 0 when its record had
-- expired, was already settled or never landed.
local _, items = batch_items()
local out, changes, wanted = {}, {}, {}
for j, it in ipairs(items) do
  if it.ms > 0 then redis.call('SET', it.tomb, '1', 'PX', it.ms) end
  local raw = redis.call('GETDEL', it.rec)
  for i = 1, it.n do
    local bucket = it.refs[i].bucket
    if KIND[ARGV[bucket.b]] == 'C' then redis.call('ZREM', bucket.name, it.rid) end
  end
  out[j] = 0
  if raw then
    out[j] = 1
    local amounts, epochs = {}, {}
    for a, e in string.gmatch(raw, '([^:,]+):([^,]+)') do
      amounts[#amounts + 1] = tonumber(a)
      epochs[#epochs + 1] = tonumber(e)
    end
    for i = 1, it.n do
      local bucket, actual, reserved = it.refs[i].bucket, it.refs[i].amount, amounts[i]
      if KIND[ARGV[bucket.b]] ~= 'C' and actual >= 0 and reserved and actual ~= reserved then
        wanted[#wanted + 1] = bucket
        changes[#changes + 1] = {
          name = bucket.name, actual = actual, reserved = reserved, epoch = epochs[i],
        }
      end
    end
  end
end
if #changes == 0 then return out end
local now = now_us()
local states = load_many(KEYS[1], wanted, now)
for _, c in ipairs(changes) do
  local s = states[c.name]
  if s.kind == 'T' then
    -- A credit never lifts the level above capacity; an overrun may go negative.
    s.level = math.min(s.cap * s.per, s.level + (c.reserved - c.actual) * s.per)
  elseif s.e == c.epoch then
    s.used = math.max(0, s.used - c.reserved) + c.actual
  else
    -- The charged window has closed: drop a credit, charge an overrun to the current one.
    s.used = s.used + math.max(0, c.actual - c.reserved)
  end
  s.changed = true
end
save_many(KEYS[1], states)
return out
