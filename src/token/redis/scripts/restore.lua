-- restore: processing owned by (ARGV[1], ARGV[2]) goes back to pending with the token's
-- ORIGINAL deadline; a token whose deadline already passed is deleted instead.
-- KEYS[1] token hash; ARGV[1] owner, ARGV[2] fence. Returns 1 applied, 0 refused.
-- A settle is announced on the channel named like the key, for duplicates waiting on it.
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
if expires_at <= now then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[1], 'deleted')
  return 1
end
-- The holder is kept as previous_owner: the next reservation tells its caller who
-- held the token last (reserve.lua), so an attempt can tell its own restore from a
-- stranger's, whose charge it cannot know.
redis.call('HSET', KEYS[1], 'status', 'pending', 'previous_owner', ARGV[1])
redis.call('HDEL', KEYS[1], 'owner', 'lease_until_ms')
redis.call('PEXPIREAT', KEYS[1], string.format('%d', expires_at))
redis.call('PUBLISH', KEYS[1], 'pending')
return 1
