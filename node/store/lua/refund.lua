-- refund: give back exactly what one recorded decision consumed, once.
-- KEYS: the idempotency record key, then the counter key of each current limit.
-- ARGV: offset_us, n, void (1 = a rollback: replays of the request then answer "rolled
--       back", with what was left after it, and a refund finds nothing consumed), then per
--       limit 8 values (algorithm code, amount, p1..p6), then only_held (1 = the hold
--       sweeper: act only on a decision still held).
-- Returns {status, n, then per limit: count given back, amount given back};
-- status 1 refunded, 0 no such decision, 2 already refunded, 3 consumed nothing,
-- 4 not held (committed) and only_held was asked, 5 it consumed from none of these
-- counters (other inline limits than the check's, or every window of its rule changed
-- since): nothing is given back and the decision stays refundable.
-- Last KEY and ARGV: the shard's epoch fence (common.lua `fenced`, which answers instead).
local moved_on = fenced()
if moved_on then return moved_on end
local offset = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local void = ARGV[3] == '1'

local stored = redis.call('GET', KEYS[1])
if not stored then return { 0, n } end
local record = cmsgpack.unpack(stored)
if ARGV[4 + n * 8] == '1' and record.held ~= 1 then return { 4, n } end
if record.refunded == 1 then return { 2, n } end
if #record.undo == 0 then return { 3, n } end

local named = {}
for i = 1, n do named[KEYS[i + 1]] = true end
local matched = false
for _, u in ipairs(record.undo) do
  if named[u[1]] then matched = true end
end
if not matched then return { 5, n } end

local t = clock(offset)
local out = { 1, n }
for i = 1, n do
  local key = KEYS[i + 1]
  local base = 4 + (i - 1) * 8
  local count, amount = 0, 0
  for _, u in ipairs(record.undo) do
    -- A limit whose shape changed since the decision has a new counter key and
    -- nothing to give back; the old counter expires on its own.
    if u[1] == key then
      count, amount = ALG[u[2]].refund(key, params(base + 2), t, u)
    end
  end
  out[#out + 1] = count
  out[#out + 1] = amount
end
record.held = 0
if void then
  -- The decision's rows, as its limits stand after the rollback (the refund's limits are
  -- the check's, in its order); it consumed nothing now.
  local result = record.result
  result[1] = 2
  for i = 1, math.min(n, result[3]) do
    local k = 3 + (i - 1) * 8
    if result[k + 3] >= 0 then result[k + 3] = result[k + 3] + out[1 + 2 * i] end
    if result[k + 8] >= 0 then result[k + 8] = result[k + 8] + out[2 + 2 * i] end
  end
  record.undo = {}
else
  record.refunded = 1
end
redis.call('SET', KEYS[1], cmsgpack.pack(record), 'KEEPTTL')
return out
