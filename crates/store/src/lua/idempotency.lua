-- Idempotency keys shared by replicas: KEYS[1] the key's hash {fp, state, owner, status,
-- headers, body}; ARGV[1] operation.
--   'claim', fingerprint, owner, in-flight ttl (ms): a new key is taken (state 'F', owned by
--     the caller) and {'run'} returned; otherwise {'reused'} for another fingerprint, the
--     state 'F' (in flight elsewhere) or 'S' (was a stream), or {'done', status, headers,
--     body} for a stored answer.
--   'done', owner, ttl (ms), status, headers, body: stores the answer (only the owner may).
--   'streamed', owner, ttl (ms): marks the key as a stream, not to be sent again.
--   'forget', owner: removes an in-flight marker the caller owns (its request failed).
local op = ARGV[1]
if op == 'claim' then
  local v = redis.call('HMGET', KEYS[1], 'fp', 'state')
  if not v[1] then
    redis.call('HSET', KEYS[1], 'fp', ARGV[2], 'state', 'F', 'owner', ARGV[3])
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
    return { 'run' }
  end
  if v[1] ~= ARGV[2] then return { 'reused' } end
  if v[2] == 'D' then
    local d = redis.call('HMGET', KEYS[1], 'status', 'headers', 'body')
    return { 'done', d[1], d[2], d[3] }
  end
  return { v[2] }
end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner ~= ARGV[2] then return { 'not_owner' } end
if op == 'done' then
  redis.call('HSET', KEYS[1], 'state', 'D', 'status', ARGV[4], 'headers', ARGV[5], 'body', ARGV[6])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
elseif op == 'streamed' then
  redis.call('HSET', KEYS[1], 'state', 'S')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
elseif op == 'forget' then
  if redis.call('HGET', KEYS[1], 'state') == 'F' then redis.call('DEL', KEYS[1]) end
end
return { 'ok' }
