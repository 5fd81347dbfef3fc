-- calendar: p = {max_count or -1, max_amount or -1, b0, b1, b2, b3}: four
-- consecutive natural-period starts (ms) computed by the node in the limit's
-- timezone around its estimate of this Redis' clock. The script picks the
-- period that contains Redis TIME; if none does, the node's estimate was off by
-- more than a period and it retries (error CLOCK_SKEW).
-- State "period_start:count:amount" (amount in integer minor units).
ALG[CODE] = {
  eval = function(key, p, t, cost, amount)
    local max_count, max_amount = p[1], p[2]
    local start, finish
    for j = 3, 5 do
      if p[j] <= t.ms and t.ms < p[j + 1] then
        start, finish = p[j], p[j + 1]
      end
    end
    if not start then return nil end
    local count, total = 0, 0
    local raw = redis.call('GET', key)
    if raw then
      local s = split(raw)
      if s[1] == start then count, total = s[2], s[3] end
    end
    local count_ok = max_count < 0 or count + cost <= max_count
    local amount_ok = max_amount < 0 or total + amount <= max_amount
    local reset = finish - t.ms
    local r = {
      ok = count_ok and amount_ok,
      limit = max_count,
      rem_now = max_count < 0 and -1 or math.max(0, max_count - count),
      rem_after = max_count < 0 and -1 or math.max(0, max_count - count - cost),
      reset_now = reset,
      reset_after = reset,
      delay = -1,
      alimit = max_amount,
      arem_now = max_amount < 0 and -1 or math.max(0, max_amount - total),
      arem_after = max_amount < 0 and -1 or math.max(0, max_amount - total - amount),
      retry = -1,
    }
    local fits = (max_count < 0 or cost <= max_count) and (max_amount < 0 or amount <= max_amount)
    if not r.ok and fits then r.retry = reset end
    r.consumes = cost > 0 or amount > 0
    r.commit = function()
      redis.call('SET', key, fmt(start) .. ':' .. fmt(count + cost) .. ':' .. fmt(total + amount),
        'PX', math.max(1, reset) + expiry_spread(t, finish - start))
      return { start, cost, amount }
    end
    return r
  end,
  refund = function(key, _p, _t, u)
    local raw = redis.call('GET', key)
    if not raw then return 0, 0 end
    local s = split(raw)
    if s[1] ~= u[3] then return 0, 0 end
    local count = math.max(0, s[2] - u[4])
    local total = math.max(0, s[3] - u[5])
    redis.call('SET', key, fmt(s[1]) .. ':' .. fmt(count) .. ':' .. fmt(total), 'KEEPTTL')
    return s[2] - count, s[3] - total
  end,
}
