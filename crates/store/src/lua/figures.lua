-- Figures (and header corrections) of one bucket: KEYS[1] bucket state hash, KEYS[2] bucket
-- name; ARGV[1] = 1, ARGV[2] mode ('F' figures only, 'H' correct from headers), ARGV[3]
-- reported remaining, then one group at ARGV[4] whose amount slot carries the reported
-- reset (us, -1 unknown). Returns {limit, remaining, reset us, changed}.
local mode = ARGV[2]
local now = now_us()
local s = load_many(KEYS[1], { { name = KEYS[2], b = 4 } }, now)[KEYS[2]]
local changed = 0
if mode == 'H' and s.kind ~= 'C' then
  local remaining, reset = tonumber(ARGV[3]), tonumber(ARGV[5])
  if s.kind == 'T' then
    local target = remaining * s.per
    if reset >= 0 then
      target = math.min(target, s.cap * s.per - s.cap * ceil_div(reset, s.tick))
    end
    if target < s.level then s.level = target; changed = 1 end
  else
    local floor = math.max(0, s.cap - remaining)
    if floor > s.used then s.used = floor; changed = 1 end
    if reset >= 0 and now + reset > s.wend then s.wend = now + reset; changed = 1 end
  end
end
if changed == 1 then
  s.changed = true
  save_many(KEYS[1], { [KEYS[2]] = s })
end
local limit, remaining, reset = figures(s, now)
return { limit, remaining, reset, changed }
