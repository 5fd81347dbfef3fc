-- sliding_log: p = {limit, window_ms}. A sorted set of one member per admitted
-- unit, scored by admission time in microseconds; the window is (now - window, now].
local function log_member(base, j)
  return fmt(base) .. '-' .. fmt(j)
end

ALG[CODE] = {
  eval = function(key, p, t, cost, _amount)
    local limit, win_us = p[1], p[2] * 1000
    redis.call('ZREMRANGEBYSCORE', key, '-inf', t.us - win_us)
    local used = redis.call('ZCARD', key)
    local newest = 0
    if used > 0 then
      newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    end
    local r = {
      ok = used + cost <= limit,
      limit = limit,
      rem_now = math.max(0, limit - used),
      rem_after = math.max(0, limit - used - cost),
      reset_now = used > 0 and ceil_div(newest + win_us - t.us, 1000) or 0,
      reset_after = (cost > 0) and p[2] or (used > 0 and ceil_div(newest + win_us - t.us, 1000) or 0),
      delay = -1, alimit = -1, arem_now = -1, arem_after = -1,
      retry = -1,
    }
    if not r.ok and cost <= limit then
      -- The (used + cost - limit) oldest entries must leave the window first.
      local k = used + cost - limit
      local entry = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
      r.retry = math.max(1, ceil_div(tonumber(entry[2]) + win_us - t.us, 1000))
    end
    r.consumes = cost > 0
    r.commit = function()
      -- Members are "<base>-<j>"; base starts at now and moves past any collision
      -- so that a refund can name exactly the members this decision added.
      local base = t.us
      while redis.call('ZSCORE', key, log_member(base, 1)) do
        base = base + 1
      end
      local args = {}
      for j = 1, cost do
        args[#args + 1] = t.us
        args[#args + 1] = log_member(base, j)
        if #args >= 1000 then
          redis.call('ZADD', key, unpack(args))
          args = {}
        end
      end
      if #args > 0 then redis.call('ZADD', key, unpack(args)) end
      redis.call('PEXPIRE', key, p[2])
      return { base, cost }
    end
    return r
  end,
  refund = function(key, _p, _t, u)
    local given = 0
    local members = {}
    for j = 1, u[4] do
      members[#members + 1] = log_member(u[3], j)
      if #members >= 1000 then
        given = given + redis.call('ZREM', key, unpack(members))
        members = {}
      end
    end
    if #members > 0 then given = given + redis.call('ZREM', key, unpack(members)) end
    return given, 0
  end,
}
