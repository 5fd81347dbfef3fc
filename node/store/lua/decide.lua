-- decide: record an all-or-nothing batch's decision unless one stands (first wins).
-- KEYS: the decision record, the batch's pending-holds set, the hand-over fence.
-- ARGV: wanted ('commit' or 'abort'), ttl_ms, then the ids of the batch's holds
--       (only with 'commit', from the router: the checks that consumed).
-- Returns the decision that stands, or 'fenced' once this node handed its records
-- to a successor (it left the cluster): it records nothing more, so no late abort
-- can contradict a commit the successor holds.
-- A "commit" that names holds has NO expiry: it lives until every one of them
-- reported itself settled (settled.lua), so a node that could not reach this
-- coordinator for hours still learns "commit", never a fresh "abort". An "abort"
-- may expire: once the holds ran out no router can commit any more, and a
-- sweeper asking again records "abort" again.
if redis.call('EXISTS', KEYS[3]) == 1 then return 'fenced' end
local stored = redis.call('GET', KEYS[1])
if stored then return stored end
local wanted = ARGV[1]
if wanted == 'commit' and #ARGV > 2 then
  redis.call('SET', KEYS[1], wanted)
  redis.call('DEL', KEYS[2])
  for i = 3, #ARGV do redis.call('SADD', KEYS[2], ARGV[i]) end
else
  redis.call('SET', KEYS[1], wanted, 'PX', tonumber(ARGV[2]))
end
return wanted
