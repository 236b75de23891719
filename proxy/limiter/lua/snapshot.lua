-- Each deployment of a group now: seconds until it may take a request
-- (health.unusable_for), its learned rate (health.learned_rate) and what is left in each
-- of its buckets (bucket.remaining_now).
-- KEYS: per deployment: its health, then its buckets
-- ARGV: now ('' = server time), then per deployment: its bucket count n, then n times:
--       interval, largest (Rate.largest)
-- Reply: per deployment: unusable_for, learned rate, then one number per bucket
local now = clock(ARGV[1])
local reply = {}
local argi, keyi = 2, 1
while argi <= #ARGV do
  local n = tonumber(ARGV[argi])
  local h = load_health(KEYS[keyi], now)
  table.insert(reply, fmt(unusable_for(h, now)))
  table.insert(reply, fmt(learned_rate(h, now)))
  argi = argi + 1
  keyi = keyi + 1
  for _ = 1, n do
    local d, t = load_state(KEYS[keyi])
    local interval = tonumber(ARGV[argi])
    table.insert(reply, fmt(math.max(0.0, tonumber(ARGV[argi + 1]) - debt_at(d, t, interval, now))))
    keyi = keyi + 1
    argi = argi + 2
  end
end
return reply
