-- import: install Redis keys copied from their previous owner, each at most once.
-- KEYS: the migration's marker index (a set of its markers, so that dropping them
-- costs what was imported, not a scan of every key), then pairs (redis key, import
-- marker). ARGV: marker_ttl_ms, then per pair:
-- dump ('' when the source had no such key), absolute expiry in ms (-1: none).
-- A key is restored only if no marker says it was imported already and the
-- key is absent here; the marker is set either way. Idempotent: a resumed or
-- concurrent import of the same key changes nothing.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local marker_ttl = tonumber(ARGV[1])
local index = KEYS[1]
local restored = 0
local marked = 0
for i = 2, #KEYS, 2 do
  local key, marker = KEYS[i], KEYS[i + 1]
  local j = i  -- ARGV[1] is the TTL, then two per pair
  local dump, expiry = ARGV[j], tonumber(ARGV[j + 1])
  if redis.call('EXISTS', marker) == 0 then
    if dump ~= '' and redis.call('EXISTS', key) == 0 and (expiry < 0 or expiry > now) then
      local ttl = 0
      if expiry >= 0 then ttl = expiry - now end
      redis.call('RESTORE', key, ttl, dump)
      restored = restored + 1
    end
    redis.call('SET', marker, '1', 'PX', marker_ttl)
    redis.call('SADD', index, marker)
    marked = marked + 1
  end
end
if marked > 0 then redis.call('PEXPIRE', index, marker_ttl) end
return restored
