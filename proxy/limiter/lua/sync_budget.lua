-- Lower a deployment's buckets to what the upstream says it has left (bucket.lower),
-- never raise them.
-- KEYS: health, then the buckets to lower
-- ARGV: now ('' = server time), then per bucket: interval, capacity, available,
--       wait for one unit ('' = none)
local now = clock(ARGV[1])
local factor = rate_factor(load_health(KEYS[1], now), now)
for i = 2, #KEYS do
  local a = 4 * i - 6
  local interval = tonumber(ARGV[a]) / factor
  local capacity = tonumber(ARGV[a + 1])
  local d, t = load_state(KEYS[i])
  local debt = debt_at(d, t, interval, now)
  local floor = capacity - tonumber(ARGV[a + 2])
  if ARGV[a + 3] ~= '' then
    floor = math.max(floor, capacity - 1.0 + tonumber(ARGV[a + 3]) / interval)
  end
  if floor > debt then
    store_state(KEYS[i], floor, now, tonumber(ARGV[a]) / MIN_FACTOR)
  end
end
return 1
