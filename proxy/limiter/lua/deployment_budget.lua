-- What is left in deployment buckets now (bucket.usage's remaining), for dashboards.
-- KEYS: bucket keys. ARGV: now ('' = server time), then per key: interval, capacity.
-- Reply: one number per key.
local now = clock(ARGV[1])
local reply = {}
for i, key in ipairs(KEYS) do
  local interval = tonumber(ARGV[2 * i])
  local capacity = tonumber(ARGV[2 * i + 1])
  local d, t = load_state(key)
  reply[i] = fmt(math.max(0.0, capacity - debt_at(d, t, interval, now)))
end
return reply
