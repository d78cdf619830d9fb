-- Sluice, Redis mode, state format 1: GCRA decisions for one key, atomically, with the
-- arithmetic of the Go core (package gcra: Decide, Adjust, Penalize) in integer
-- nanoseconds. Keep in step with gcra.go; the differential test compares the two.
--
-- Numbers. Lua numbers are doubles, exact for integers below 2^53, and Unix nanoseconds
-- (about 1.8e18) are far above that. Every time and duration is therefore a pair (s, ns)
-- of whole seconds and 0 <= ns < 1e9, value = s*1e9 + ns: the caller passes each as two
-- arguments, the state stores each as two fields, replies carry each as two integers.
-- Sums, differences, comparisons and maxima of pairs are exact over the whole int64 range
-- (s stays below 2^34). The script never multiplies or divides: the caller passes n*T per
-- limit, and derives Remaining and ResetAfter from the TATs returned. It is written for
-- speed (it runs once per decision, on Redis' one thread): no string formatting, no
-- closures beyond two helpers, one pattern match to read the state.
--
-- KEYS[1]  the key's state, "1 HOLD TAT1 [TAT2 ...]" with each time as "s ns": the format,
--          the end of the key's latest penalty (0 0 if none), one TAT per limit.
-- ARGV[1]  the operation:
--   d  decide:   ARGV[4] n, [5,6] maxDelay, [7] k, then per limit Tau, n*T (pairs).
--                Reply {allowed, now, delay (RetryAfter when denied), TAT1..TATk} (pairs
--                but allowed).
--   a  allow:    one permit now or never under one limit: ARGV[4,5] Tau, [6,7] T.
--                Reply 1 (granted) or 0.
--   s  settle:   ARGV[4] 1 (charge), -1 (refund) or 0, [5] k, [6] p, [7,8] Tau_p - T_p,
--                then per limit the charge or refund, and the ticket's TAT after the grant
--                (pairs). p is the limit a penalty drains (the smallest Tau). Reply: now.
--   p  penalize: ARGV[4,5] d, [6] k, [7] p, [8,9] Tau_p - T_p. Reply: now.
-- ARGV[2,3] now, or "" "" to read Redis TIME. Only tests pass it (virtual time); real time
--          may then run ahead of it, so such keys get an hour's extra TTL.
--
-- The key expires when it is idle (every TAT and the hold in the past): a missing key is
-- exactly a fresh one, so expiry changes no decision.

local B = 1000000000

-- add returns the pair a + b.
local function add(ah, al, bh, bl)
  local h, l = ah + bh, al + bl
  if l >= B then return h + 1, l - B end
  return h, l
end

-- max returns the larger pair.
local function max(ah, al, bh, bl)
  if ah < bh or (ah == bh and al < bl) then return bh, bl end
  return ah, al
end

local key = KEYS[1]
local op = ARGV[1]
local virtual = ARGV[2] ~= ''
local nh, nl
if virtual then
  nh, nl = tonumber(ARGV[2]), tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  nh, nl = tonumber(t[1]), tonumber(t[2]) * 1000
end
local k = 1
if op == 'd' then k = tonumber(ARGV[7])
elseif op == 's' then k = tonumber(ARGV[5])
elseif op == 'p' then k = tonumber(ARGV[6]) end

-- The state: hold and one TAT per limit. A key with fewer TATs than limits (new, or its
-- limits grew) starts the others fresh; one with more keeps the first k.
local hh, hl = 0, 0
local th, tl = { 0, 0, 0, 0 }, { 0, 0, 0, 0 }
local v = redis.call('GET', key)
-- The common state: no penalty, one limit.
local c1, d1 = nil, nil
if v and k == 1 then c1, d1 = string.match(v, '^1 0 0 (%-?%d+) (%d+)') end
if c1 then
  th[1], tl[1] = tonumber(c1), tonumber(d1)
elseif v then
  local f, a, b, c, d = string.match(v, '^(%d+) (%-?%d+) (%d+) (%-?%d+) (%d+)')
  if f ~= '1' then
    local got = string.match(v, '^%S*')
    if got == '1' then return redis.error_reply('sluice: key ' .. key .. ' holds malformed state') end
    return redis.error_reply('sluice: key ' .. key .. ' holds state format ' .. got .. ', this script reads format 1')
  end
  hh, hl, th[1], tl[1] = tonumber(a), tonumber(b), tonumber(c), tonumber(d)
  if k > 1 then
    local j = 2
    for x, y in string.gmatch(string.sub(v, #f + #a + #b + #c + #d + 5), ' (%-?%d+) (%d+)') do
      if j > k then break end
      th[j], tl[j] = tonumber(x), tonumber(y)
      j = j + 1
    end
  end
end
-- A penalty no longer in force is forgotten.
if hh < nh or (hh == nh and hl <= nl) then hh, hl = 0, 0 end

-- save stores the state with a TTL that ends when the key is idle, or deletes it if it
-- already is.
local function save()
  local mh, ml = hh, hl
  local s = '1 0 0'
  if hh ~= 0 or hl ~= 0 then s = '1 ' .. hh .. ' ' .. hl end
  for j = 1, k do
    mh, ml = max(mh, ml, th[j], tl[j])
    s = s .. ' ' .. th[j] .. ' ' .. tl[j]
  end
  if mh < nh or (mh == nh and ml <= nl) then
    redis.call('DEL', key)
    return
  end
  -- The TTL in milliseconds, rounded up: (m - now) = dh s + dl ns.
  local dh, dl = mh - nh, ml - nl
  if dl < 0 then dh, dl = dh - 1, dl + B end
  local ms = dh * 1000 + math.ceil(dl / 1000000)
  if virtual then ms = ms + 3600000 end
  redis.call('SET', key, s, 'PX', tostring(ms))
end

if op == 'a' then
  -- One permit now or never, under one limit: ARGV[4,5] Tau, [6,7] T. A grant needs
  -- max(tat, now) + T - Tau <= now.
  local xh, xl = max(th[1], tl[1], nh, nl)
  local ch, cl = tonumber(ARGV[6]), tonumber(ARGV[7])
  local yh, yl = add(xh, xl, ch, cl)
  local zh, zl = yh - tonumber(ARGV[4]), yl - tonumber(ARGV[5])
  if zl < 0 then zh, zl = zh - 1, zl + B end
  if nh < zh or (nh == zh and nl < zl) then return 0 end
  th[1], tl[1] = yh, yl
  save()
  return 1
end

if op == 'd' then
  local n = tonumber(ARGV[4])
  -- delay = max(0, max over limits of max(tat, now) + n*T - Tau - now)
  local dh, dl = 0, 0
  if n > 0 then
    for j = 1, k do
      local i = 6 + 4 * j
      local xh, xl = max(th[j], tl[j], nh, nl)
      xh, xl = add(xh, xl, tonumber(ARGV[i]), tonumber(ARGV[i + 1]))
      -- minus Tau and now
      xh, xl = xh - tonumber(ARGV[i - 2]) - nh, xl - tonumber(ARGV[i - 1]) - nl
      if xl < 0 then
        xh, xl = xh - 1, xl + B
        if xl < 0 then xh, xl = xh - 1, xl + B end
      end
      dh, dl = max(dh, dl, xh, xl)
    end
  end
  local mdh, mdl = tonumber(ARGV[5]), tonumber(ARGV[6])
  local allowed = not (mdh < dh or (mdh == dh and mdl < dl))
  if allowed and n > 0 then
    local ah, al = add(nh, nl, dh, dl)
    for j = 1, k do
      local i = 6 + 4 * j
      local xh, xl = max(th[j], tl[j], ah, al)
      th[j], tl[j] = add(xh, xl, tonumber(ARGV[i]), tonumber(ARGV[i + 1]))
    end
    save()
  end
  local out = { 0, nh, nl, dh, dl }
  if allowed then out[1] = 1 end
  for j = 1, k do
    out[4 + 2 * j], out[5 + 2 * j] = th[j], tl[j]
  end
  return out
end

-- penalize is gcra.Penalize for the limit p: nothing is granted before u.
local function penalize(p, uh, ul)
  if uh < nh or (uh == nh and ul <= nl) then return end
  local xh, xl = add(uh, ul, tonumber(ARGV[#ARGV - 1]), tonumber(ARGV[#ARGV]))
  th[p], tl[p] = max(th[p], tl[p], xh, xl)
end

if op == 's' then
  -- Arguments: [4] sign, [5] k, [6] p, then per limit j: change at 7+4(j-1), TAT after
  -- at 9+4(j-1), and Tau_p - T_p last.
  local sign = tonumber(ARGV[4])
  for j = 1, k do
    local i = 3 + 4 * j
    local ch, cl = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    if sign > 0 then
      -- A charge: tat = max(tat, now) + extra.
      local xh, xl = max(th[j], tl[j], nh, nl)
      th[j], tl[j] = add(xh, xl, ch, cl)
    elseif sign < 0 then
      -- A refund of what no later grant relies on, and nothing once the grant's slot
      -- has passed: r = refund - max(0, tat - tatAfter).
      local ah, al = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
      if nh < ah or (nh == ah and nl < al) then
        local lh, ll = th[j] - ah, tl[j] - al
        if ll < 0 then lh, ll = lh - 1, ll + B end
        if lh < 0 then lh, ll = 0, 0 end
        local rh, rl = ch - lh, cl - ll
        if rl < 0 then rh, rl = rh - 1, rl + B end
        if rh > 0 or (rh == 0 and rl > 0) then
          local yh, yl = th[j] - rh, tl[j] - rl
          if yl < 0 then yh, yl = yh - 1, yl + B end
          th[j], tl[j] = yh, yl
        end
      end
    end
  end
  penalize(tonumber(ARGV[6]), hh, hl)
  save()
  return { nh, nl }
end

if op == 'p' then
  local uh, ul = add(nh, nl, tonumber(ARGV[4]), tonumber(ARGV[5]))
  hh, hl = max(hh, hl, uh, ul)
  penalize(tonumber(ARGV[7]), uh, ul)
  save()
  return { nh, nl }
end

return redis.error_reply('sluice: unknown operation ' .. tostring(op))
