-- Renew concurrency leases: KEYS come in pairs (reservation record, concurrency sorted set),
-- ARGV[1] lease (ms), ARGV[1 + i] the reservation id of pair i. A slot is renewed only while
-- its record exists (a settled or expired reservation is never brought back), and never past
-- the record's own expiry. A slot pruned while Redis was unreachable is added back, so a live
-- call keeps its slot across a short outage. Returns the number of slots renewed.
local lease = tonumber(ARGV[1])
local now = now_us()
local renewed = 0
for i = 1, #KEYS / 2 do
  local left = redis.call('PTTL', KEYS[2 * i - 1])
  if left > 0 then
    redis.call('ZADD', KEYS[2 * i], now + math.min(lease, left) * 1000, ARGV[1 + i])
    renewed = renewed + 1
  end
end
return renewed
