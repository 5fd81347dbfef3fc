-- undo: take back a check whose answer the router may no longer be waiting for
-- (its results were ready only after the batch's deadline). Nothing of it stays:
-- the counters get back what it consumed and its idempotency record (with its
-- hold) is dropped, so the router may send the check again as a new decision. A check
-- with a record is given back only where its record is, and only while no replay of
-- it was answered (a router that gave up on the first answer sends the check again,
-- and that replay's answer may reach the client first).
-- KEYS: counter key per limit, then (when has_record) the idempotency record key
--       and the node's holds set.
-- ARGV: offset_us, n, has_record (0/1), then per limit 8 values (algorithm code, amount, p1..p6),
--       then the undo entries batch.lua returned (cmsgpack), or "" to take them from the
--       record (the node lost the reply that carried them).
-- Returns the number of counters given back to.
-- Last KEY and ARGV: the shard's epoch fence (common.lua `fenced`, which answers instead).
local moved_on = fenced()
if moved_on then return moved_on end
local offset = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local record = false
if ARGV[3] == '1' then
  -- The record is written with the counts, in one script: without it, this Redis never
  -- held the check (it ran on a primary since failed over, before it replicated).
  local stored = redis.call('GET', KEYS[n + 1])
  if not stored then return 0 end
  record = cmsgpack.unpack(stored)
  -- Replayed since (batch.lua): a client may hold that answer, so the check stands.
  if record.replayed == 1 then return 0 end
end
local packed = ARGV[4 + n * 8]
local undo
if packed == '' then
  undo = record and record.undo or {}
else
  undo = cmsgpack.unpack(packed)
end
local t = clock(offset)
local given = 0
for i = 1, n do
  local key = KEYS[i]
  for _, u in ipairs(undo) do
    if u[1] == key then
      ALG[u[2]].refund(key, params(4 + (i - 1) * 8 + 2), t, u)
      given = given + 1
    end
  end
end
if record then
  if record.hold_entry then redis.call('ZREM', KEYS[n + 2], record.hold_entry) end
  redis.call('DEL', KEYS[n + 1])
end
return given
