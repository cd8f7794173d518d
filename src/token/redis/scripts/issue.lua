-- issue: mint a `pending` token only when the key is absent (SET NX EX semantics).
-- KEYS[1] token hash; ARGV[1] ttl in ms. Returns 1 created, 0 already there.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires_at = now + tonumber(ARGV[1])
-- fence 0: the first reservation of an issued token is fence 1, as for an implicit one.
redis.call('HSET', KEYS[1], 'status', 'pending', 'fence', '0',
  'expires_at_ms', string.format('%d', expires_at))
redis.call('PEXPIREAT', KEYS[1], string.format('%d', expires_at))
return 1
