-- settled: holds of a batch report that they are settled (committed or given back).
-- KEYS: the decision record, the batch's pending-holds set, the hand-over fence.
-- ARGV: ttl_ms, then hold ids.
-- Returns how many holds of the batch are still unsettled. When none is left the
-- decision record gets its expiry (ttl_ms): from then on nothing needs it.
-- Returns -1 once the records were handed to a successor (the report goes there).
if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
for i = 2, #ARGV do redis.call('SREM', KEYS[2], ARGV[i]) end
local left = redis.call('SCARD', KEYS[2])
if left == 0 and redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
end
return left
