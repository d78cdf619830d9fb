-- Sluice lease mode: the clock every script of the store reads first (Go puts this before
-- each of them): ARGV[1] is '' to read Redis TIME, or "s us", a virtual now (tests only).
local s, us
if ARGV[1] == '' then
  local t = redis.call('TIME')
  s, us = tonumber(t[1]), tonumber(t[2])
else
  local a, b = string.match(ARGV[1], '^(%d+) (%d+)$')
  s, us = tonumber(a), tonumber(b)
end
