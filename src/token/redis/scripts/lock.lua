-- lock (scheme 2): SET NX PX with the owner as value.
-- KEYS[1] lock key; ARGV[1] owner, ARGV[2] ttl in ms. Returns 1 acquired, 0 held.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
