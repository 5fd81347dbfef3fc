-- quota: p = {limit or -1, max_amount or -1, expires_at (Unix ms) or -1, ttl_ms}.
-- No window: a lifetime count and/or amount (integer minor units), or a stock.
-- State "used_count:used_amount"; a restock (adjust.lua) may make them negative,
-- so remaining may exceed the limit. The key lives until expires_at when the limit
-- has one (PXAT), else ttl_ms (the router's quota_ttl) from its last change: every
-- write (admission, refund, adjust) sets it again, a denial or a read does not.
-- From expires_at on, the quota is over: every check is denied, remaining 0.
local function q_write(key, p, count, total)
  local value = fmt(count) .. ':' .. fmt(total)
  if p[3] >= 0 then
    redis.call('SET', key, value, 'PXAT', p[3])
  else
    redis.call('SET', key, value, 'PX', p[4])
  end
end

local function q_used(key)
  local raw = redis.call('GET', key)
  if not raw then return 0, 0 end
  local s = split(raw)
  return s[1], s[2]
end

ALG[CODE] = {
  eval = function(key, p, t, cost, amount)
    local max_count, max_amount, expires = p[1], p[2], p[3]
    local over = expires >= 0 and t.ms >= expires
    local count, total = 0, 0
    if not over then count, total = q_used(key) end
    local count_ok = max_count < 0 or count + cost <= max_count
    local amount_ok = max_amount < 0 or total + amount <= max_amount
    local reset = -1
    if expires >= 0 and not over then reset = expires - t.ms end
    local r = {
      ok = (not over) and count_ok and amount_ok,
      limit = max_count,
      rem_now = max_count < 0 and -1 or (over and 0 or math.max(0, max_count - count)),
      rem_after = max_count < 0 and -1 or math.max(0, max_count - count - cost),
      reset_now = reset,
      reset_after = reset,
      delay = -1,
      alimit = max_amount,
      arem_now = max_amount < 0 and -1 or (over and 0 or math.max(0, max_amount - total)),
      arem_after = max_amount < 0 and -1 or math.max(0, max_amount - total - amount),
      retry = -1, -- nothing comes back by itself: a refund or a restock does
    }
    r.consumes = cost > 0 or amount > 0
    r.commit = function()
      q_write(key, p, count + cost, total + amount)
      return { cost, amount }
    end
    return r
  end,
  refund = function(key, p, t, u)
    if p[3] >= 0 and t.ms >= p[3] then return 0, 0 end
    local raw = redis.call('GET', key)
    if not raw then return 0, 0 end -- expired: the quota started over
    local s = split(raw)
    q_write(key, p, s[1] - u[3], s[2] - u[4])
    return u[3], u[4]
  end,
  -- A restock (adjust.lua): modes 0 none, 1 remaining += value, 2 remaining = value;
  -- remaining never goes below 0 nor above 10^15. Returns the row after, or nil once
  -- the quota is over (expires_at passed).
  adjust = function(key, p, t, a)
    if p[3] >= 0 and t.ms >= p[3] then return nil end
    local count, total = q_used(key)
    local function apply(limit, used, mode, value)
      if limit < 0 or mode == 0 then return used end
      local remaining = limit - used
      if mode == 1 then remaining = remaining + value else remaining = value end
      remaining = math.min(math.max(0, remaining), 1000000000000000)
      return limit - remaining
    end
    count = apply(p[1], count, a[1], a[2])
    total = apply(p[2], total, a[3], a[4])
    q_write(key, p, count, total)
    return {
      p[1], p[1] < 0 and -1 or p[1] - count, p[3] >= 0 and p[3] - t.ms or -1,
      p[2], p[2] < 0 and -1 or p[2] - total,
    }
  end,
}
