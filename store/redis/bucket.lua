-- Sluice lease mode: one operation on a bucket (store.ApplyBucket, which this mirrors;
-- the differential test compares the two). A bucket is a record like the others
-- ("VERSION b1 TAT"), so that a store without this script reads and writes it by
-- compare-and-set the same way. Every time is in microseconds of Redis' clock: exact in
-- Lua's doubles below 2^53.
--
-- KEYS[1]  the bucket; KEYS[2], if given, the store's meta key (see load.lua): a missing
--          bucket of a store whose meta key is younger than Fence is empty only Fence
--          after it (without a meta key, a Redis Cluster's node, after Fence from now).
-- ARGV     now ('' to read Redis TIME, or "s us": a virtual now, tests only), Start, T,
--          Tau, N, MaxDelay, Charge ('1' or '0'), Hold, how long a bucket is kept after
--          it has refilled in milliseconds, Fence (0: none, a store known to be fresh),
--          and how long the meta key outlives its last use in milliseconds.
-- Reply    {taken (1 or 0), wait, now_s, now_us}, or an error for a key that holds
--          something else.
-- (clock.lua, put before this script, has read s and us: the store's clock.)
local now = s * 1000000 + us
local start, T, tau = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local n, maxDelay, charge, hold = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1', tonumber(ARGV[8])
-- In range, as store.BucketOp.check: durations and N × T within 2^46 microseconds, a take
-- no larger than the burst.
local top = 70368744177664
local function out(x) return not x or x < 0 or x > top end
if not T or T < 1 or not tau or tau < T or out(tau) or not n or math.abs(n) > math.floor(top / T)
  or (n > 0 and not charge and n * T > tau) or out(maxDelay) or out(hold) or out(tonumber(ARGV[10]))
  or not start or start < 0 or start > 4503599627370496 then
  return redis.error_reply('sluice: bad bucket operation')
end
local v = redis.call('GET', KEYS[1])
local ver, tat = 0, nil
if v then
  local sp = string.find(v, ' ', 1, true)
  if sp then
    ver = tonumber(string.sub(v, 1, sp - 1))
    tat = tonumber(string.match(string.sub(v, sp + 1), '^b1 (%-?%d+)$'))
  end
  if not ver or not tat then return redis.error_reply('sluice: bad record: bucket') end
else
  tat = math.max(now, start) + tau -- empty
  local fence = tonumber(ARGV[10])
  if fence > 0 then
    local since = now
    if KEYS[2] then
      local m = redis.call('GET', KEYS[2])
      if m then
        local a, b = string.match(m, '^(%d+) (%d+)$')
        since = tonumber(a) * 1000000 + tonumber(b)
      else
        redis.call('SET', KEYS[2], string.format('%d %d', s, us), 'PX', ARGV[11])
      end
    end
    tat = math.max(tat, since + fence + tau)
  end
end
local was = tat
local taken, wait = 1, 0
if n > 0 and not charge then
  wait = math.max(0, math.max(tat, now) + n * T - tau - now)
  if wait > math.max(maxDelay, 0) then
    if v then return {0, wait, s, us} end
    taken = 0 -- refused, the bucket is made still: it starts filling from now
  else
    tat = math.max(tat, now + wait) + n * T
  end
elseif n > 0 then
  tat = math.max(tat, now) + n * T
elseif n < 0 then
  return {1, 0, s, us} -- given back: wasted, and a missing bucket not made (store.BucketOp.N)
elseif hold > 0 then
  tat = math.max(tat, now + hold + tau - T)
end
if v and tat == was then return {taken, wait, s, us} end
local nv = ver + 1
if nv < now then nv = now end
local keep = math.floor(math.max(tat - now, 0) / 1000) + 1 + tonumber(ARGV[9])
redis.call('SET', KEYS[1], string.format('%d b1 %d', nv, tat), 'PX', keep)
return {taken, wait, s, us}
