-- Sluice, Redis mode: windowed quotas (a window counter per limit), for keys whose limits
-- are all windowed quotas. The decisions are those of the Go core (package gcra, window.go:
-- windowSlot, take, Penalize); the differential test compares the two. Times are whole
-- microseconds since the Unix epoch, from Redis TIME (below 2^53, so exact in Lua's
-- doubles); a window of W microseconds is [i*W, (i+1)*W) for a whole i, so a daily window
-- starts at 00:00 UTC.
--
-- KEYS[1]  the key's state "i1 u1 [i2 u2 ...]": per limit, the index of the latest window it
--          counts permits in and how many it counts there.
-- ARGV[1]  '' to read Redis TIME, or a virtual now in microseconds (tests only; such keys get
--          an hour's extra TTL, as real time runs ahead of a virtual now).
-- ARGV[2]  the operation; ARGV[3] k, the number of limits; then per limit W and its count N;
--          then the operation's fields:
--   d  decide:   n, maxDelay. Grants n permits to every limit at the first time `at` they
--                fit in all of them, if at - now <= maxDelay (n = 0: a query).
--   s  settle:   delta (> 0 a charge: counted in the latest window, up to N; < 0 a refund:
--                given back if that window is still the latest and has not ended), then per
--                limit the window index the grant was counted in.
--   p  penalize: d, p: limit p (1-based) is counted full in the window holding now + d.
-- The reply: {allowed (1 or 0; 1 for s and p), at (d: when the permits may be used, or
-- would be if denied; else now), now, i1, u1, ...}. Denials and queries write nothing.

local argv = ARGV
local floor, tonumber = math.floor, tonumber
local now
local virtual = false
if argv[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(argv[1])
  virtual = true
end
local op = argv[2]
local k = tonumber(argv[3])
local W, N = {}, {}
for j = 1, k do
  W[j] = tonumber(argv[2 + 2 * j])
  N[j] = tonumber(argv[3 + 2 * j])
end
local f = 4 + 2 * k -- the operation's first field

-- idx is the index of the window of limit j that holds t, exactly.
local function idx(j, t)
  local i = floor(t / W[j])
  if i * W[j] > t then i = i - 1 elseif (i + 1) * W[j] <= t then i = i + 1 end
  return i
end

local I, U = {}, {}
local s = redis.call('GET', KEYS[1])
local j = 0
if s then
  for a, b in string.gmatch(s, '(%-?%d+) (%d+)') do
    j = j + 1
    I[j], U[j] = tonumber(a), tonumber(b)
  end
end
if j ~= k then -- missing, or written under other limits: fresh
  for j = 1, k do I[j], U[j] = -1, 0 end
end

-- counted reports whether limit j counts permits in a window no earlier than t's.
local function counted(j, t)
  return U[j] > 0 and I[j] >= idx(j, t)
end

-- slot is when n permits fit in limit j, asked at t (no earlier than t), and the state
-- after taking them there.
local function slot(j, t, n)
  if not counted(j, t) then return t, idx(j, t), n end
  if U[j] + n <= N[j] then
    local start = I[j] * W[j]
    if start < t then start = t end
    return start, I[j], U[j] + n
  end
  return (I[j] + 1) * W[j], I[j] + 1, n
end

local function reply(allowed, at)
  local r = {allowed, at, now}
  for j = 1, k do r[#r + 1] = I[j]; r[#r + 1] = U[j] end
  return r
end

-- write stores the state, expiring when its latest window ends: in real time at that
-- time (PXAT, in ms rounded up), exactly, whenever Redis samples its own clock (a TTL,
-- PX, is added to a millisecond of Redis' own, which put the expiry a millisecond off
-- the window's end in about one write in a hundred); under a virtual now, a TTL (PX) an
-- hour longer.
local function write()
  local last = 0
  for j = 1, k do
    local e = (I[j] + 1) * W[j]
    if U[j] > 0 and e > last then last = e end
  end
  local parts = {}
  for j = 1, k do parts[#parts + 1] = string.format('%d %d', I[j], U[j]) end
  if virtual then
    local ms = math.ceil((last - now) / 1000)
    if ms < 1 then ms = 1 end
    redis.call('SET', KEYS[1], table.concat(parts, ' '), 'PX', ms + 3600000)
  else
    local at = math.ceil(last / 1000)
    local soonest = math.floor(now / 1000) + 1
    if at < soonest then at = soonest end
    redis.call('SET', KEYS[1], table.concat(parts, ' '), 'PXAT', string.format('%d', at))
  end
end

if op == 'd' then
  local n, maxDelay = tonumber(argv[f]), tonumber(argv[f + 1])
  local at = now
  for j = 1, k do
    local a = slot(j, now, n)
    if a > at then at = a end
  end
  if n == 0 then return reply(1, now) end
  if at - now > maxDelay then return reply(0, at) end
  for j = 1, k do
    local _, i, u = slot(j, at, n)
    I[j], U[j] = i, u
  end
  write()
  return reply(1, at)
elseif op == 's' then
  local delta = tonumber(argv[f])
  for j = 1, k do
    local cur = idx(j, now)
    if delta > 0 then
      if not counted(j, now) then I[j], U[j] = cur, 0 end
      U[j] = math.min(N[j], U[j] + delta)
    elseif delta < 0 and I[j] == tonumber(argv[f + j]) and I[j] >= cur then
      U[j] = math.max(0, U[j] + delta)
    end
  end
  write()
  return reply(1, now)
elseif op == 'p' then
  local untl, p = now + tonumber(argv[f]), tonumber(argv[f + 1])
  local iu = idx(p, untl)
  if I[p] <= iu then I[p], U[p] = iu, N[p] end
  write()
  return reply(1, now)
end
return redis.error_reply('sluice window: unknown operation ' .. tostring(op))
