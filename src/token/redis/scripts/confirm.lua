-- confirm: processing owned by (ARGV[1], ARGV[2]) becomes a completed tombstone.
-- KEYS[1] token hash; ARGV[1] owner, ARGV[2] fence, ARGV[3] payment id,
-- ARGV[4] fingerprint, ARGV[5] tombstone ttl ms. Returns 1 applied, 0 refused.
-- A settle is announced on the channel named like the key, for duplicates waiting on it.
local h = redis.call('HMGET', KEYS[1], 'status', 'owner', 'fence', 'payment_id')
if h[2] ~= ARGV[1] or tonumber(h[3]) ~= tonumber(ARGV[2]) then
  return 0
end
if h[1] == 'completed' then
  -- The same claim confirming the same payment again: a retry whose answer was lost.
  if h[4] == ARGV[3] then
    return 1
  end
  return 0
end
if h[1] ~= 'processing' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires_at = now + tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'status', 'completed', 'payment_id', ARGV[3],
  'fingerprint', ARGV[4], 'expires_at_ms', string.format('%d', expires_at))
redis.call('HDEL', KEYS[1], 'lease_until_ms')
redis.call('PEXPIREAT', KEYS[1], string.format('%d', expires_at))
redis.call('PUBLISH', KEYS[1], 'completed')
return 1
