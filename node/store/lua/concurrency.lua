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
-- value granted): "f" has the lowest score, so it is first when present.
local function cc_look(key, t)
  local expired = redis.call('ZREMRANGEBYSCORE', key, '0', fmt(t.ms))
  if expired > 0 then redis.call('INCRBY', CC_EXPIRED, expired) end
  local held = redis.call('ZCARD', key)
  local head = redis.call('ZRANGE', key, 0, 1, 'WITHSCORES')
  local last, at = 0, 2
  if head[1] == CC_FENCING then
    last, held, at = -tonumber(head[2]), held - 1, 4
  end
  local soonest = 0
  if head[at] then soonest = tonumber(head[at]) - t.ms end
  return held, soonest, last
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
      local fencing = last + 1
      local member = fmt(fencing) .. ':' .. fmt(nonce)
      redis.call('ZADD', key, fmt(-fencing), CC_FENCING, fmt(t.ms + lease), member)
      redis.call('PEXPIRE', key, fmt(math.max(keep, lease)))
      r.limit, r.delay, r.alimit, r.arem_after = held + 1, t.ms, fencing, nonce
      return { member }
    end
    return r
  end,
  -- Release the lease the decision acquired, if it is still held (count 1, else 0).
  refund = function(key, _p, t, u)
    local score = redis.call('ZSCORE', key, u[3])
    if not score then return 0, 0 end
    redis.call('ZREM', key, u[3])
    if tonumber(score) <= t.ms then return 0, 0 end
    return 1, 0
  end,
}
