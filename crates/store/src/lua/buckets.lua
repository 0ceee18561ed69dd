-- Shared bucket arithmetic of the quota store's scripts (prepended to each script).
--
-- Every bucket is described by a group of GROUP arguments starting at ARGV[b]:
--   b+0 kind as a character code: 84 'T' token bucket, 87 'W' fixed window, 67 'C' concurrency
--   b+1 amount (reserve: units to debit; settle: units really used, -1 = keep the estimate)
--   b+2 capacity (units per period / window, or concurrency limit)
--   T: b+3 period in ticks, b+4 tick in microseconds
--   W: b+3 epoch of the window containing the caller's wall clock, b+4 its end (us),
--      b+5 epoch of the next window, b+6 its end (us); b+7 period (us), to notice a change
-- Token and window states are fields of one hash (the bucket's name is the field, so one
-- HMGET reads every bucket of a reservation and one HSET writes them back):
--   'T,capacity,period,tick,level,time'   level in unit-ticks, time in ticks
--   'W,capacity,period,used,epoch,end'    end in us
-- A concurrency bucket is a sorted set of reservation ids scored by expiry (its own key).
-- Numbers are Lua doubles: integers are exact below 2^53, and the caller picks the tick so
-- that capacity x period-in-ticks stays below it. Every value is an integer; Lua's tostring
-- keeps only 14 digits, so states are written with '%d' (a 64-bit integer in Redis's Lua),
-- and numbers passed to redis.call are written exactly by Redis.

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

local function fields(v)
  return { string.match(v, '^(%a),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)$') }
end

-- The bucket named `name` described by the group at ARGV[b], from its stored value `v`
-- (nil when new), brought to `now`.
local function load(name, v, b, now)
  local kind = KIND[ARGV[b]]
  local s = { kind = kind, key = name, cap = tonumber(ARGV[b + 2]) }
  if kind == 'C' then
    redis.call('ZREMRANGEBYSCORE', name, '-inf', now)
    s.held = redis.call('ZCARD', name)
    return s
  end
  local h = v and fields(v) or {}
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
  s.used, s.e, s.wend = tonumber(h[4]), tonumber(h[5]), tonumber(h[6])
  if tonumber(h[3]) ~= s.period then
    -- A new window length: fresh boundaries, consumption kept.
    s.e, s.wend = we, wend
  elseif now >= s.wend and we > s.e then
    -- The stored window is over; never reopen an older one (a lagging caller's clock).
    s.e, s.wend, s.used = we, wend, 0
  end
  return s
end

-- Loads buckets 1..n named KEYS[first..first+n-1] (those with only[i], when given) with one
-- HMGET of the state hash.
local function load_all(state, first, n, now, only)
  local names, idx = {}, {}
  for i = 1, n do
    if KIND[ARGV[4 + (i - 1) * GROUP]] ~= 'C' and (not only or only[i]) then
      names[#names + 1] = KEYS[first + i - 1]
      idx[#idx + 1] = i
    end
  end
  local values = {}
  if #names > 0 then
    local r = redis.call('HMGET', state, unpack(names))
    for j = 1, #idx do
      if r[j] then values[idx[j]] = r[j] end
    end
  end
  local states = {}
  for i = 1, n do
    if not only or only[i] then
      states[i] = load(KEYS[first + i - 1], values[i], 4 + (i - 1) * GROUP, now)
    end
  end
  return states
end

-- Writes back every token or window state marked `changed`, in one HSET.
local function save_all(state, states, n)
  local args = {}
  for i = 1, n do
    local s = states[i]
    if s and s.changed then
      args[#args + 1] = s.key
      if s.kind == 'T' then
        args[#args + 1] = string.format('T,%d,%d,%d,%d,%d', s.cap, s.per, s.tick, s.level, s.t)
      else
        args[#args + 1] = string.format('W,%d,%d,%d,%d,%d', s.cap, s.period, s.used, s.e, s.wend)
      end
    end
  end
  if #args > 0 then redis.call('HSET', state, unpack(args)) end
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
