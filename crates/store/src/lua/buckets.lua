-- Shared bucket arithmetic of the quota store's scripts (prepended to each script).
--
-- Every bucket is described by a group of GROUP arguments starting at ARGV[b]:
--   b+0 kind as a character code: 84 'T' token bucket, 87 'W' fixed window, 67 'C' concurrency
--   b+1 amount (figures: the reported reset; the batched scripts pass amounts per item)
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

-- Loads every bucket of `wanted` (a list of {name, b}: the bucket's name and the ARGV index
-- of its argument group; a name listed twice is loaded once, from its first group) with one
-- HMGET of the state hash for the token and window buckets. Returns name -> state, so that
-- the items of one batch that share a bucket debit and credit the same state in turn.
local function load_many(state, wanted, now)
  local names, bs, seen = {}, {}, {}
  for _, w in ipairs(wanted) do
    if not seen[w.name] then
      seen[w.name] = true
      names[#names + 1] = w.name
      bs[#bs + 1] = w.b
    end
  end
  local stored, ask = {}, {}
  for j = 1, #names do
    if KIND[ARGV[bs[j]]] ~= 'C' then ask[#ask + 1] = names[j] end
  end
  if #ask > 0 then
    local r = redis.call('HMGET', state, unpack(ask))
    for j = 1, #ask do
      if r[j] then stored[ask[j]] = r[j] end
    end
  end
  local states = {}
  for j = 1, #names do
    states[names[j]] = load(names[j], stored[names[j]], bs[j], now)
  end
  return states
end

-- Writes back every token or window state of `states` (name -> state) marked `changed`, in
-- one HSET.
local function save_many(state, states)
  local args = {}
  for _, s in pairs(states) do
    if s.changed and s.kind ~= 'C' then
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

-- The buckets and items of a batched script. Each distinct bucket is described once per batch:
--   KEYS[1] the state hash, KEYS[2..B+1] the bucket names, then per item its reservation
--   record and its tombstone;
--   ARGV[1] items m, ARGV[2] buckets B, then B groups of GROUP arguments (their amount slot
--   unused), then per item: n, the reservation id, one number (a ttl in ms), and n pairs
--   (bucket index 1..B, amount).
-- Returns the buckets as a list of {name, b} (b: ARGV index of the group, as `load_many`
-- takes) and the items, each with `refs`: its n buckets with their amounts.
local function batch_items()
  local nb = tonumber(ARGV[2])
  local buckets = {}
  for i = 1, nb do
    buckets[i] = { name = KEYS[1 + i], b = 3 + (i - 1) * GROUP }
  end
  local items = {}
  local k, a = 2 + nb, 3 + nb * GROUP
  for j = 1, tonumber(ARGV[1]) do
    local n = tonumber(ARGV[a])
    local refs = {}
    for i = 1, n do
      local p = a + 3 + 2 * (i - 1)
      refs[i] = { bucket = buckets[tonumber(ARGV[p])], amount = tonumber(ARGV[p + 1]) }
    end
    items[j] = {
      n = n, rid = ARGV[a + 1], ms = tonumber(ARGV[a + 2]),
      rec = KEYS[k], tomb = KEYS[k + 1], refs = refs,
    }
    k = k + 2
    a = a + 3 + 2 * n
  end
  return buckets, items
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
