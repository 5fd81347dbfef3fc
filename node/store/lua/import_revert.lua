-- import_revert: hand keys back to their owner when a migration is aborted.
-- KEYS: the aborting migration's marker index (as in import.lua), then pairs (redis
-- key, import marker of the aborting migration).
-- ARGV: marker_ttl_ms, then per pair: dump ('' for none), absolute expiry in ms
-- (-1: none), authoritative (1: the sender's copy is the current one, absence
-- included; 0: the sender never held it, the copy here is current).
-- Unlike import.lua a key present here is replaced: it may be the frozen copy the
-- aborted migration left behind while the other node counted on. The marker makes
-- it happen at most once: after it, this node's copy is the current one.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local marker_ttl = tonumber(ARGV[1])
local index = KEYS[1]
local restored = 0
local marked = 0
for i = 2, #KEYS, 2 do
  local key, marker = KEYS[i], KEYS[i + 1]
  local j = 2 + 3 * ((i - 2) / 2)
  local dump, expiry, authoritative = ARGV[j], tonumber(ARGV[j + 1]), ARGV[j + 2]
  if redis.call('EXISTS', marker) == 0 then
    if authoritative == '1' then
      if dump ~= '' and (expiry < 0 or expiry > now) then
        local ttl = 0
        if expiry >= 0 then ttl = expiry - now end
        redis.call('RESTORE', key, ttl, dump, 'REPLACE')
        restored = restored + 1
      else
        redis.call('DEL', key)
      end
    end
    redis.call('SET', marker, '1', 'PX', marker_ttl)
    redis.call('SADD', index, marker)
    marked = marked + 1
  end
end
if marked > 0 then redis.call('PEXPIRE', index, marker_ttl) end
return restored
