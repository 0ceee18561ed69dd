-- Settle: KEYS[1] reservation record, KEYS[2..n+1] buckets (as reserved, same order).
-- ARGV[1] n, ARGV[2] reservation id, then n groups whose amount is the units really used
-- (-1 keeps the estimate). Credits exactly what the record says was debited.
-- Returns 1 when settled, 0 when the record had expired or was already settled.
local n, rid = tonumber(ARGV[1]), ARGV[2]
local raw = redis.call('HGETALL', KEYS[1])
for i = 1, n do
  local b = 4 + (i - 1) * GROUP
  if KIND[ARGV[b]] == 'C' then redis.call('ZREM', KEYS[i + 1], rid) end
end
if #raw == 0 then return 0 end
local rec = {}
for j = 1, #raw, 2 do rec[raw[j]] = tonumber(raw[j + 1]) end
local now = now_us()
for i = 1, n do
  local b = 4 + (i - 1) * GROUP
  local kind, actual = KIND[ARGV[b]], tonumber(ARGV[b + 1])
  local reserved = rec['a' .. i]
  if kind ~= 'C' and actual >= 0 and reserved and actual ~= reserved then
    local s = load(i + 1, b, now)
    if kind == 'T' then
      -- A credit never lifts the level above capacity; an overrun may go negative.
      s.level = math.min(s.cap * s.per, s.level + (reserved - actual) * s.per)
    elseif s.e == rec['e' .. i] then
      s.used = math.max(0, s.used - reserved) + actual
    else
      -- The charged window has closed: drop a credit, charge an overrun to the current one.
      s.used = s.used + math.max(0, actual - reserved)
    end
    save(s)
  end
end
redis.call('DEL', KEYS[1])
return 1
