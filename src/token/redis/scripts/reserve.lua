-- reserve (scheme 3): pending, or processing with an expired lease, becomes processing
-- for ARGV[1] under fence + 1; an unknown key is created (implicit) or reported missing.
-- KEYS[1] token hash; ARGV[1] owner, ARGV[2] lease ms, ARGV[3] '1' implicit / '0' issued,
-- ARGV[4] ttl ms of an implicitly created token, ARGV[5] ms a processing token outlives
-- its deadline and lease as a tombstone (issued mode: the completed TTL; else 0),
-- ARGV[6] the owner of the caller's own earlier reservation whose answer never came
-- back ('' for none): a token it still holds is taken at once, its lease live or not
-- (that attempt ended without doing anything with it).
-- Returns {'reserved', fence, predecessor[, owner]} | {'inflight', lease_left_ms} |
--         {'completed', payment_id, fingerprint} | {'missing'} | {'unsettled'}.
-- predecessor: 'nobody' (a new token, or an issued one never reserved), 'holder' and
-- the owner who held it last (restored it, or let its lease run out: a takeover), or
-- 'unknown' (held before, by whom not kept). A holder the caller does not know may
-- have charged: the caller treats its outcome as unknown.
local key = KEYS[1]
local owner = ARGV[1]
local implicit = ARGV[3] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_until = now + tonumber(ARGV[2])

local h = redis.call('HMGET', key, 'status', 'fence', 'lease_until_ms', 'expires_at_ms',
  'payment_id', 'fingerprint', 'owner', 'previous_owner')
local status = h[1]
local fence = 0
local expires_at
-- processing: the holder whose lease ran out; pending: who restored it (restore.lua).
local previous = false

if status == false then
  if redis.call('EXISTS', key) == 1 then
    return redis.error_reply('CORRUPT token hash without status')
  end
  if not implicit then
    return {'missing'}
  end
  expires_at = now + tonumber(ARGV[4])
elseif status == 'completed' then
  return {'completed', h[5], h[6]}
else
  fence = tonumber(h[2])
  expires_at = tonumber(h[4])
  if fence == nil or expires_at == nil then
    return redis.error_reply('CORRUPT token without fence or expires_at_ms')
  end
  if status == 'processing' then
    local held_until = tonumber(h[3])
    if held_until == nil then
      return redis.error_reply('CORRUPT processing token without lease_until_ms')
    end
    if held_until > now and h[7] ~= ARGV[6] then
      return {'inflight', held_until - now}
    end
    previous = h[7]
  elseif status == 'pending' then
    previous = h[8]
  else
    return redis.error_reply('CORRUPT token status ' .. tostring(status))
  end
  -- The token's own life is over; it only lingered because a lease ran past it.
  if expires_at <= now then
    if not implicit then
      -- Issued: it expired while an attempt held it. That attempt may have charged,
      -- or its request may still land: the tombstone is left as it is, and the
      -- caller looks the charge up instead of taking the token for missing.
      if status == 'processing' then
        return {'unsettled'}
      end
      return {'missing'}
    end
    expires_at = now + tonumber(ARGV[4])
  end
end

fence = fence + 1
redis.call('HSET', key, 'status', 'processing', 'owner', owner,
  'fence', string.format('%d', fence),
  'lease_until_ms', string.format('%d', lease_until),
  'expires_at_ms', string.format('%d', expires_at))
-- expires_at_ms keeps the token's own deadline for restore; the key itself must
-- outlive the lease, or the fence would restart from nothing mid-reservation, and in
-- issued mode the tombstone time after both (restore and confirm set their own).
redis.call('PEXPIREAT', key,
  string.format('%d', math.max(expires_at, lease_until) + (tonumber(ARGV[5]) or 0)))
if previous then
  return {'reserved', fence, 'holder', previous}
elseif fence == 1 then
  return {'reserved', fence, 'nobody'}
end
return {'reserved', fence, 'unknown'}
