-- Sluice lease mode: write records by compare-and-set (lease.RedisStore.Swap).
--
-- KEYS     the records.
-- ARGV[1]  '' to read Redis TIME, or "s us": a virtual now (tests only).
-- Then per key: the version read ('0': the record must not exist), the data ('' deletes
-- the record), and how long to keep it in milliseconds.
-- Reply    per key, the record's new version as text, or '0' where its version had
--          changed (nothing written). A new version is the old one plus one, or the time
--          in microseconds if that is larger, so that versions never decrease even when a
--          record is deleted and made again.
-- (clock.lua, put before this script, has read s and us: the store's clock.)
local clock = s * 1000000 + us
local out = {}
for i = 1, #KEYS do
  local want, data, keep = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local v = redis.call('GET', KEYS[i])
  local cur = '0'
  if v then cur = string.sub(v, 1, string.find(v, ' ', 1, true) - 1) end
  if cur ~= want then
    out[i] = '0'
  else
    local nv = tonumber(cur) + 1
    if nv < clock then nv = clock end
    local text = string.format('%d', nv)
    if data == '' then
      redis.call('DEL', KEYS[i])
    else
      redis.call('SET', KEYS[i], text .. ' ' .. data, 'PX', keep)
    end
    out[i] = text
  end
end
return out
