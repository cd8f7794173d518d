-- consume (scheme 1): an unexpired `pending` token disappears; whoever deletes it wins.
-- KEYS[1] token hash. Returns 1 consumed, 0 not pending (absent, processing, completed).
local h = redis.call('HMGET', KEYS[1], 'status', 'expires_at_ms')
if h[1] ~= 'pending' then
  return 0
end
local expires_at = tonumber(h[2])
if expires_at == nil then
  return redis.error_reply('CORRUPT pending token without expires_at_ms')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Redis keeps a key for the millisecond of its deadline; the token is already over.
if expires_at <= now then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
