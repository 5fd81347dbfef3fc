-- token_bucket: p = {rate, period_ms, burst}. Starts full, refills continuously.
-- State "scaled:last_ms" where scaled = tokens * period_ms, so refill is the
-- integer rate * elapsed_ms: exact, no float drift.
local function tb_level(key, rate, period, capacity, now_ms)
  local raw = redis.call('GET', key)
  if not raw then return capacity end
  local s = split(raw)
  local elapsed = math.max(0, now_ms - s[2])
  return math.min(capacity, s[1] + rate * elapsed)
end

ALG[CODE] = {
  eval = function(key, p, t, cost, _amount)
    local rate, period, burst = p[1], p[2], p[3]
    local capacity = burst * period
    local scaled = tb_level(key, rate, period, capacity, t.ms)
    local need = cost * period
    local after = scaled - need
    local r = {
      ok = scaled >= need,
      limit = burst,
      rem_now = math.floor(scaled / period),
      rem_after = math.max(0, math.floor(after / period)),
      reset_now = ceil_div(capacity - scaled, rate),
      reset_after = ceil_div(capacity - math.max(0, after), rate),
      delay = -1, alimit = -1, arem_now = -1, arem_after = -1,
      retry = -1,
    }
    if not r.ok and cost <= burst then
      r.retry = ceil_div(need - scaled, rate)
    end
    r.consumes = cost > 0
    r.commit = function()
      redis.call('SET', key, fmt(after) .. ':' .. fmt(t.ms),
        'PX', math.max(1, ceil_div(capacity - after, rate)))
      return { cost }
    end
    return r
  end,
  refund = function(key, p, t, u)
    local rate, period, burst = p[1], p[2], p[3]
    local capacity = burst * period
    local scaled = tb_level(key, rate, period, capacity, t.ms)
    local back = math.min(capacity, scaled + u[3] * period)
    redis.call('SET', key, fmt(back) .. ':' .. fmt(t.ms),
      'PX', math.max(1, ceil_div(capacity - back, rate)))
    -- What it gave back, as the remaining the client sees: whole tokens after, less before.
    return math.floor(back / period) - math.floor(scaled / period), 0
  end,
}
