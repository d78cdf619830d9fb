-- Sluice, Redis mode, state format 1: GCRA decisions for one key, atomically, with the
-- arithmetic of the Go core (package gcra: Decide, Adjust, Penalize) in integer
-- nanoseconds. Keep in step with gcra.go; the differential test compares the two.
--
-- Numbers. Lua numbers are doubles, exact for integers below 2^53, and Unix nanoseconds
-- (about 1.8e18) are far above that. Every time and duration is therefore held as a pair
-- (s, ns) of whole seconds and 0 <= ns < 1e9, value = s*1e9 + ns. Sums, differences,
-- comparisons and maxima of pairs are exact over the whole int64 range (s stays below
-- 2^34). The script never multiplies or divides: the caller passes n*T per limit, and
-- derives Remaining and ResetAfter from the TATs returned.
--
-- KEYS[1]  the key's state, a string "1 HOLD TAT1 [TAT2 ...]": the format, the end of the
--          key's latest penalty (0 if none in force), one TAT per limit, in nanoseconds.
-- ARGV[1]  the operation:
--   d  decide:   ARGV[3] n, [4] maxDelay, [5] k, then per limit Tau, n*T.
--                Reply {allowed, now, delay (RetryAfter when denied), TAT1..TATk}.
--   a  allow:    as d, with a reply of 1 (granted) or 0.
--   s  settle:   ARGV[3] "+" (charge), "-" (refund) or "=", [4] k, [5] p, [6] Tau_p - T_p,
--                then per limit the charge or refund and the ticket's TAT after the grant.
--                p is the limit a penalty drains (the smallest Tau). Reply: now.
--   p  penalize: ARGV[3] d, [4] k, [5] p, [6] Tau_p - T_p. Reply: now.
-- ARGV[2]  now in nanoseconds, or "" to read Redis TIME. Only tests pass it (virtual time);
--          real time may then run ahead of it, so such keys get an hour's extra TTL.
--
-- The key expires when it is idle (every TAT and the hold in the past): a missing key is
-- exactly a fresh one, so expiry changes no decision.

local B = 1000000000

-- num parses a decimal int64 into a pair.
local function num(s)
  local neg = string.byte(s, 1) == 45
  if neg then s = string.sub(s, 2) end
  local len = #s
  local h, l
  if len <= 9 then
    h, l = 0, tonumber(s)
  else
    h, l = tonumber(string.sub(s, 1, len - 9)), tonumber(string.sub(s, len - 8))
  end
  if h == nil or l == nil then error('sluice: not an integer: ' .. s) end
  if neg then
    if l == 0 then return -h, 0 end
    return -h - 1, B - l
  end
  return h, l
end

-- str formats a pair as a decimal int64.
local function str(h, l)
  if h < 0 then
    if l == 0 then return '-' .. str(-h, 0) end
    return '-' .. str(-h - 1, B - l)
  end
  if h == 0 then return string.format('%d', l) end
  return string.format('%d%09d', h, l)
end

local function add(ah, al, bh, bl)
  local h, l = ah + bh, al + bl
  if l >= B then return h + 1, l - B end
  return h, l
end

local function sub(ah, al, bh, bl)
  local h, l = ah - bh, al - bl
  if l < 0 then return h - 1, l + B end
  return h, l
end

local function less(ah, al, bh, bl)
  return ah < bh or (ah == bh and al < bl)
end

local function max(ah, al, bh, bl)
  if less(ah, al, bh, bl) then return bh, bl end
  return ah, al
end

local key = KEYS[1]
local op = ARGV[1]
local virtual = ARGV[2] ~= ''
local nh, nl
if virtual then
  nh, nl = num(ARGV[2])
else
  local t = redis.call('TIME')
  nh, nl = tonumber(t[1]), tonumber(t[2]) * 1000
end
local k = tonumber(ARGV[5])
if op == 's' or op == 'p' then k = tonumber(ARGV[4]) end

-- The state: hold and one TAT per limit; a key with fewer TATs than limits (new, or its
-- limits grew) starts the others fresh, one with more keeps the first k.
local hh, hl = 0, 0
local th, tl = {}, {}
local v = redis.call('GET', key)
if v then
  local i = 0
  for f in string.gmatch(v, '%S+') do
    if i == 0 then
      if f ~= '1' then
        return redis.error_reply('sluice: key ' .. key .. ' holds state format ' .. f .. ', this script reads format 1')
      end
    elseif i == 1 then
      hh, hl = num(f)
    elseif i - 1 <= k then
      th[i - 1], tl[i - 1] = num(f)
    end
    i = i + 1
  end
