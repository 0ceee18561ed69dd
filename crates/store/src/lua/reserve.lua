-- Reserve: KEYS[1] reservation record, KEYS[2..n+1] buckets.
-- ARGV[1] n, ARGV[2] reservation id, ARGV[3] ttl (ms), then n groups of GROUP arguments.
-- Every bucket is checked first; all are debited only when all have room.
-- Returns {1} when admitted, or {0, binding index (1-based), wait kind, wait us, limit,
-- remaining, reset us} for the binding bucket: never > longest time wait > on release.
local n, rid, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local now = now_us()
local states = {}
local worst, wkind, wwait = nil, -1, -1
for i = 1, n do
  local b = 4 + (i - 1) * GROUP
  local s = load(i + 1, b, now)
  states[i] = s
  local kind, wait = check(s, tonumber(ARGV[b + 1]), now)
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
local record = { 'n', n }
for i = 1, n do
  local b = 4 + (i - 1) * GROUP
  local s, amt = states[i], tonumber(ARGV[b + 1])
  local epoch = 0
  if s.kind == 'T' then
    s.level = s.level - amt * s.per
    save(s)
  elseif s.kind == 'W' then
    s.used = s.used + amt
    epoch = s.e
    save(s)
  else
    redis.call('ZADD', s.key, expiry, rid)
    if redis.call('PTTL', s.key) < ttl then redis.call('PEXPIRE', s.key, ttl) end
  end
  record[#record + 1] = 'a' .. i
  record[#record + 1] = amt
  record[#record + 1] = 'e' .. i
  record[#record + 1] = epoch
end
redis.call('HSET', KEYS[1], unpack(record))
redis.call('PEXPIRE', KEYS[1], ttl)
return { 1 }
