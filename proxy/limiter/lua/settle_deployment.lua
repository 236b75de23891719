-- After the upstream answered: free the in-flight lease, correct the buckets (as
-- correct_deployment), record the outcome in the health (health.settle). One step.
-- KEYS: health, in-flight set, then the buckets to correct
-- ARGV: now ('' = server time), lease id ('' = none), kind (success/failure/neutral),
--       cool_for ('' = none), rate_limited (1/0), allowed_fails, window, cooldown time,
--       then per bucket: interval, units
-- Reply: cooled (1/0), recovered (1/0), seconds left of the cooldown
local now = clock(ARGV[1])
local lease_id = ARGV[2]
if lease_id ~= '' then
  redis.call('ZREM', KEYS[2], lease_id)
end
local h = load_health(KEYS[1], now)
local factor = rate_factor(h, now)
for i = 3, #KEYS do
  local a = 2 * i + 3
  local interval = tonumber(ARGV[a])
  adjust(KEYS[i], interval / factor, tonumber(ARGV[a + 1]), now, interval / MIN_FACTOR)
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
