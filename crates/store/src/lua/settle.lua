-- Settle: KEYS[1] reservation record, KEYS[2] bucket state hash, KEYS[3..n+2] bucket names
-- (as reserved, same order), KEYS[n+3] the reservation's tombstone. ARGV[1] n, ARGV[2]
-- reservation id, ARGV[3] tombstone ttl (ms, 0 = none), then n groups whose amount is the
-- units really used (-1 keeps the estimate). Credits exactly what the record says was
-- debited. With a tombstone ttl, a reservation script for this id that runs later debits
-- nothing (a cancel that overtakes its reservation wins). Returns 1 when settled, 0 when the
-- record had expired, was already settled or never landed.
local n, rid, tomb = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if tomb > 0 then redis.call('SET', KEYS[n + 3], '1', 'PX', tomb) end
local raw = redis.call('GETDEL', KEYS[1])
for i = 1, n do
  if KIND[ARGV[4 + (i - 1) * GROUP]] == 'C' then redis.call('ZREM', KEYS[i + 2], rid) end
end
if not raw then return 0 end
local amounts, epochs = {}, {}
for a, e in string.gmatch(raw, '([^:,]+):([^,]+)') do
  amounts[#amounts + 1] = tonumber(a)
  epochs[#epochs + 1] = tonumber(e)
end
-- Only buckets whose charge changes are read and written.
local only, any = {}, false
for i = 1, n do
  local b = 4 + (i - 1) * GROUP
  local actual, reserved = tonumber(ARGV[b + 1]), amounts[i]
  if KIND[ARGV[b]] ~= 'C' and actual >= 0 and reserved and actual ~= reserved then
    only[i] = true
    any = true
  end
end
if not any then return 1 end
local now = now_us()
local states = load_all(KEYS[2], 3, n, now, only)
for i = 1, n do
  local s = states[i]
  if s then
    local actual, reserved = tonumber(ARGV[4 + (i - 1) * GROUP + 1]), amounts[i]
    if s.kind == 'T' then
      -- A credit never lifts the level above capacity; an overrun may go negative.
      s.level = math.min(s.cap * s.per, s.level + (reserved - actual) * s.per)
    elseif s.e == epochs[i] then
      s.used = math.max(0, s.used - reserved) + actual
    else
      -- The charged window has closed: drop a credit, charge an overrun to the current one.
      s.used = s.used + math.max(0, actual - reserved)
    end
    s.changed = true
  end
end
save_all(KEYS[2], states, n)
return 1
