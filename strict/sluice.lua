-- Sluice, Redis mode, state format 1: GCRA decisions, atomically, with the arithmetic of
-- the Go core (package gcra: Decide, Adjust, Penalize) in integer nanoseconds. Keep in
-- step with gcra.go; the differential test compares the two.
--
-- Batches. One call decides a batch: any number of operations ("records") on one or more
-- keys, all at one `now`. Each key's state is read once and written at most once, and its
-- records are applied in the order given (the order the calls arrived in); records on
-- different keys do not interact, so the batch is the same as running the calls one by one
-- in that order at that instant. The caller puts only keys of one server in a call: in
-- Redis Cluster, one key (see groupingOf in pipeline.go).
--
-- Numbers. Lua numbers are doubles, exact for integers below 2^53, and Unix nanoseconds
-- (about 1.8e18) are far above that. Every time and duration is therefore a pair (s, ns)
-- of whole seconds and 0 <= ns < 1e9, value = s*1e9 + ns: the caller passes each as two
-- arguments, the state stores each as two fields, replies carry each as two integers.
-- Sums, differences, comparisons and maxima of pairs are exact over the whole int64 range
-- (s stays below 2^34). The script multiplies or divides only a ramp's numbers (an 'r'
-- record's, all below 2^53: see rise): the caller passes n*T per limit, and derives
-- Remaining and ResetAfter from the TATs returned. It is written for
-- speed (it runs on Redis' one thread): no number formatting but two string.format per
-- key written, one pattern match per key read, tables made at their usual size (growing
-- one costs more than a decision), and shortcuts, inline and before any helper is made,
-- for the commonest calls: an allowance or a decision under one limit, alone or in a
-- batch of distinct keys (a lean batch). Each shortcut writes a key as soon as it is
-- decided, and the commands a Redis call makes cost the most: a shortcut's decision is
-- a GET (or its share of one MGET) and a SET, and its batch one TIME. The general path
-- has four small helpers (expiry, late, charge, allowed) and no other closures.
--
-- KEYS     the batch's keys, each holding a key's state "1 HOLD TAT1 [TAT2 ...]" with each
--          time as "s ns": the format, the end of the key's latest penalty (0 0 if none),
--          one TAT per limit.
-- ARGV[1]  '' to read Redis TIME and reply without now; '+' to read Redis TIME and reply
--          with now; or "s ns", a virtual now (tests only), replying with it. Real time
--          may run ahead of a virtual now, so keys written with one get an hour's extra TTL.
-- Then for each key, in KEYS order: the number of its records, and its records; or '=',
-- short for 1 record: '='. A record is an operation and its fields, or '=': the previous
-- record's operation and fields again.
--   a  allow:    one permit now or never under one limit: Tau, T (pairs). Result: 1 or 0.
--   d  decide:   n, maxDelay (pair), k, then per limit Tau, n*T (pairs). Result: allowed,
--                delay (RetryAfter when denied) and TAT1..TATk (pairs).
--   r  decide on a ramp: as d, each limit's Tau and n*T (those at now) followed by its
--                ramp (gcra.Rise): Elapsed, Over, Rate0, Period0, Rate, Period, Burst,
--                Interval, Margin (numbers; Over 0: the limit does not ramp). A booking is
--                spaced at the limit in force where it falls (see rise below). Result: d's.
--   s  settle:   1 (charge), -1 (refund) or 0, k, p, Tau_p - T_p (pair), then per limit the
--                charge or refund and the ticket's TAT after the grant (pairs). p is the
--                limit a penalty drains (the smallest Tau). Result: 1.
--   p  penalize: d (pair), k, p, Tau_p - T_p (pair). Result: 1.
-- The reply: now (a pair) if asked for, then each record's result in the order given; a
-- record on a key holding something else than format-1 state gets the error's text
-- instead of its result. A reply of one element is sent bare, not as a list.
--
-- A key expires when it is idle (every TAT and the hold in the past): a missing key is
-- exactly a fresh one, so expiry changes no decision. Denials and queries write nothing,
-- and every write happens after every record is decided, so an error (which only bad
-- arguments can raise) leaves no trace.
--
-- The expiry mark. In real time, the commonest writes (an allowance's, alone or in a lean
-- batch, and a decision's under one limit) write the common state (no penalty, one limit)
-- with its hold as '0 00' instead of '0 0': "1 0 00 s ns". The mark says the key expires
-- exactly at the start of second s + 2 (Unix, PXAT (s + 2) * 1000): between one and two
-- seconds after its TAT, so never before it is idle, and at least a second after the
-- write (MINTTL). A marked write whose new TAT is in the same second s as the marked
-- value it replaces keeps the key's expiry (SET ... KEEPTTL), which is that very time;
-- otherwise it sets it. Keeping it costs Redis less than setting it (the old expiry's
-- removal and the new one's insertion: a fifth of a 32-key lean batch's script time).
-- '00' reads as 0 wherever a hold is read, and format-1 scripts from before the mark read
-- such a key by their general pattern, exactly, and write it back unmarked with their own
-- expiry; an unmarked key's expiry is never kept, whoever wrote it.

local B = 1000000000
local tonumber, argv, keys = tonumber, ARGV, KEYS
-- The paths for the commonest calls turn a string of digits into a number by arithmetic
-- (s + 0): tonumber(s)'s conversion without its function call, which costs Redis as much
-- again.
local match, format, ceil = string.match, string.format, math.ceil
-- A key lives at least this long (ms) after its last write (after the now of the script
-- that wrote it, for a marked write), however soon it is idle: an idle key decides
-- exactly as a missing one, and a key used more often than this is then overwritten in
-- place rather than expired and made again (on a fast limit, whose keys are idle within
-- microseconds, that churn made a decision cost Redis twice the time). The expiry mark's
-- rule gives at least this much by itself.
local MINTTL = 1000

local nh, nl
local virtual = false
local mode = argv[1]
if mode == '' or mode == '+' then
  local t = redis.call('TIME')
  nh, nl = t[1] + 0, t[2] * 1000
else
  local a, b = match(mode, '^(%-?%d+) (%d+)$')
  nh, nl = tonumber(a), tonumber(b)
  virtual = true
end

-- The lean path: a lone allowance (argv: mode, 1, 'a', Tau, T), the commonest call
-- (Limiter.Allow with nothing else queued), on a key in the common state (no penalty,
-- one limit) or none, decided here, first and inline: no helper is made for it (making
-- the closures below costs it a tenth of its time at Redis). It is the 'a' record of the
-- general path below, written out; a key in another state goes on there with its value
-- (first) read.
local first -- the lone key's value, once read (false: missing)
if #argv == 7 and argv[3] == 'a' and #keys == 1 then
  first = redis.pcall('GET', keys[1])
  local th, tl
  local mh = false -- the TAT's second of a marked value
  if not first then
    th, tl = 0, 0
  elseif type(first) == 'string' then
    local z, c, d = match(first, '^1 0 (00?) (%-?%d+) (%d+)$')
    if c then
      th, tl = c + 0, d + 0
      if z == '00' then mh = th end
    end
  end
  if th then
    -- x = max(tat, now) + T; granted if x - Tau <= now.
    if th < nh or (th == nh and tl < nl) then th, tl = nh, nl end
    th, tl = th + argv[6], tl + argv[7]
    if tl >= B then th, tl = th + 1, tl - B end
    local zh, zl = th - argv[4], tl - argv[5]
    if zl < 0 then zh, zl = zh - 1, zl + B end
    local r = 0
    if not (nh < zh or (nh == zh and nl < zl)) then
      -- Granted: the TAT x is after now, so the key is not idle.
      if virtual then
        -- Unmarked, its TTL as expiry() below says.
        local dh, dl = th - nh, tl - nl
        if dl < 0 then dh, dl = dh - 1, dl + B end
        local ms = dh * 1000 + ceil(dl / 1000000)
        if ms < MINTTL then ms = MINTTL end
        ms = ms + 3600000
        redis.call('SET', keys[1], format('1 0 0 %d %d', th, tl), 'PX', format('%d', ms))
      elseif mh == th then
        redis.call('SET', keys[1], format('1 0 00 %d %d', th, tl), 'KEEPTTL')
      else
        redis.call('SET', keys[1], format('1 0 00 %d %d', th, tl), 'PXAT', format('%d', (th + 2) * 1000))
      end
      r = 1
    end
    if mode == '' then return r end
    return { nh, nl, r }
  end
end

-- The lone decision: a decision under one limit alone (argv: mode, 1, 'd', n, maxDelay,
-- 1, Tau, n*T), the commonest call behind Envoy's API (Limiter.AllowN with nothing else
-- queued), on a key in the common state or none, decided here with the arithmetic inline,
-- before any helper is made (as the lone allowance above). It is the 'd' record of the
-- general path below, written out; a key in another state goes on there with its value
-- (first) read.
if #argv == 11 and argv[3] == 'd' and argv[7] == '1' and #keys == 1 then
  first = redis.pcall('GET', keys[1])
  local th, tl
  local mh = false -- the TAT's second of a marked value
  if not first then
    th, tl = 0, 0
  elseif type(first) == 'string' then
    local z, c, d = match(first, '^1 0 (00?) (%-?%d+) (%d+)$')
    if c then
      th, tl = c + 0, d + 0
      if z == '00' then mh = th end
    end
  end
  if th then
    local ch, cl = argv[10] + 0, argv[11] + 0
    -- delay = max(0, max(tat, now) + n*T - Tau - now) if n > 0, else 0.
    local dh, dl = 0, 0
    if argv[4] ~= '0' then
      local xh, xl = th, tl
      if xh < nh or (xh == nh and xl < nl) then xh, xl = nh, nl end
      xh, xl = xh + ch - argv[8] - nh, xl + cl - argv[9] - nl
      if xl < 0 then
        xh, xl = xh - 1, xl + B
        if xl < 0 then xh, xl = xh - 1, xl + B end
      elseif xl >= B then
        xh, xl = xh + 1, xl - B
      end
      if xh >= 0 then dh, dl = xh, xl end
    end
    local wh, wl = argv[5] + 0, argv[6] + 0
    local r = 1
    if wh < dh or (wh == dh and wl < dl) then
      r = 0
    elseif argv[4] ~= '0' then
      -- Granted: tat = max(tat, now + delay) + n*T, after now, so the key is not idle.
      local ah, al = nh + dh, nl + dl
      if al >= B then ah, al = ah + 1, al - B end
      if th < ah or (th == ah and tl < al) then th, tl = ah, al end
      th, tl = th + ch, tl + cl
      if tl >= B then th, tl = th + 1, tl - B end
      if virtual then
        -- Unmarked, its TTL as expiry() below says.
        local eh, el = th - nh, tl - nl
        if el < 0 then eh, el = eh - 1, el + B end
        local ms = eh * 1000 + ceil(el / 1000000)
        if ms < MINTTL then ms = MINTTL end
        ms = ms + 3600000
        redis.call('SET', keys[1], format('1 0 0 %d %d', th, tl), 'PX', format('%d', ms))
      elseif mh == th then
        redis.call('SET', keys[1], format('1 0 00 %d %d', th, tl), 'KEEPTTL')
      else
        redis.call('SET', keys[1], format('1 0 00 %d %d', th, tl), 'PXAT', format('%d', (th + 2) * 1000))
      end
    end
    if mode == '' then return { r, dh, dl, th, tl } end
    return { nh, nl, r, dh, dl, th, tl }
  end
end

local nkeys = #keys

local out, no
if mode == '' then
  out, no = { 0 }, 0
else
  out, no = { nh, nl, 0 }, 2
end


-- With several keys, the states are read with MGET, in chunks (unpack's limit). MGET
-- gives nil (false) for a key that holds another type, as for a missing one. The lean
-- batches below need not tell them apart: they write such a key with SET ... GET, which
-- refuses a key of another type (WRONGTYPE) and writes nothing, and take its error as
-- the record's result. The general path tells them apart before it decides (EXISTS).
local vals
-- The first key whose value, if MGET read nothing, may be of another type: before it, a
-- lean batch that stopped has told them apart (with SET ... GET), and vals says.
local unsure = 1
if nkeys > 1 then
  for c = 1, nkeys, 1000 do
    local e = math.min(c + 999, nkeys)
    local got = redis.call('MGET', unpack(keys, c, e))
    if c == 1 then
      vals = got
    else
      for j = 1, e - c + 1 do vals[c + j - 1] = got[j] end
    end
  end
end

-- vttl is the TTL (PX), as text, of a key written under a virtual now whose TAT is (h, l)
-- > now, as expiry() below says; nil in real time.
local vttl
if virtual and nkeys > 1 then
  vttl = function(h, l)
    local dh, dl = h - nh, l - nl
    if dl < 0 then dh, dl = dh - 1, dl + B end
    local ms = dh * 1000 + ceil(dl / 1000000)
    if ms < MINTTL then ms = MINTTL end
    return format('%d', ms + 3600000)
  end
end

-- The lean batches below decide each key and write it at once (there is no later record
-- on it). If a key turns out to be in another state than the common one, they stop and
-- the general path decides the whole batch from the values read (and what SET ... GET
-- found of the keys MGET read nothing at), as if they had not run: it decides the keys
-- they wrote as they did (same state, same now, same records) and writes the same TATs
-- again (unmarked).

-- The lean batch: every key once, each with one allowance under the same limit (argv:
-- mode, 1, 'a', Tau, T, then '=' for each further key; no other shape has that many
-- arguments): Limiter.Allow from many goroutines on many keys. If every key is in the
-- common state or none, the batch is decided here in one pass with the arithmetic inline
-- (the general path below spends about twice as long per key).
--
-- In real time its writes are marked (see the expiry mark above): each keeps the key's
-- expiry or sets it as a time (PXAT), one string for every key whose TAT is in now's
-- second (all of them, on a fast limit). Under a virtual now, unmarked, as expiry() says.
if nkeys > 1 and #argv == nkeys + 6 and argv[2] == '1' and argv[3] == 'a' then
  local uh, ul, ch, cl = argv[4] + 0, argv[5] + 0, argv[6] + 0, argv[7] + 0
  local soon = format('%d', (nh + 2) * 1000)
  local o = no
  local common = true
  for ki = 1, nkeys do
    -- x = max(tat, now) + T (a missing key's tat is 0 0); granted if x - Tau <= now (the
    -- 'a' record below).
    local v = vals[ki]
    local xh, xl = 0, 0
    local mh = false -- the TAT's second of a marked value
    if v then
      local z, c, d
      if type(v) == 'string' then z, c, d = match(v, '^1 0 (00?) (%-?%d+) (%d+)$') end
      if not c then
        common, unsure = false, ki
        break
      end
      xh, xl = c + 0, d + 0
      if z == '00' then mh = xh end
    end
    if xh < nh or (xh == nh and xl < nl) then xh, xl = nh, nl end
    xh, xl = xh + ch, xl + cl
    if xl >= B then xh, xl = xh + 1, xl - B end
    local zh, zl = xh - uh, xl - ul
    if zl < 0 then zh, zl = zh - 1, zl + B end
    if not (nh < zh or (nh == zh and nl < zl)) then
      -- Granted: the TAT x is after now, so the key is not idle.
      out[o + ki] = 1
      local s, ex, at
      if vttl then
        s, ex, at = format('1 0 0 %d %d', xh, xl), 'PX', vttl(xh, xl)
      else
        s, ex = format('1 0 00 %d %d', xh, xl), 'PXAT'
        if mh ~= xh then at = xh == nh and soon or format('%d', (xh + 2) * 1000) end
      end
      if not v then
        local r = redis.pcall('SET', keys[ki], s, ex, at, 'GET')
        if type(r) == 'table' then out[o + ki], vals[ki] = r.err, r end
      elseif at then
        redis.call('SET', keys[ki], s, ex, at)
      else
        redis.call('SET', keys[ki], s, 'KEEPTTL')
      end
    elseif v then
      out[o + ki] = 0
    else
      -- A fresh key denied (never, with checked arguments): the general path finds
      -- whether it holds another type.
      common, unsure = false, ki
      break
    end
  end
  if common then return out end
end

-- The lean batch of decisions: every key once, each with one decision of n > 0 permits
-- under the same limit and with the same maxDelay (argv: mode, 1, 'd', n, maxDelay, 1,
-- Tau, n*T, then '=' for each further key; no other shape has that many arguments):
-- Limiter.AllowN from concurrent callers on many keys, as behind Envoy's API. As the lean
-- batch above, and each record's result is the 'd' record's: allowed, delay and the TAT.
-- A fresh key's decision (n at most the burst) is a grant.
if nkeys > 1 and #argv == nkeys + 10 and argv[2] == '1' and argv[3] == 'd' and argv[7] == '1' and argv[4] ~= '0' then
  local wh, wl = argv[5] + 0, argv[6] + 0
  local uh, ul, ch, cl = argv[8] + 0, argv[9] + 0, argv[10] + 0, argv[11] + 0
  local soon = format('%d', (nh + 2) * 1000)
  local o = no
  local common = true
  for ki = 1, nkeys do
    local v = vals[ki]
    local th, tl = 0, 0
    local mh = false -- the TAT's second of a marked value
    if v then
      local z, c, d
      if type(v) == 'string' then z, c, d = match(v, '^1 0 (00?) (%-?%d+) (%d+)$') end
      if not c then
        common, unsure = false, ki
        break
      end
      th, tl = c + 0, d + 0
      if z == '00' then mh = th end
    end
    -- delay = max(0, max(tat, now) + n*T - Tau - now)
    local dh, dl = th, tl
    if dh < nh or (dh == nh and dl < nl) then dh, dl = nh, nl end
    dh, dl = dh + ch - uh - nh, dl + cl - ul - nl
    if dl < 0 then
      dh, dl = dh - 1, dl + B
      if dl < 0 then dh, dl = dh - 1, dl + B end
    elseif dl >= B then
      dh, dl = dh + 1, dl - B
    end
    if dh < 0 then dh, dl = 0, 0 end
    local r = 1
    if wh < dh or (wh == dh and wl < dl) then
      if not v then
        -- A fresh key denied (never, with checked arguments): see the lean batch above.
        common, unsure = false, ki
        break
      end
      r = 0
    else
      -- Granted: tat = max(tat, now + delay) + n*T, after now, so the key is not idle.
      local ah, al = nh + dh, nl + dl
      if al >= B then ah, al = ah + 1, al - B end
      if th < ah or (th == ah and tl < al) then th, tl = ah, al end
      th, tl = th + ch, tl + cl
      if tl >= B then th, tl = th + 1, tl - B end
      local s, ex, at
      if vttl then
        s, ex, at = format('1 0 0 %d %d', th, tl), 'PX', vttl(th, tl)
      else
        s, ex = format('1 0 00 %d %d', th, tl), 'PXAT'
        if mh ~= th then at = th == nh and soon or format('%d', (th + 2) * 1000) end
      end
      if not v then
        local e = redis.pcall('SET', keys[ki], s, ex, at, 'GET')
        if type(e) == 'table' then r, vals[ki] = e.err, e end
      elseif at then
        redis.call('SET', keys[ki], s, ex, at)
      else
        redis.call('SET', keys[ki], s, 'KEEPTTL')
      end
    end
    if r == 0 or r == 1 then
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = r, dh, dl, th, tl
      o = o + 5
    else
      -- A key of another type: its result is the error's text.
      out[o + 1] = r
      o = o + 1
    end
  end
  if common then return out end
end


-- expiry is the expiry, as text for the SET option EX, of an unmarked key whose latest
-- time is (h, l) > now. In real time a time (PXAT): the later of (h, l) and MINTTL after
-- now, in ms rounded up, so never before (h, l) whatever Redis' own millisecond (a TTL,
-- PX, is added to Redis' clock truncated to the ms, which expired keys up to a
-- millisecond before their TAT). Under a virtual now a TTL (PX): until (h, l), rounded
-- up, at least MINTTL, and an hour more.
local EX = virtual and 'PX' or 'PXAT'
local soonms = nh * 1000 + ceil(nl / 1000000) + MINTTL -- real time: MINTTL from now, in ms
local soonest -- the commonest expiry (MINTTL from now), formatted once
if virtual then
  soonest = format('%d', MINTTL + 3600000)
else
  soonest = format('%d', soonms)
end
local function expiry(h, l)
  if virtual then
    local dh, dl = h - nh, l - nl
    if dl < 0 then dh, dl = dh - 1, dl + B end
    local ms = dh * 1000 + ceil(dl / 1000000)
    if ms <= MINTTL then return soonest end
    return format('%d', ms + 3600000)
  end
  local ms = h * 1000 + ceil(l / 1000000)
  if ms <= soonms then return soonest end
  return format('%d', ms)
end

-- late is how far past now a decision of cost c (n*T) under one limit would have to wait
-- with the limit's TAT t and tolerance u: max(t, now) + c - u - now, a pair (negative when
-- it need not wait: its seconds may be negative, its nanoseconds are in [0, 1e9)).
local function late(th, tl, uh, ul, ch, cl)
  if th < nh or (th == nh and tl < nl) then th, tl = nh, nl end
  local xh, xl = th + ch - uh - nh, tl + cl - ul - nl
  -- xl is in (-2e9, 2e9): bring it into [0, 1e9).
  if xl < 0 then
    xh, xl = xh - 1, xl + B
    if xl < 0 then xh, xl = xh - 1, xl + B end
  elseif xl >= B then
    xh, xl = xh + 1, xl - B
  end
  return xh, xl
