-- held_lease: renew or release leases of concurrency limits (concurrency.lua), every
-- renewal and release of one batch in one call. KEYS[i]: the limit's ZSET of lease i.
-- ARGV[1]: offset_us; then four per lease, from ARGV[2 + 4 * (i - 1)]: action ('renew'
-- | 'release'), the lease's member ("<fencing>:<nonce>"), ttl_ms (renew: its new
-- lifetime from now), keep_ms.
-- Returns per lease {status, now_ms, ttl_ms}: status 0 not held (expired, released or
-- never granted: nothing changes), 1 renewed (it now expires ttl_ms from now_ms), 2
-- released. now_ms is this Redis' clock.
local t = clock(tonumber(ARGV[1]))
local out = {}
for i, key in ipairs(KEYS) do
  local at = 2 + 4 * (i - 1)
  local member = ARGV[at + 1]
  local score = redis.call('ZSCORE', key, member)
  if not score or tonumber(score) <= t.ms then
    if score then
      redis.call('ZREM', key, member)
      redis.call('INCR', 'sl|leases-expired')  -- node-local: cluster/model/keys.py
    end
    out[i] = { 0, t.ms, 0 }
  elseif ARGV[at] == 'release' then
    redis.call('ZREM', key, member)
    out[i] = { 2, t.ms, 0 }
  else
    local ttl = tonumber(ARGV[at + 2])
    redis.call('ZADD', key, 'XX', fmt(t.ms + ttl), member)
    redis.call('PEXPIRE', key, fmt(math.max(tonumber(ARGV[at + 3]), ttl)))
    out[i] = { 1, t.ms, ttl }
  end
end
return out
