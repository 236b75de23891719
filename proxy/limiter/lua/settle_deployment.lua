-- After the upstream answered: free the in-flight lease, correct the buckets, lower the
-- per-minute ones to what the upstream has left (bucket.lower), record the outcome in the
-- health (health.settle). All at the effective rate; one step.
-- KEYS: health, in-flight set, then the buckets to correct, then the buckets to lower
-- ARGV: now ('' = server time), lease id ('' = none), kind (success/failure/neutral),
--       cool_for ('' = none), rate_limited (1/0), allowed_fails, window, cooldown time,
--       number of buckets to correct, then per bucket to correct: interval, units, then
--       per bucket to lower: interval, largest (Rate.largest), available, wait for one
--       unit ('' = none)
-- Reply: cooled (1/0), recovered (1/0), seconds left of the cooldown
local now = clock(ARGV[1])
local lease_id = ARGV[2]
if lease_id ~= '' then
  redis.call('ZREM', KEYS[2], lease_id)
end
local h = load_health(KEYS[1], now)
local factor = rate_factor(h, now)
local corrected = tonumber(ARGV[9])
local a = 10
for i = 3, 2 + corrected do
  local interval = tonumber(ARGV[a])
  adjust(KEYS[i], interval / factor, tonumber(ARGV[a + 1]), now, interval / MIN_FACTOR)
  a = a + 2
end
for i = 3 + corrected, #KEYS do
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
  a = a + 4
end
local cool_for = nil
if ARGV[4] ~= '' then
  cool_for = tonumber(ARGV[4])
end
local window = tonumber(ARGV[7])
local settled, changed, cooled, recovered, left = settle_health(h, ARGV[3], lease_id,
  tonumber(ARGV[6]), window, tonumber(ARGV[8]), now, cool_for, ARGV[5] == '1')
if changed then
  store_health(KEYS[1], settled, window, now)
end
return {cooled and '1' or '0', recovered and '1' or '0', fmt(left)}
