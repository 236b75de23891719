-- Add corrections to a deployment's buckets (bucket.adjust each, at the effective rate).
-- KEYS: the deployment's health, then the buckets to correct.
-- ARGV: now ('' = server time), then per bucket: interval, units (negative refunds)
local now = clock(ARGV[1])
local factor = rate_factor(load_health(KEYS[1], now), now)
for i = 2, #KEYS do
  local interval = tonumber(ARGV[2 * i - 2])
  adjust(KEYS[i], interval / factor, tonumber(ARGV[2 * i - 1]), now, interval / MIN_FACTOR)
end
return 1
