-- Each deployment of a group now: seconds until it may take a request
-- (health.unusable_for) and what is left in each of its buckets at the effective rate
-- (bucket.remaining_now).
-- KEYS: per deployment: its health, then its buckets
-- ARGV: now ('' = server time), then per deployment: its bucket count n, then n times:
--       interval, largest (Rate.largest)
-- Reply: per deployment: unusable_for, then one number per bucket
local now = clock(ARGV[1])
local reply = {}
local argi, keyi = 2, 1
while argi <= #ARGV do
  local n = tonumber(ARGV[argi])
  local h = load_health(KEYS[keyi], now)
  local factor = rate_factor(h, now)
  table.insert(reply, fmt(unusable_for(h, now)))
  argi = argi + 1
  keyi = keyi + 1
  for _ = 1, n do
    local d, t = load_state(KEYS[keyi])
    local interval = tonumber(ARGV[argi]) / factor
    table.insert(reply, fmt(math.max(0.0, tonumber(ARGV[argi + 1]) - debt_at(d, t, interval, now))))
    keyi = keyi + 1
    argi = argi + 2
  end
end
return reply