end
for j = 1, k do
  if th[j] == nil then th[j], tl[j] = 0, 0 end
end
-- A penalty no longer in force is forgotten.
if not less(nh, nl, hh, hl) then hh, hl = 0, 0 end

-- save stores the state with a TTL that ends when the key is idle, or deletes it if it
-- already is.
local function save()
  local mh, ml = hh, hl
  local parts = { '1', str(hh, hl) }
  for j = 1, k do
    mh, ml = max(mh, ml, th[j], tl[j])
    parts[j + 2] = str(th[j], tl[j])
  end
  if not less(nh, nl, mh, ml) then
    redis.call('DEL', key)
    return
  end
  local dh, dl = sub(mh, ml, nh, nl)
  local ms = dh * 1000 + math.ceil(dl / 1000000)
  if virtual then ms = ms + 3600000 end
  redis.call('SET', key, table.concat(parts, ' '), 'PX', string.format('%d', ms))
end

-- penalize is gcra.Penalize for the limit p: nothing is granted before until.
local function penalize(p, offh, offl, uh, ul)
  if not less(nh, nl, uh, ul) then return end
  local xh, xl = add(uh, ul, offh, offl)
  th[p], tl[p] = max(th[p], tl[p], xh, xl)
end

if op == 'd' or op == 'a' then
  local n = tonumber(ARGV[3])
  local mdh, mdl = num(ARGV[4])
  -- delay = max(0, max over limits of max(tat, now) + n*T - Tau - now)
  local dh, dl = 0, 0
  local ch, cl = {}, {}
  for j = 1, k do
    local tauh, taul = num(ARGV[4 + 2 * j])
    ch[j], cl[j] = num(ARGV[5 + 2 * j])
    local xh, xl = max(th[j], tl[j], nh, nl)
    xh, xl = add(xh, xl, ch[j], cl[j])
    xh, xl = sub(xh, xl, tauh, taul)
    xh, xl = sub(xh, xl, nh, nl)
    if n > 0 then dh, dl = max(dh, dl, xh, xl) end
  end
  local allowed = not less(mdh, mdl, dh, dl)
  if allowed and n > 0 then
    local ah, al = add(nh, nl, dh, dl)
    for j = 1, k do
      local xh, xl = max(th[j], tl[j], ah, al)
      th[j], tl[j] = add(xh, xl, ch[j], cl[j])
    end
    save()
  end
  if op == 'a' then
    if allowed then return 1 end
    return 0
  end
  local out = { 0, str(nh, nl), str(dh, dl) }
  if allowed then out[1] = 1 end
  for j = 1, k do out[j + 3] = str(th[j], tl[j]) end
  return out
end

if op == 's' then
  local sign = ARGV[3]
  local p = tonumber(ARGV[5]) + 0
  local offh, offl = num(ARGV[6])
  for j = 1, k do
    local ch, cl = num(ARGV[5 + 2 * j])
    if sign == '+' then
      -- A charge: tat = max(tat, now) + extra.
      local xh, xl = max(th[j], tl[j], nh, nl)
      th[j], tl[j] = add(xh, xl, ch, cl)
    elseif sign == '-' then
      -- A refund of what no later grant relies on, and nothing once the grant's slot
      -- has passed: r = refund - max(0, tat - tatAfter).
      local ah, al = num(ARGV[6 + 2 * j])
      if less(nh, nl, ah, al) then
        local lh, ll = sub(th[j], tl[j], ah, al)
        lh, ll = max(lh, ll, 0, 0)
        local rh, rl = sub(ch, cl, lh, ll)
        if less(0, 0, rh, rl) then
          th[j], tl[j] = sub(th[j], tl[j], rh, rl)
        end
      end
    end
  end
  penalize(p, offh, offl, hh, hl)
  save()
  return str(nh, nl)
end

if op == 'p' then
  local dh, dl = num(ARGV[3])
  local p = tonumber(ARGV[5])
  local offh, offl = num(ARGV[6])
  local uh, ul = add(nh, nl, dh, dl)
  hh, hl = max(hh, hl, uh, ul)
  penalize(p, offh, offl, uh, ul)
  save()
  return str(nh, nl)
end

return redis.error_reply('sluice: unknown operation ' .. tostring(op))
