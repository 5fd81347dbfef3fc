-- Shared helpers. Every script is assembled as: common.lua, the algorithm files,
-- then its entry file (batch.lua, refund.lua, undo.lua). All integers stay below 2^53 so
-- Lua doubles hold them exactly; they are formatted with %d, never tostring().
local ALG = {}

local function fmt(n)
  return string.format('%d', n)
end

local function split(value)
  local out = {}
  for part in string.gmatch(value, '[^:]+') do
    out[#out + 1] = tonumber(part)
  end
  return out
end

-- Time always comes from this Redis. offset_us is non-zero only when the node
-- runs in test mode with a controllable clock.
local function clock(offset_us)
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + offset_us
  return { us = us, ms = math.floor(us / 1000) }
end

-- How long a counter outlives its window: up to a quarter of the window, at most a
-- minute, picked by Redis' clock. The counters of one aligned window (every key's hour,
-- every key's day) would otherwise all expire at its end together, and Redis' active
-- expiry holds up every command while it deletes them (15 ms for 33,000 counters,
-- 38 ms for 100,000 on a bare Redis). A quarter keeps a fixed window's count within
-- half a window of its end, where fixed_window.lua tells it is the current one.
local EXPIRY_SPREAD_MAX_MS = 60000

local function expiry_spread(t, window_ms)
  local most = math.min(math.floor(window_ms / 4), EXPIRY_SPREAD_MAX_MS)
  if most < 1 then return 0 end
  return t.us % most
end

local function ceil_div(a, b)
  return math.ceil(a / b)
end

local function params(base)
  local p = {}
  for j = 0, 5 do
    p[j + 1] = tonumber(ARGV[base + j])
  end
  return p
end

-- The shard's epoch fence: a counter script's last KEY is SHARD_EPOCH_KEY
-- (cluster/model/keys.py), the newest topology epoch an endpoint of the shard adopted,
-- and its last ARGV the epoch its caller placed the keys by. Once another endpoint
-- adopted a newer topology the script must apply nothing: its reply is then this
-- {-4, the shard's epoch} (node/store/replies.py FENCED), else nil.
local function fenced()
  local shard = redis.call('GET', KEYS[#KEYS])
  if shard and tonumber(shard) > tonumber(ARGV[#ARGV]) then return { -4, tonumber(shard) } end
  return nil
end
