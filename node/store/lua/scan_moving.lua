-- scan_moving: one step of a migration source's copy in slots mode. SCANs this
-- Redis and keeps, without shipping the rest to the node, the counters and
-- records whose limit key hashes to a slot that changes owner.
-- KEYS: none. ARGV: cursor, SCAN COUNT per round, how many names to examine at
-- most, the moving slots as a bitmap of 16384 bits (2048 bytes, bit s%8 of byte
-- s//8 set = slot s moves).
-- Returns {next cursor, names examined, then name, slot, name, slot, ...}.
-- The slot is CRC16-XMODEM of the limit key's routing part (its non-empty {tag},
-- else all of it), as cluster/model/partition/hashing.py key_slot() computes it.
local cursor, count, budget, moving = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local band, bxor, lshift, rshift = bit.band, bit.bxor, bit.lshift, bit.rshift
local byte, find, sub = string.byte, string.find, string.sub

local crc_table = {}
for i = 0, 255 do
  local crc = lshift(i, 8)
  for _ = 1, 8 do
    if band(crc, 0x8000) ~= 0 then crc = bxor(lshift(crc, 1), 0x1021) else crc = lshift(crc, 1) end
  end
  crc_table[i] = band(crc, 0xffff)
end

-- Two bit-library calls per byte; the shifts are arithmetic (crc < 65536).
local floor = math.floor
local function crc16(s)
  local crc = 0
  local bytes = { byte(s, 1, -1) }
  for i = 1, #bytes do
    crc = bxor((crc % 256) * 256, crc_table[bxor(floor(crc / 256), bytes[i])])
  end
  return crc
end

-- The limit key of a counter (c<8 chars>|key) or record (r|scope|id|key), else nil.
local function limit_key(name)
  local first = byte(name, 1)
  if first == 99 then -- 'c'
    if byte(name, 10) == 124 then return sub(name, 11) end
    return nil
  end
  if first == 114 and byte(name, 2) == 124 then -- 'r|'
    local a = find(name, '|', 3, true)
    if not a then return nil end
    local b = find(name, '|', a + 1, true)
    if not b then return nil end
    return sub(name, b + 1)
  end
  return nil
end

local out = { 0, 0 }
local examined = 0
repeat
  local reply = redis.call('SCAN', cursor, 'MATCH', '[cr]*', 'COUNT', count)
  cursor = reply[1]
  local names = reply[2]
  examined = examined + #names
  for i = 1, #names do
    local name = names[i]
    local key = limit_key(name)
    if key then
      local part = key
      local open = find(key, '{', 1, true)
      if open then
        local close = find(key, '}', open + 1, true)
        if close and close > open + 1 then part = sub(key, open + 1, close - 1) end
      end
      local slot = band(crc16(part), 16383)
      if band(byte(moving, rshift(slot, 3) + 1), lshift(1, band(slot, 7))) ~= 0 then
        out[#out + 1] = name
        out[#out + 1] = slot
      end
    end
  end
until cursor == '0' or examined >= budget
out[1] = cursor
out[2] = examined
return out
