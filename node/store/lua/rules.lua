-- rules: store the cluster's rules document if it is newer than the one held.
-- KEYS[1] the rules hash (cluster/model/keys.py RULES_KEY). ARGV: version, document (JSON).
-- Versions only grow: a write of an older or equal version changes nothing.
-- Returns {stored (1/0), the version held afterwards}.
local held = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
local version = tonumber(ARGV[1])
if version <= held then return { 0, held } end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'doc', ARGV[2])
return { 1, version }
