-- Sluice lease mode: read records with the store's time (lease.RedisStore.Load).
--
-- KEYS     the records, then, unless ARGV[2] is 'c', the store's meta key.
-- ARGV[1]  '' to read Redis TIME, or "s us": a virtual now (tests only).
-- ARGV[2]  'm': with the meta key (one Redis, or a Sentinel pair); 'c': without (a
--          Redis Cluster, where one call reaches one node).
-- ARGV[3]  with 'm': how long the meta key outlives the last read, in milliseconds: a
--          store nobody reads for that long forgets its mark (a demo's own prefix leaves
--          nothing behind for good); read again, it is marked anew, and fences for TTL +
--          Grace, as a store seen for the first time does.
-- Reply    {now_s, now_us, since_s, since_us, version1, data1, version2, data2, ...}: the
--          store's time; when its current incarnation began (the meta key's creation,
--          made now if it is missing: a store that lost every key, or is used for the
--          first time; -1 -1 without a meta key); each record's version (as text, '0'
--          if missing) and data ('' if missing).
-- A record's value is "VERSION DATA".
-- (clock.lua, put before this script, has read s and us: the store's clock.)
local n = #KEYS
local out = {s, us, -1, -1}
if ARGV[2] == 'm' then
  local meta = KEYS[n]
  n = n - 1
  local v = redis.call('GET', meta)
  if v then
    local a, b = string.match(v, '^(%d+) (%d+)$')
    out[3], out[4] = tonumber(a), tonumber(b)
    redis.call('PEXPIRE', meta, ARGV[3])
  else
    redis.call('SET', meta, string.format('%d %d', s, us), 'PX', ARGV[3])
    out[3], out[4] = s, us
  end
end
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v then
    local sp = string.find(v, ' ', 1, true)
    out[#out + 1] = string.sub(v, 1, sp - 1)
    out[#out + 1] = string.sub(v, sp + 1)
  else
    out[#out + 1] = '0'
    out[#out + 1] = ''
  end
end
return out
