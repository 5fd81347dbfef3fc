-- keep_topology: an endpoint of the shard adopts a topology. It is kept, and the shard's
-- epoch fence raised to its epoch, both at once, unless an endpoint of the shard
-- already adopted a newer one: the fence never goes back.
-- KEYS: the kept topology (JSON), the shard's epoch fence. ARGV: epoch, topology JSON.
-- Returns {1} when kept, else {0, the shard's epoch, the topology the shard keeps}.
local epoch = tonumber(ARGV[1])
local shard = redis.call('GET', KEYS[2])
if shard and tonumber(shard) > epoch then
  return { 0, tonumber(shard), redis.call('GET', KEYS[1]) }
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1])
return { 1 }
