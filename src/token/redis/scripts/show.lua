-- show: the token's fields plus the server clock and the key's PTTL, read in one step so
-- lease_left and ttl are consistent with each other.
-- KEYS[1] token hash. Returns false when absent, else
-- {status, owner, fence, lease_until_ms, expires_at_ms, payment_id, pttl_ms, now_ms}.
local h = redis.call('HMGET', KEYS[1], 'status', 'owner', 'fence', 'lease_until_ms',
  'expires_at_ms', 'payment_id')
if h[1] == false then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return redis.error_reply('CORRUPT token hash without status')
  end
  return false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {h[1], h[2], h[3], h[4], h[5], h[6], redis.call('PTTL', KEYS[1]), now}
