-- adjust: restock or set a quota counter, once per request_id.
-- KEYS: the counter key, then the adjustment's idempotency record key.
-- ARGV: offset_us, record_ttl_ms, then the limit's 8 values (algorithm code, amount,
--       p1..p6), then count_mode, count, amount_mode, amount (see quota.lua's adjust).
-- Returns {status, limit, remaining, reset_after_ms, max_amount, amount_remaining}
-- (-1 for "none"); status 1 applied, 2 the same adjustment was already applied (its
-- first answer), 3 the request_id was used for another adjustment (or a check),
-- 4 the quota is over (expires_at passed), nothing applied.
-- Last KEY and ARGV: the shard's epoch fence (common.lua `fenced`, which answers instead).
local moved_on = fenced()
if moved_on then return moved_on end
local offset = tonumber(ARGV[1])
local record_ttl = tonumber(ARGV[2])
local code = tonumber(ARGV[3])
local a = { tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14]) }
local fingerprint = ARGV[11] .. ':' .. ARGV[12] .. ':' .. ARGV[13] .. ':' .. ARGV[14]

local stored = redis.call('GET', KEYS[2])
if stored then
  local record = cmsgpack.unpack(stored)
  if record.adjust ~= fingerprint then return { 3 } end
  local out = record.result
  out[1] = 2
  return out
end
local row = ALG[code].adjust(KEYS[1], params(5), clock(offset), a)
if row == nil then return { 4 } end
local out = { 1, row[1], row[2], row[3], row[4], row[5] }
redis.call('SET', KEYS[2], cmsgpack.pack({ adjust = fingerprint, result = out }), 'PX', record_ttl)
return out
