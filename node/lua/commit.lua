-- commit: make a held decision final (second phase of an all-or-nothing batch).
-- KEYS: the idempotency record, the node's holds set.
-- Returns 1 if the decision was held and is now final, 0 if there is no such
-- decision or it is no longer held (the sweeper already gave it back: the
-- caller must then roll the whole batch back).
local stored = redis.call('GET', KEYS[1])
if not stored then return 0 end
local record = cmsgpack.unpack(stored)
if record.held ~= 1 or record.refunded == 1 then return 0 end
record.held = 0
if record.hold_entry then redis.call('ZREM', KEYS[2], record.hold_entry) end
record.hold_entry = nil
redis.call('SET', KEYS[1], cmsgpack.pack(record), 'KEEPTTL')
return 1
