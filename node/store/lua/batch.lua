-- batch: every check, renewal and release of one node batch in ONE script call. Each
-- check is still evaluated and applied on its own, all of its limits or none; the
-- script as a whole is atomic too. TIME is read once for the batch.
-- KEYS: per check, its counter key per limit, then (when it has a record) its
--       idempotency record key, then (when it holds) the node's holds set.
--       Last, the shard's epoch fence (common.lua `fenced`).
-- ARGV: offset_us, deadline_ms (real Unix ms; 0 = none), then the checks packed
--       with msgpack: a list of {nkeys, cost, dry_run (0/1), record_ttl_ms,
--       hold_ms, hold_entry or "", fingerprint or "", n, then per limit its
--       algorithm code, amount (minor units), p1..p6}: one flat list per check, as
--       unpacking nested lists costs Redis more than reading the values. Last, the
--       topology epoch the node placed the ops by.
-- A check of one limit without a record goes to its algorithm's `alone` when it has
-- one (the same reply, built without the tables below).
-- A renewal or release of a lease (concurrency.lua's `held`) is an entry of its own,
-- {-1, code, action, member, ttl_ms, keep_ms} with one key, run whatever the deadline
-- (it consumes nothing); its reply is `held`'s {status, now_ms, ttl_ms}.
-- Returns `fenced`'s reply, applying nothing, when an endpoint of the shard adopted a
-- newer topology; else one reply per check, in order:
--   {allowed, replayed, n, then per limit: ok, limit, remaining, reset_after_ms,
--    retry_after_ms, delay_ms, max_amount, amount_remaining} with -1 for "none",
--   followed, when the check consumed, by its undo entries packed with cmsgpack
--   (what undo.lua needs to take it back if the node's answer comes too late);
--   {-1} when this Redis' clock is already past the deadline (nothing applied);
--   {-2} when a calendar period did not contain Redis' clock (the node's
--   estimate of it was off: it re-measures and sends the check again);
--   {-3} when the check's record was made for another request (its fingerprint
--   differs): the request_id is reused, nothing is applied or replayed.
local moved_on = fenced()
if moved_on then return moved_on end
local offset = tonumber(ARGV[1])
local deadline = tonumber(ARGV[2])
local checks = cmsgpack.unpack(ARGV[3])
local t = clock(offset)
local expired = deadline > 0 and t.us - offset > deadline * 1000

local function check(first, c)
  local n = c[8]
  local cost, dry_run, record_ttl = c[2], c[3] == 1, c[4]
  local record_key = record_ttl > 0 and KEYS[first + n] or nil

  if record_key then
    local stored = redis.call('GET', record_key)
    if stored then
      local record = cmsgpack.unpack(stored)
      -- A record from before fingerprints (or a check sent without one) replays as is.
      local fp = c[7] or ''
      if fp ~= '' and (record.fp or '') ~= '' and record.fp ~= fp then return { -3 } end
      if record.replayed ~= 1 and not dry_run then
        -- This answer may reach a client: the first one's consumption stands from now
        -- on, even if its own answer comes too late (undo.lua leaves it). A dry run
        -- writes nothing.
        record.replayed = 1
        redis.call('SET', record_key, cmsgpack.pack(record), 'KEEPTTL')
      end
      local out = record.result
      out[2] = 1
      return out
    end
  end

  if n == 1 and not record_key then
    local alone = ALG[c[9]].alone
    if alone then
      local out = alone(KEYS[first], c, t, cost, dry_run)
      if out then return out end
    end
  end

  local evaluated = {}
  local allowed = true
  for i = 1, n do
    local b = 8 * i -- c[b + 1]: the limit's algorithm code, c[b + 2]: amount, then p1..p6
    local r = ALG[c[b + 1]].eval(KEYS[first + i - 1],
      { c[b + 3], c[b + 4], c[b + 5], c[b + 6], c[b + 7], c[b + 8] }, t, cost, c[b + 2])
    if r == nil then return { -2 } end
    evaluated[i] = r
    if not r.ok then allowed = false end
  end

  local undo = {}
  local out
  for i = 1, n do
    local r = evaluated[i]
    if allowed and not dry_run and r.consumes then
      local u = r.commit()
      local entry = { KEYS[first + i - 1], c[8 * i + 1] }
      for j = 1, #u do entry[j + 2] = u[j] end
      undo[#undo + 1] = entry
    end
    local rem, reset, arem = r.rem_now, r.reset_now, r.arem_now
    if allowed then rem, reset, arem = r.rem_after, r.reset_after, r.arem_after end
    local ok = r.ok
    if n == 1 then
      -- The common case in one table constructor: one allocation, no growth.
      out = { allowed and 1 or 0, 0, 1, ok and 1 or 0, r.limit or -1, rem, reset,
        ok and -1 or r.retry, allowed and r.delay or -1, r.alimit, arem }
    else
      if i == 1 then out = { allowed and 1 or 0, 0, n } end
      local k = 3 + 8 * (i - 1)
      out[k + 1] = ok and 1 or 0
      out[k + 2] = r.limit or -1
      out[k + 3] = rem
      out[k + 4] = reset
      out[k + 5] = ok and -1 or r.retry
      out[k + 6] = allowed and r.delay or -1
      out[k + 7] = r.alimit
      out[k + 8] = arem
    end
  end

  if record_key and not dry_run then
    local record = { result = out, undo = undo, refunded = 0, held = 0, fp = c[7] or '' }
    local hold_ms = c[5]
    if hold_ms > 0 and #undo > 0 then
      local entry = c[6]
      record.held = 1
      record.hold_entry = entry
      redis.call('ZADD', KEYS[first + n + 1], math.floor((t.us - offset) / 1000) + hold_ms, entry)
    end
    redis.call('SET', record_key, cmsgpack.pack(record), 'PX', record_ttl)
  end
  if #undo > 0 then out[#out + 1] = cmsgpack.pack(undo) end
  return out
end

local replies = {}
local first = 1
for j = 1, #checks do
  local c = checks[j]
  local nkeys = c[1]
  if nkeys < 0 then
    replies[j] = ALG[c[2]].held(KEYS[first], c, t)
    nkeys = 1
  elseif expired then
    replies[j] = { -1 }
  else
    replies[j] = check(first, c)
  end
  first = first + nkeys
end
return replies