end

-- allowed reports whether one permit may be taken now under a limit of tolerance u whose
-- TAT after the grant would be x: x - u <= now.
local function allowed(xh, xl, uh, ul)
  local zh, zl = xh - uh, xl - ul
  if zl < 0 then zh, zl = zh - 1, zl + B end
  return not (nh < zh or (nh == zh and nl < zl))
end

-- MAXH, MAXL is gcra.MaxTAT (2^63 - 1 - 2^61): a settlement's charge and a penalty's end
-- saturate there, as in gcra.Adjust and gcra.Penalize.
local MAXH, MAXL = 6917529027, 641081855

-- charge is a limit's TAT after a grant of cost c used at a: max(t, a) + c.
local function charge(th, tl, ah, al, ch, cl)
  if th < ah or (th == ah and tl < al) then th, tl = ah, al end
  th, tl = th + ch, tl + cl
  if tl >= B then th, tl = th + 1, tl - B end
  return th, tl
end

-- An operation's fields (but an allowance's), read from its record.
local f

-- rise is the emission interval and tolerance of the ramped limit whose fields start at
-- f[o + 1] (an 'r' record's), d nanoseconds after now: gcra.Rise.At, the same operations
-- in the same order (doubles, exact below 2^53, which the caller's checks ensure, and one
-- rounding each where rates are divided), so the very same numbers.
local floor = math.floor
local function rise(o, d)
  local over = f[o + 6]
  if d > over then d = over end
  local e = f[o + 5] + d
  local t, b
  if e >= over then
    t, b = f[o + 12], f[o + 11]
  else
    local r0 = f[o + 7] / f[o + 8]
    local r1 = f[o + 9] / f[o + 10]
    local rate = r0 + (r1 - r0) * e / over
    t = ceil(1 / rate)
    if t < f[o + 12] then t = f[o + 12] end
    b = floor(f[o + 11] * rate / r1)
    if b < 1 then b = 1 end
  end
  local m = f[o + 13]
  if m == 0 then return t, b * t end
  local kk = floor((m + t - 1) / t)
  if kk < b then return t, (b - kk) * t end
  local t2 = t + m - (b - 1) * t
  return t2, t2
end

-- The charges (n*T, pairs) of an 'r' record's limits, as its booking spaces them.
local rh, rl = { 0, 0, 0, 0 }, { 0, 0, 0, 0 }

local i = 2
-- The operation in force ('=' repeats it): op, k, and its fields: Tau and T of 'a' in
-- locals, the others' in f.
local op, k = nil, 1
local a1, a2, a3, a4
-- The key in hand's TATs (pairs): n of them, those beyond fresh (0 0).
local th, tl = { 0, 0, 0, 0 }, { 0, 0, 0, 0 }
local n = 0
-- The general path reads again, with GET, each key MGET read nothing at if EXISTS finds
-- more keys than MGET values, for its error (from the first unsure key: a stopped lean
-- batch may have written those before it).
if nkeys > 1 then
  for c = unsure, nkeys, 1000 do
    local e = math.min(c + 999, nkeys)
    local found = 0
    for j = c, e do
      if vals[j] then found = found + 1 end
    end
    if found <= e - c and redis.call('EXISTS', unpack(keys, c, e)) > found then
      for j = c, e do
        if not vals[j] then vals[j] = redis.pcall('GET', keys[j]) end
      end
    end
  end
end

-- With several keys, the general path's writes wait until every record is decided: each
-- key's new value (false: delete) and TTL; a lone key is written once its records are
-- decided.
local wv, wt
if nkeys > 1 then
  wv, wt = {}, {}
  -- A lean batch that stopped may have written some of the reply: it is written anew.
  for j = no + 1, #out do out[j] = nil end
end

for ki = 1, nkeys do
  local key = keys[ki]
  local cnt, again = argv[i], false
  if cnt == '=' then
    cnt, again = 1, true
  elseif cnt == '1' then
    cnt = 1
  else
    cnt = tonumber(cnt)
  end
  i = i + 1

  -- Read the state: hold, and n TATs (the previous key's are cleared).
  for j = 1, n do th[j], tl[j] = 0, 0 end
  local hh, hl
  hh, hl, n = 0, 0, 0
  local err
  local v
  if nkeys > 1 then
    v = vals[ki]
  elseif first ~= nil then
    v = first
  else
    v = redis.pcall('GET', key)
  end
  local existed = v
  if v then
    if type(v) == 'table' then
      err = v.err
    else
      -- The common state first: no penalty, one limit (marked or not).
      local c, d = match(v, '^1 0 00? (%-?%d+) (%d+)$')
      if c then
        th[1], tl[1], n = tonumber(c), tonumber(d), 1
      else
        local f0, a, b
        f0, a, b, c, d = match(v, '^(%d+) (%-?%d+) (%d+) (%-?%d+) (%d+)')
        if f0 == '1' then
          hh, hl, th[1], tl[1], n = tonumber(a), tonumber(b), tonumber(c), tonumber(d), 1
          for x, y in string.gmatch(string.sub(v, #f0 + #a + #b + #c + #d + 5), ' (%-?%d+) (%d+)') do
            if n == 4 then break end
            n = n + 1
            th[n], tl[n] = tonumber(x), tonumber(y)
          end
          -- A penalty no longer in force is forgotten.
          if hh < nh or (hh == nh and hl <= nl) then hh, hl = 0, 0 end
        else
          local got = match(v, '^%S*')
          if got == '1' then
            err = 'sluice: key ' .. key .. ' holds malformed state'
          else
            err = 'sluice: key ' .. key .. ' holds state format ' .. got .. ', this script reads format 1'
          end
        end
      end
    end
  end

  local dirty = false
  for _ = 1, cnt do
    local o = '='
    if not again then
      o = argv[i]
      i = i + 1
    end
    if o ~= '=' then
      op = o
      if o == 'a' then
        a1, a2, a3, a4 = tonumber(argv[i]), tonumber(argv[i + 1]), tonumber(argv[i + 2]), tonumber(argv[i + 3])
        i = i + 4
        k = 1
      else
        f = f or { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
        if o == 'd' then
          k = tonumber(argv[i + 3])
          for j = 1, 4 + 4 * k do f[j] = tonumber(argv[i + j - 1]) end
          i = i + 4 + 4 * k
        elseif o == 'r' then
          k = tonumber(argv[i + 3])
          for j = 1, 4 + 13 * k do f[j] = tonumber(argv[i + j - 1]) end
          i = i + 4 + 13 * k
        elseif o == 's' then
          k = tonumber(argv[i + 1])
          for j = 1, 5 + 4 * k do f[j] = tonumber(argv[i + j - 1]) end
          i = i + 5 + 4 * k
        elseif o == 'p' then
          for j = 1, 6 do f[j] = tonumber(argv[i + j - 1]) end
          i = i + 6
          k = f[3]
        else
          return redis.error_reply('sluice: unknown operation ' .. tostring(o))
        end
      end
    end

    local write = false
    no = no + 1
    if err then
      out[no] = err
    elseif op == 'a' then
      -- One permit now or never: granted if max(tat, now) + T - Tau <= now.
      local xh, xl = charge(th[1], tl[1], nh, nl, a3, a4)
      if not allowed(xh, xl, a1, a2) then
        out[no] = 0
      else
        th[1], tl[1] = xh, xl
        out[no] = 1
        write = true
      end
    elseif op == 'd' then
      -- delay = max(0, max over limits of max(tat, now) + n*T - Tau - now); limit j's
      -- Tau is f[4j+1, 4j+2], its n*T f[4j+3, 4j+4].
      local dh, dl = 0, 0
      if f[1] > 0 then
        for j = 1, k do
          local xh, xl = late(th[j], tl[j], f[4 * j + 1], f[4 * j + 2], f[4 * j + 3], f[4 * j + 4])
          if dh < xh or (dh == xh and dl < xl) then dh, dl = xh, xl end
        end
      end
      local granted = not (f[2] < dh or (f[2] == dh and f[3] < dl))
      if granted and f[1] > 0 then
        local ah, al = nh + dh, nl + dl
        if al >= B then ah, al = ah + 1, al - B end
        for j = 1, k do
          th[j], tl[j] = charge(th[j], tl[j], ah, al, f[4 * j + 3], f[4 * j + 4])
        end
        write = true
      end
      if granted then out[no] = 1 else out[no] = 0 end
      out[no + 1], out[no + 2] = dh, dl
      no = no + 2
      for j = 1, k do
        out[no + 1], out[no + 2] = th[j], tl[j]
        no = no + 2
      end
    elseif op == 'r' then
      -- As 'd', but a ramped limit j (fields from f[o + 1], o = 4 + 13(j - 1)) spaces the
      -- booking at its limit at x = max(now, tat - Tau) (Tau at now), and the slot is never
      -- before x (gcra's waitAt): the booking follows the ramp where it falls.
      local dh, dl = 0, 0
      for j = 1, k do
        local o = 4 + 13 * (j - 1)
        local uh, ul, ch, cl = f[o + 1], f[o + 2], f[o + 3], f[o + 4]
        local xh, xl = 0, 0 -- x - now
        if f[o + 6] > 0 then
          local yh, yl = th[j] - uh - nh, tl[j] - ul - nl
          if yl < 0 then
            yh, yl = yh - 1, yl + B
            if yl < 0 then yh, yl = yh - 1, yl + B end
          end
          if yh >= 0 then xh, xl = yh, yl end
          -- x - now as a number: exact below 2^53 ns (104 days); a ramp is shorter.
          local d = f[o + 6]
          if xh < 9000000 then d = xh * B + xl end
          local t, tau = rise(o, d)
          local c = f[1] * t
          ch = floor(c / B)
          cl = c - ch * B
          uh = floor(tau / B)
          ul = tau - uh * B
        end
        rh[j], rl[j] = ch, cl
        if f[1] > 0 then
          local wh, wl = late(th[j], tl[j], uh, ul, ch, cl)
          if wh < xh or (wh == xh and wl < xl) then wh, wl = xh, xl end
          if dh < wh or (dh == wh and dl < wl) then dh, dl = wh, wl end
        end
      end
      local granted = not (f[2] < dh or (f[2] == dh and f[3] < dl))
      if granted and f[1] > 0 then
        local ah, al = nh + dh, nl + dl
        if al >= B then ah, al = ah + 1, al - B end
        for j = 1, k do
          th[j], tl[j] = charge(th[j], tl[j], ah, al, rh[j], rl[j])
        end
        write = true
      end
      if granted then out[no] = 1 else out[no] = 0 end
      out[no + 1], out[no + 2] = dh, dl
      no = no + 2
      for j = 1, k do
        out[no + 1], out[no + 2] = th[j], tl[j]
        no = no + 2
      end
    else
      -- settle or penalize: the end of a penalty u in force drains limit p to
      -- u + Tau_p - T_p (gcra.Penalize); s reapplies the key's, p adds one.
      local uh, ul, p, oh, ol
      if op == 's' then
        -- Per limit j: the change at f[4j+2, 4j+3], the TAT after at f[4j+4, 4j+5].
        local sign = f[1]
        for j = 1, k do
          local ch, cl = f[4 * j + 2], f[4 * j + 3]
          if sign > 0 then
            -- A charge: tat = max(tat, now) + extra, saturated at MaxTAT (never lowered).
            local xh, xl = charge(th[j], tl[j], nh, nl, ch, cl)
            if xh > MAXH or (xh == MAXH and xl > MAXL) then xh, xl = MAXH, MAXL end
            if th[j] < xh or (th[j] == xh and tl[j] < xl) then th[j], tl[j] = xh, xl end
          elseif sign < 0 then
            -- A refund, only by the newest grant on the key (tat = tatAfter: nothing
            -- granted, charged or penalized since) and only before its slot has passed
            -- (now < tatAfter): tat = tat - refund (gcra.Adjust says why).
            local ah, al = f[4 * j + 4], f[4 * j + 5]
            if th[j] == ah and tl[j] == al and (nh < ah or (nh == ah and nl < al)) then
              local yh, yl = ah - ch, al - cl
              if yl < 0 then yh, yl = yh - 1, yl + B end
              th[j], tl[j] = yh, yl
            end
          end
        end
        uh, ul, p, oh, ol = hh, hl, f[3], f[4], f[5]
      else
        uh, ul = nh + f[1], nl + f[2]
        if ul >= B then uh, ul = uh + 1, ul - B end
        if uh > MAXH or (uh == MAXH and ul > MAXL) then uh, ul = MAXH, MAXL end
        if hh < uh or (hh == uh and hl < ul) then hh, hl = uh, ul end
        p, oh, ol = f[4], f[5], f[6]
      end
      if nh < uh or (nh == uh and nl < ul) then
        local xh, xl = uh + oh, ul + ol
        if xl >= B then xh, xl = xh + 1, xl - B end
        if th[p] < xh or (th[p] == xh and tl[p] < xl) then th[p], tl[p] = xh, xl end
      end
      out[no] = 1
      write = true
    end

    if write then
      -- The state is now the hold and k TATs. If it is idle, it is deleted below; until
      -- then it decides exactly as the fresh state that replaces it would.
      dirty = true
      for j = k + 1, n do th[j], tl[j] = 0, 0 end
      n = k
    end
  end

  if dirty then
    -- The latest of the hold and the TATs: the key is idle once it has passed.
    local mh, ml = hh, hl
    for j = 1, n do
      if mh < th[j] or (mh == th[j] and ml < tl[j]) then mh, ml = th[j], tl[j] end
    end
    if nh < mh or (nh == mh and nl < ml) then
      local s
      if n == 1 then
        s = format('1 %d %d %d %d', hh, hl, th[1], tl[1])
      else
        s = format('1 %d %d', hh, hl)
        for j = 1, n do s = s .. format(' %d %d', th[j], tl[j]) end
      end
      if nkeys == 1 then
        redis.call('SET', key, s, EX, expiry(mh, ml))
      else
        wv[ki], wt[ki] = s, expiry(mh, ml)
      end
    elseif existed then
      if nkeys == 1 then
        redis.call('DEL', key)
      else
        wv[ki] = false
      end
    end
  end
end

if nkeys > 1 then
  for ki = 1, nkeys do
    local v = wv[ki]
    if v then
      redis.call('SET', keys[ki], v, EX, wt[ki])
    elseif v == false then
      redis.call('DEL', keys[ki])
    end
  end
end
if no == 1 then return out[1] end
return out
