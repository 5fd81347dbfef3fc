-- held_lease: renew or release one lease of a concurrency limit (concurrency.lua).
-- KEYS[1]: the limit's ZSET. ARGV: offset_us, action ('renew' | 'release'), the lease's
-- member ("<fencing>:<nonce>"), ttl_ms (renew: its new lifetime from now), keep_ms.
-- Returns {status, now_ms, ttl_ms}: status 0 not held (expired, released or never
-- granted: nothing changes), 1 renewed (it now expires ttl_ms from now_ms), 2 released.
-- now_ms is this Redis' clock.
local t = clock(tonumber(ARGV[1]))
local key, member = KEYS[1], ARGV[3]
local score = redis.call('ZSCORE', key, member)
if not score or tonumber(score) <= t.ms then
  if score then
    redis.call('ZREM', key, member)
    redis.call('INCR', 'sl|leases-expired')  -- node-local: cluster/model/keys.py
  end
  return { 0, t.ms, 0 }
end
if ARGV[2] == 'release' then
  redis.call('ZREM', key, member)
  return { 2, t.ms, 0 }
end
local ttl = tonumber(ARGV[4])
redis.call('ZADD', key, 'XX', fmt(t.ms + ttl), member)
redis.call('PEXPIRE', key, fmt(math.max(tonumber(ARGV[5]), ttl)))
return { 1, t.ms, ttl }
