-- Publish a shared signal: KEYS[1] signals hash; ARGV[1] field ('pause|scope' or
-- 'breaker|provider'), ARGV[2] deadline (ms since the Unix epoch), ARGV[3] channel.
-- Keeps the later deadline (never shortens an active one), publishes only a change, and
-- prunes deadlines that have passed. Returns {changed, effective deadline ms}.
local field, untl = ARGV[1], tonumber(ARGV[2])
local now_ms = math.floor(now_us() / 1000)
local cur = tonumber(redis.call('HGET', KEYS[1], field) or '0')
if cur >= untl then return { 0, cur } end
redis.call('HSET', KEYS[1], field, ARGV[2])
redis.call('PUBLISH', ARGV[3], field .. '|' .. ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
for j = 1, #all, 2 do
  if tonumber(all[j + 1]) <= now_ms then redis.call('HDEL', KEYS[1], all[j]) end
end
return { 1, untl }
