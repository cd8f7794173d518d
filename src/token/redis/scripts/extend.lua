-- extend: processing owned by (ARGV[1], ARGV[2]) gets lease_until = now + ARGV[3] ms,
-- and the key is kept alive at least that long.
-- KEYS[1] token hash; ARGV[1] owner, ARGV[2] fence, ARGV[3] lease ms, ARGV[4] ms the key
-- outlives deadline and lease as a tombstone (issued mode; else 0), as reserve sets it.
-- Returns 1 applied, 0 refused.
local h = redis.call('HMGET', KEYS[1], 'status', 'owner', 'fence', 'expires_at_ms')
if h[1] ~= 'processing' or h[2] ~= ARGV[1] or tonumber(h[3]) ~= tonumber(ARGV[2]) then
  return 0
end
local expires_at = tonumber(h[4])
if expires_at == nil then
  return redis.error_reply('CORRUPT processing token without expires_at_ms')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_until = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'lease_until_ms', string.format('%d', lease_until))
redis.call('PEXPIREAT', KEYS[1],
  string.format('%d', math.max(expires_at, lease_until) + (tonumber(ARGV[4]) or 0)))
return 1
