-- fixed_window: p = {limit, window_ms}. State "window_index:used".
-- Windows are aligned to multiples of window_ms since the Unix epoch.
ALG[1] = {
  eval = function(key, p, t, cost, _amount)
    local limit, win = p[1], p[2]
    local w = math.floor(t.ms / win)
    local used = 0
    local raw = redis.call('GET', key)
    if raw then
      local s = split(raw)
      if s[1] == w then used = s[2] end
    end
    local reset = (w + 1) * win - t.ms
    local r = {
      ok = used + cost <= limit,
      limit = limit,
      rem_now = math.max(0, limit - used),
      rem_after = math.max(0, limit - used - cost),
      reset_now = used > 0 and reset or 0,
      reset_after = (used + cost) > 0 and reset or 0,
      delay = -1, alimit = -1, arem_now = -1, arem_after = -1,
    }
    r.retry = (cost <= limit) and reset or -1
    r.consumes = cost > 0
    r.commit = function()
      redis.call('SET', key, fmt(w) .. ':' .. fmt(used + cost), 'PX', math.max(1, reset))
      return { w, cost }
    end
    return r
  end,
  refund = function(key, _p, _t, u)
    local raw = redis.call('GET', key)
    if not raw then return 0, 0 end
    local s = split(raw)
    if s[1] ~= u[3] then return 0, 0 end
    local left = math.max(0, s[2] - u[4])
    redis.call('SET', key, fmt(s[1]) .. ':' .. fmt(left), 'KEEPTTL')
    return s[2] - left, 0
  end,
}
