-- fixed_window: p = {limit, window_ms, envoy_flags}. State: the count, a plain integer (Redis
-- shares small integers, so a counter costs no value allocation). Windows are
-- aligned to multiples of window_ms since the Unix epoch, and the window a count
-- belongs to is carried by the key's expiry: it is written with PX = window end
-- - now, plus common.lua's `expiry_spread` (under a quarter window), so it expires
-- shortly after its window ends. A key whose remaining TTL is not within half a
-- window of the current window's end is from another window (the node's clock was
-- moved, or the key outlives its window) and counts as empty.
local function fw_current(key, reset, win)
  return math.abs(redis.call('PTTL', key) - reset) * 2 < win
end

--
-- envoy_flags (0 for every HTTP check; only the Envoy service sets them, never with
-- dry_run): 1 = count a denied hit too (envoyproxy/ratelimit's INCRBY on every hit, so
-- the counter may pass the limit). (2, once "report the window's end even for an unused
-- counter", is what every check answers now: a window resets at its end, used or not.)
local FW_COUNT_DENIED = 1

local function fw_flag(flags, bit)
  return math.floor(flags / bit) % 2 == 1
end

-- The count of key's current window (0 when it holds another window's), that window's
-- index, and the ms to its end.
local function fw_read(key, win, t)
  local w = math.floor(t.ms / win)
  local reset = (w + 1) * win - t.ms
  local raw = redis.call('GET', key)
  if raw and fw_current(key, reset, win) then return tonumber(raw), w, reset end
  return 0, w, reset
end

-- A count written now lives until its window ends, and its spread after.
local function fw_ttl(reset, t, win)
  return math.max(1, reset) + expiry_spread(t, win)
end

local function fw_add(key, used, cost, reset, t, win)
  if used > 0 then
    -- The key holds this window's count and expires after its end: add in place.
    redis.call('INCRBY', key, fmt(cost))
  else
    redis.call('SET', key, fmt(cost), 'PX', fw_ttl(reset, t, win))
  end
end

ALG[CODE] = {
  eval = function(key, p, t, cost, _amount)
    local limit, win, flags = p[1], p[2], p[3] or 0
    local used, w, reset = fw_read(key, win, t)
    local r = {
      ok = used + cost <= limit,
      limit = limit,
      rem_now = math.max(0, limit - used),
      rem_after = math.max(0, limit - used - cost),
      reset_now = reset,
      reset_after = reset,
      delay = -1, alimit = -1, arem_now = -1, arem_after = -1,
    }
    r.retry = (cost <= limit) and reset or -1
    r.consumes = cost > 0
    if not r.ok and cost > 0 and fw_flag(flags, FW_COUNT_DENIED) then
      -- The denied hit is counted here: the batch commits only what it admits.
      redis.call('SET', key, fmt(used + cost), 'PX', fw_ttl(reset, t, win))
    end
    r.commit = function()
      fw_add(key, used, cost, reset, t, win)
      return { w, cost }
    end
    return r
  end,
  -- A check of this one limit alone, without a record (batch.lua's common case): eval
  -- and commit in one step, its reply built at once with no table in between (a
  -- fifth of Redis' time per check). nil for the Envoy flags: eval serves those.
  -- c: the check's packed entry, this limit's parameters from c[11].
  alone = function(key, c, t, cost, dry_run)
    local limit, win = c[11], c[12]
    if (c[13] or 0) ~= 0 then return nil end
    local used, w, reset = fw_read(key, win, t)
    if used + cost > limit then
      return { 0, 0, 1, 0, limit, math.max(0, limit - used), reset,
        (cost <= limit) and reset or -1, -1, -1, -1 }
    end
    local left = math.max(0, limit - used - cost)
    if cost == 0 or dry_run then
      return { 1, 0, 1, 1, limit, left, reset, -1, -1, -1, -1 }
    end
    fw_add(key, used, cost, reset, t, win)
    return { 1, 0, 1, 1, limit, left, reset, -1, -1, -1, -1, cmsgpack.pack({ { key, CODE, w, cost } }) }
  end,
  refund = function(key, p, t, u)
    local win = p[2]
    local w = math.floor(t.ms / win)
    local raw = redis.call('GET', key)
    if not raw or u[3] ~= w or not fw_current(key, (w + 1) * win - t.ms, win) then return 0, 0 end
    local used = tonumber(raw)
    local left = math.max(0, used - u[4])
    redis.call('SET', key, fmt(left), 'KEEPTTL')
    return used - left, 0
  end,
}
