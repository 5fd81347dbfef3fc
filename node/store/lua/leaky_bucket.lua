-- leaky_bucket (shaping): p = {rate, period_ms, capacity}. A queue that drains
-- rate units per period. A request is admitted with delay_ms = time for the
-- queue ahead of it to drain, while queued + cost <= capacity; else denied.
-- State "scaled:last_ms" where scaled = queued units * period_ms.
local function lb_level(key, rate, now_ms)
  local raw = redis.call('GET', key)
  if not raw then return 0 end
  local s = split(raw)
  local elapsed = math.max(0, now_ms - s[2])
  return math.max(0, s[1] - rate * elapsed)
end

ALG[CODE] = {
  eval = function(key, p, t, cost, _amount)
    local rate, period, size = p[1], p[2], p[3]
    local capacity = size * period
    local level = lb_level(key, rate, t.ms)
    local after = level + cost * period
    local r = {
      ok = after <= capacity,
      limit = size,
      rem_now = math.floor((capacity - level) / period),
      rem_after = math.max(0, math.floor((capacity - after) / period)),
      reset_now = ceil_div(level, rate),
      reset_after = ceil_div(after, rate),
      delay = ceil_div(level, rate),
      alimit = -1, arem_now = -1, arem_after = -1,
      retry = -1,
    }
    if not r.ok and cost <= size then
      r.retry = ceil_div(after - capacity, rate)
    end
    r.consumes = cost > 0
    r.commit = function()
      redis.call('SET', key, fmt(after) .. ':' .. fmt(t.ms), 'PX', math.max(1, ceil_div(after, rate)))
      return { cost }
    end
    return r
  end,
  refund = function(key, p, t, u)
    local rate, period, size = p[1], p[2], p[3]
    local capacity = size * period
    local level = lb_level(key, rate, t.ms)
    local back = math.max(0, level - u[3] * period)
    redis.call('SET', key, fmt(back) .. ':' .. fmt(t.ms), 'PX', math.max(1, ceil_div(back, rate)))
    -- What it gave back, as the remaining the client sees: whole units after, less before.
    return math.floor((capacity - back) / period) - math.floor((capacity - level) / period), 0
  end,
}
