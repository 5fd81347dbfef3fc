-- concurrency: p = {limit, lease_ms, keep_ms, nonce}. State: one ZSET per (rule, key):
-- each held lease is a member "<fencing>:<nonce>" scored by its expiry (Unix ms on this
-- Redis' clock), and the member "f" is scored by minus the last fencing value granted
-- (negative: never taken for a lease, never pruned). An expired lease is pruned at the
-- next look. The key lives keep_ms after the last grant or renewal, so fencing grows
-- strictly over the key's life, and moves with it (one Redis key, named as counters are).
-- Its row differs from the other algorithms' (router/decide/answers.py reads it): the
-- limit slot holds the leases held (after the check, when it acquired; the router takes
-- the limit from the rule); reset = ms until the earliest held lease expires (0: none
-- held), retry the same when denied; when it acquired, the delay slot holds the
-- acquisition time (Unix ms), max_amount the fencing value, amount_remaining the nonce.
-- An undo entry names the lease's member: a refund or an undo releases the lease.
local CC_FENCING = 'f'
local CC_EXPIRED = 'sl|leases-expired'  -- node-local: cluster/model/keys.py

-- (leases held, ms until the first of them expires (0: none held), the last fencing
-- value granted). "f" has the lowest score, so the lease that expires first comes right
-- after it; expired leases are pruned only when that one has. With no lease held (the
-- common case) a look is ZCARD and ZSCORE, cheaper in Redis than a ZRANGE.
local function cc_look(key, t)
  local held = redis.call('ZCARD', key)
  local f = redis.call('ZSCORE', key, CC_FENCING)
  local last = 0
  if f then last, held = -tonumber(f), held - 1 end
  if held == 0 then return 0, 0, last end
  local at = f and 1 or 0
  local first = redis.call('ZRANGE', key, at, at, 'WITHSCORES')
  if tonumber(first[2]) <= t.ms then
    local expired = redis.call('ZREMRANGEBYSCORE', key, '0', fmt(t.ms))
    if expired > 0 then redis.call('INCRBY', CC_EXPIRED, expired) end
    held = held - expired
    if held == 0 then return 0, 0, last end
    first = redis.call('ZRANGE', key, at, at, 'WITHSCORES')
  end
  return held, tonumber(first[2]) - t.ms, last
end

-- Grant the lease "<last + 1>:<nonce>": its fencing value and member.
local function cc_grant(key, t, lease, keep, nonce, last)
  local fencing = last + 1
  local member = string.format('%d:%d', fencing, nonce)
  redis.call('ZADD', key, fmt(-fencing), CC_FENCING, fmt(t.ms + lease), member)
  redis.call('PEXPIRE', key, fmt(math.max(keep, lease)))
  return fencing, member
end

ALG[CODE] = {
  eval = function(key, p, t, cost, _amount)
    local limit, lease, keep, nonce = p[1], p[2], p[3], p[4]
    local held, soonest, last = cc_look(key, t)
    local want = cost > 0 and 1 or 0
    local after = soonest
    if want == 1 then
      after = (held == 0) and lease or math.min(soonest, lease)
    end
    local r = {
      ok = held + want <= limit,
      limit = held,
      rem_now = math.max(0, limit - held),
      rem_after = math.max(0, limit - held - want),
      reset_now = soonest,
      reset_after = after,
      retry = soonest,
      delay = -1, alimit = -1, arem_now = -1, arem_after = -1,
    }
    r.consumes = want == 1
    r.commit = function()
      local fencing, member = cc_grant(key, t, lease, keep, nonce, last)
      r.limit, r.delay, r.alimit, r.arem_after = held + 1, t.ms, fencing, nonce
      return { member }
    end
    return r
  end,
  -- A check of this one limit alone, without a record (batch.lua's common case): eval
  -- and commit in one step, its reply built at once, as batch.lua would build it.
  -- c: the check's packed entry, this limit's parameters from c[11].
  alone = function(key, c, t, cost, dry_run)
    local limit, lease = c[11], c[12]
    local held, soonest, last = cc_look(key, t)
    if cost == 0 then
      if held > limit then
        return { 0, 0, 1, 0, held, 0, soonest, soonest, -1, -1, -1 }
      end
      return { 1, 0, 1, 1, held, limit - held, soonest, -1, -1, -1, -1 }
    end
    if held + 1 > limit then
      return { 0, 0, 1, 0, held, math.max(0, limit - held), soonest, soonest, -1, -1, -1 }
    end
    local after = (held == 0) and lease or math.min(soonest, lease)
    if dry_run then
      return { 1, 0, 1, 1, held, limit - held - 1, after, -1, -1, -1, -1 }
    end
    local nonce = c[14]
    local fencing, member = cc_grant(key, t, lease, c[13], nonce, last)
    return { 1, 0, 1, 1, held + 1, limit - held - 1, after, -1, t.ms, fencing, nonce,
      cmsgpack.pack({ { key, CODE, member } }) }
  end,
  -- Release the lease the decision acquired, if it is still held (count 1, else 0).
  refund = function(key, _p, t, u)
    local score = redis.call('ZSCORE', key, u[3])
    if not score then return 0, 0 end
    redis.call('ZREM', key, u[3])
    if tonumber(score) <= t.ms then return 0, 0 end
    return 1, 0
  end,
  -- Renew or release one held lease (batch.lua's lease entries): c = {-1, CODE, action
  -- (1 release, 2 renew), member "<fencing>:<nonce>", ttl_ms (renew: its new lifetime
  -- from now), keep_ms}. {status, now_ms, ttl_ms}: status 0 not held (expired, released or
  -- never granted: nothing changes but the pruning of an expired one), 1 renewed (it
  -- now expires ttl_ms from now_ms), 2 released. now_ms is this Redis' clock.
  held = function(key, c, t)
    local member = c[4]
    local score = redis.call('ZSCORE', key, member)
    if not score or tonumber(score) <= t.ms then
      if score then
        redis.call('ZREM', key, member)
        redis.call('INCR', CC_EXPIRED)
      end
      return { 0, t.ms, 0 }
    end
    if c[3] == 1 then
      redis.call('ZREM', key, member)
      return { 2, t.ms, 0 }
    end
    local ttl = c[5]
    redis.call('ZADD', key, 'XX', fmt(t.ms + ttl), member)
    redis.call('PEXPIRE', key, fmt(math.max(c[6], ttl)))
    return { 1, t.ms, ttl }
  end,
}
