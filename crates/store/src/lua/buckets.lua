-- Shared bucket arithmetic of the quota store's scripts (prepended to each script).
--
-- Every bucket is described by a group of GROUP arguments starting at ARGV[b]:
--   b+0 kind as a character code: 84 'T' token bucket, 87 'W' fixed window, 67 'C' concurrency
--   b+1 amount (reserve: units to debit; settle: units really used, -1 = keep the estimate)
--   b+2 capacity (units per period / window, or concurrency limit)
--   T: b+3 period in ticks, b+4 tick in microseconds
--   W: b+3 epoch of the window containing the caller's wall clock, b+4 its end (us),
--      b+5 epoch of the next window, b+6 its end (us); b+7 period (us), to notice a change
-- State lives in a hash (T, W) or a sorted set of reservation ids scored by expiry (C).
-- Numbers are Lua doubles: integers are exact below 2^53, and the caller picks the tick so
-- that capacity x period-in-ticks stays below it.

local GROUP = 8
local KIND = { ['84'] = 'T', ['87'] = 'W', ['67'] = 'C' }

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function ceil_div(a, b)
  return math.ceil(a / b)
end

-- Token refill over dt ticks, capped at capacity (a bucket in debt refills toward it).
local function refill(level, cap, per, dt)
  if dt <= 0 then return level end
  local full = cap * per
  if cap <= 0 then return math.min(level, full) end
  if level >= full then return full end
  if dt >= ceil_div(full - level, cap) then return full end
  return level + cap * dt
end

-- Loads the bucket at KEYS[ki] described by the group at ARGV[b], brought to `now`.
local function load(ki, b, now)
  local kind = KIND[ARGV[b]]
  local s = { kind = kind, key = KEYS[ki], cap = tonumber(ARGV[b + 2]) }
  if kind == 'C' then
    redis.call('ZREMRANGEBYSCORE', s.key, '-inf', now)
    s.held = redis.call('ZCARD', s.key)
    return s
  end
  local h = redis.call('HMGET', s.key, 'k', 'c', 'p', 'q', 'l', 't', 'e', 'n')
  if kind == 'T' then
    s.per = tonumber(ARGV[b + 3]); s.tick = tonumber(ARGV[b + 4])
    s.t = math.floor(now / s.tick)
    if h[1] ~= 'T' then
      s.level = s.cap * s.per
      return s
    end
    local oc, op, oq = tonumber(h[2]), tonumber(h[3]), tonumber(h[4])
    local level = refill(tonumber(h[5]), oc, op, math.floor(now / oq) - tonumber(h[6]))
    if oc ~= s.cap or op ~= s.per or oq ~= s.tick then
      -- A changed limit keeps what was consumed (rounded up), like Ledger::register.
      local consumed = ceil_div(oc * op - level, op)
      level = (s.cap - consumed) * s.per
    end
    s.level = level
    return s
  end
  -- 'W'
  local e0, end0 = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local e1, end1 = tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])
  s.period = tonumber(ARGV[b + 7])
  local we, wend = e0, end0
  if now >= end0 then we, wend = e1, end1 end
  if h[1] ~= 'W' then
    s.e, s.wend, s.used = we, wend, 0
    return s
  end
  s.e, s.wend, s.used = tonumber(h[7]), tonumber(h[8]), tonumber(h[5])
  if tonumber(h[3]) ~= s.period then
    -- A new window length: fresh boundaries, consumption kept.
    s.e, s.wend = we, wend
  elseif now >= s.wend and we > s.e then
    -- The stored window is over; never reopen an older one (a lagging caller's clock).
    s.e, s.wend, s.used = we, wend, 0
  end
  return s
end

local function save(s)
  if s.kind == 'T' then
    redis.call('HSET', s.key, 'k', 'T', 'c', s.cap, 'p', s.per, 'q', s.tick, 'l', s.level, 't', s.t)
  elseif s.kind == 'W' then
    redis.call('HSET', s.key, 'k', 'W', 'c', s.cap, 'p', s.period, 'l', s.used, 'e', s.e, 'n', s.wend)
  end
end

-- nil when `amt` fits; else wait kind (0 on release, 1 after a time, 2 never) and wait (us).
local function check(s, amt, now)
  if s.kind == 'T' then
    local need = amt * s.per
    if need <= s.level then return nil end
    if amt > s.cap or s.cap <= 0 then return 2, 0 end
    local ticks = ceil_div(need - s.level, s.cap)
    return 1, math.max(0, (s.t + ticks) * s.tick - now)
  elseif s.kind == 'W' then
    if s.used + amt <= s.cap then return nil end
    if amt > s.cap then return 2, 0 end
    return 1, math.max(0, s.wend - now)
  end
  if s.held + amt <= s.cap then return nil end
  if amt > s.cap then return 2, 0 end
  return 0, 0
end

-- limit, remaining (never negative), reset (us).
local function figures(s, now)
  if s.kind == 'T' then
    local full = s.cap * s.per
    local reset = 0
    if s.level < full then
      reset = math.max(0, (s.t + ceil_div(full - s.level, math.max(s.cap, 1))) * s.tick - now)
    end
    return s.cap, math.max(0, math.floor(s.level / s.per)), reset
  elseif s.kind == 'W' then
    return s.cap, math.max(0, s.cap - s.used), math.max(0, s.wend - now)
  end
  return s.cap, math.max(0, s.cap - s.held), 0
end
