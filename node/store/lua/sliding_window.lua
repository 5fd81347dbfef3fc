-- sliding_window: p = {limit, window_ms}. State "window_index:previous:current".
-- Estimate = previous * (1 - elapsed / window) + current (approximate, like
-- Cloudflare's and the limits library's moving window counter).
local function sw_state(key, w)
  local raw = redis.call('GET', key)
  if not raw then return 0, 0 end
  local s = split(raw)
  if s[1] == w then return s[2], s[3] end
  if s[1] == w - 1 then return s[3], 0 end
  return 0, 0
end

ALG[CODE] = {
  eval = function(key, p, t, cost, _amount)
    local limit, win = p[1], p[2]
    local w = math.floor(t.ms / win)
    local elapsed = t.ms - w * win
    local prev, curr = sw_state(key, w)
    local estimate = prev * (win - elapsed) / win + curr
    local r = {
      ok = estimate + cost <= limit,
      limit = limit,
      rem_now = math.max(0, math.floor(limit - estimate)),
      rem_after = math.max(0, math.floor(limit - estimate - cost)),
      delay = -1, alimit = -1, arem_now = -1, arem_after = -1,
      retry = -1,
    }
    -- Fully reset once both windows holding hits have slid past.
    local function reset_for(c)
      if c > 0 then return 2 * win - elapsed end
      if prev > 0 then return win - elapsed end
      return 0
    end
    r.reset_now = reset_for(curr)
    r.reset_after = reset_for(curr + cost)
    if not r.ok and cost <= limit then
      local need = limit - curr - cost
      if prev > 0 and need >= 0 then
        -- Later in this window: prev * (win - e) / win <= need.
        r.retry = math.max(1, math.ceil(win - need * win / prev - elapsed))
      else
        -- Next window: curr * (win - e) / win + cost <= limit.
        local e = 0
        if curr > 0 then e = math.max(0, win - (limit - cost) * win / curr) end
        r.retry = math.max(1, math.ceil(win - elapsed + e))
      end
    end
    r.consumes = cost > 0
    r.commit = function()
      redis.call('SET', key, fmt(w) .. ':' .. fmt(prev) .. ':' .. fmt(curr + cost),
        'PX', 2 * win - elapsed + expiry_spread(t, win))
      return { w, cost }
    end
    return r
  end,
  refund = function(key, _p, _t, u)
    local raw = redis.call('GET', key)
    if not raw then return 0, 0 end
    local s = split(raw)
    local given = 0
    if s[1] == u[3] then
      given = math.min(s[3], u[4])
      s[3] = s[3] - given
    elseif s[1] == u[3] + 1 then
      given = math.min(s[2], u[4])
      s[2] = s[2] - given
    else
      return 0, 0
    end
    redis.call('SET', key, fmt(s[1]) .. ':' .. fmt(s[2]) .. ':' .. fmt(s[3]), 'KEEPTTL')
    return given, 0
  end,
}
