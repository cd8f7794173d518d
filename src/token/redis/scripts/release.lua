-- release (scheme 2): delete the lock only while `owner` still holds it, so a holder
-- whose lock expired cannot free somebody else's.
-- KEYS[1] lock key; ARGV[1] owner. Returns 1 released, 0 not the holder.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
