-- commit: make a held decision final (second phase of an all-or-nothing batch).
-- KEYS: the idempotency record, the node's holds set, the shard's epoch fence.
-- ARGV: the topology epoch the caller placed the record by: {-4, the shard's epoch},
-- nothing done, when an endpoint of the shard adopted a newer one (common.lua `fenced`).
-- Returns 1 if the decision was held and is now final, 0 if there is no such
-- decision or it is no longer held (the sweeper already gave it back: the
-- caller must then roll the whole batch back).
-- A hold of a batch stays in the holds set until it runs out: its sweeper then
-- tells the batch's coordinator that it is settled (node/holds/keeper.py), which is
-- what lets the coordinator's "commit" record expire. A hold without a batch has
-- nobody to tell and leaves the set now.
local shard = redis.call('GET', KEYS[3])
if shard and tonumber(shard) > tonumber(ARGV[1]) then return { -4, tonumber(shard) } end
local stored = redis.call('GET', KEYS[1])
if not stored then return 0 end
local record = cmsgpack.unpack(stored)
if record.held ~= 1 or record.refunded == 1 then return 0 end
record.held = 0
if record.hold_entry then
  local ok, hold = pcall(cjson.decode, record.hold_entry)
  if not (ok and type(hold) == 'table' and hold.b) then
    redis.call('ZREM', KEYS[2], record.hold_entry)
  end
end
record.hold_entry = nil
redis.call('SET', KEYS[1], cmsgpack.pack(record), 'KEEPTTL')
return 1
