-- check: evaluate every limit of one check and consume all of them or none.
-- KEYS: counter key per limit, then the idempotency record key when ARGV[5] > 0,
--       then the node's holds set when a hold is asked for.
-- ARGV: offset_us, n, cost, dry_run (0/1), record_ttl_ms, deadline_ms (real Unix
--       ms; 0 = none), then per limit 8 values: algorithm code, amount (minor
--       units), p1..p6; then hold_ms and
--       the hold's sweeper entry. A held decision (first phase of an
--       all-or-nothing batch) is given back by the node's sweeper unless it is
--       committed (commit.lua) before hold_ms have passed.
-- Returns {allowed, replayed, n, then per limit: ok, limit, remaining,
--          reset_after_ms, retry_after_ms, delay_ms, max_amount, amount_remaining}
-- with -1 standing for "none", followed, when the check consumed, by its undo
-- entries packed with cmsgpack (what undo.lua needs to take the check back if the
-- node's answer comes too late). Returns {-1} without touching anything when
-- this Redis' clock is already past the deadline.
local offset = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local dry_run = ARGV[4] == '1'
local record_ttl = tonumber(ARGV[5])
local deadline = tonumber(ARGV[6])
local record_key = record_ttl > 0 and KEYS[n + 1] or nil

local t = clock(offset)
if deadline > 0 and t.us - offset > deadline * 1000 then return { -1 } end

if record_key then
  local stored = redis.call('GET', record_key)
  if stored then
    local record = cmsgpack.unpack(stored)
    local out = record.result
    out[2] = 1
    return out
  end
end

local evaluated = {}
local codes = {}
local allowed = true
for i = 1, n do
  local base = 7 + (i - 1) * 8
  local code = tonumber(ARGV[base])
  local r = ALG[code].eval(KEYS[i], params(base + 2), t, cost, tonumber(ARGV[base + 1]))
  if r == nil then return redis.error_reply('CLOCK_SKEW calendar period not in the given bounds') end
  evaluated[i] = r
  codes[i] = code
  if not r.ok then allowed = false end
end

local out = { allowed and 1 or 0, 0, n }
local undo = {}
for i = 1, n do
  local r = evaluated[i]
  if allowed and not dry_run and r.consumes then
    local u = r.commit()
    table.insert(u, 1, codes[i])
    table.insert(u, 1, KEYS[i])
    undo[#undo + 1] = u
  end
  local rem, reset, arem = r.rem_now, r.reset_now, r.arem_now
  if allowed then rem, reset, arem = r.rem_after, r.reset_after, r.arem_after end
  local retry = -1
  if not r.ok then retry = r.retry end
  local delay = -1
  if allowed then delay = r.delay end
  for _, v in ipairs({ r.ok and 1 or 0, r.limit or -1, rem, reset, retry, delay, r.alimit, arem }) do
    out[#out + 1] = v
  end
end

if record_key and not dry_run then
  local record = { result = out, undo = undo, refunded = 0, held = 0 }
  local hold_ms = tonumber(ARGV[7 + n * 8]) or 0
  if hold_ms > 0 and #undo > 0 then
    local entry = ARGV[8 + n * 8]
    local real_ms = math.floor((t.us - offset) / 1000)
    record.held = 1
    record.hold_entry = entry
    redis.call('ZADD', KEYS[n + 2], real_ms + hold_ms, entry)
  end
  redis.call('SET', record_key, cmsgpack.pack(record), 'PX', record_ttl)
end
if #undo > 0 then out[#out + 1] = cmsgpack.pack(undo) end
return out
