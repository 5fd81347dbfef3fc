-- lease: a lock with an owner token and a TTL, for serialising topology changes.
-- KEYS[1] lock key. ARGV: action ('acquire' | 'renew' | 'release'), token, ttl_ms.
-- acquire: SET NX PX; renew and release only act if the caller still holds it.
local action, token, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
if action == 'acquire' then
  if redis.call('SET', KEYS[1], token, 'NX', 'PX', ttl) then return 1 end
  if redis.call('GET', KEYS[1]) == token then
    redis.call('PEXPIRE', KEYS[1], ttl)
    return 1
  end
  return 0
end
if redis.call('GET', KEYS[1]) ~= token then return 0 end
if action == 'renew' then
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('DEL', KEYS[1])
end
return 1
