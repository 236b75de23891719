-- After the upstream answered: free the in-flight slot, correct the buckets, lower the
-- per-minute ones to what the upstream has left (bucket.lower), hold the pacing ones for a
-- carried-over share (bucket.held_at_least), record the outcome in the health
-- (health.settle, a 429 learning from its turn), and after a learning event hold the
-- pacing buckets (bucket.held). One step (memory.MemoryLimiter.settle_now).
-- KEYS: health, in-flight set, learned window's bucket, then the buckets to correct, then
--       the buckets to lower, then the pacing buckets (windows of a minute or less)
-- ARGV: now ('' = server time), lease id ('' = none), kind (success/failure/neutral),
--       cool_for ('' = none), rate_limited (1/0), allowed_fails, window, cooldown time,
--       the turn's epoch, sequence, time and the pace in force ('' = turn unknown),
--       the numbers of buckets to correct and to lower, the hold (0 = none), the longest
--       an upstream may hold the deployment (health.bounded_hold), then per bucket to
--       correct:
--       interval, units; per bucket to lower: interval, capacity, available,
--       wait for one unit ('' = none); per pacing bucket: interval, capacity
-- Reply: cooled (1/0), recovered (1/0), seconds until it may take a request, epoch
local now = clock(ARGV[1])
local lease_id = ARGV[2]
if lease_id ~= '' then
  redis.call('ZREM', KEYS[2], lease_id)
end
local h = load_health(KEYS[1], now)
local epoch = h.epoch
local corrected, lowered = tonumber(ARGV[13]), tonumber(ARGV[14])
local hold_share = tonumber(ARGV[15])
local max_hold = tonumber(ARGV[16])
local a, k = 17, 4
for _ = 1, corrected do
  adjust(KEYS[k], tonumber(ARGV[a]), tonumber(ARGV[a + 1]), now)
  a = a + 2
  k = k + 1
end
for _ = 1, lowered do
  local interval = tonumber(ARGV[a])
  local capacity = tonumber(ARGV[a + 1])
  local d, t = load_state(KEYS[k])
  local debt = debt_at(d, t, interval, now)
  local floor = capacity - tonumber(ARGV[a + 2])
  local wait = nil
  if ARGV[a + 3] ~= '' then
    wait = bounded_hold(tonumber(ARGV[a + 3]), max_hold)
  end
  if wait ~= nil then
    floor = math.max(floor, capacity - 1.0 + wait / interval)
  end
  if floor > debt then
    store_state(KEYS[k], floor, now, interval)
  end
  a = a + 4
  k = k + 1
end
if hold_share > 0.0 then
  -- bucket.held_at_least for each pacing window (their arguments are read again below)
  local b = a
  for i = k, #KEYS do
    local interval = tonumber(ARGV[b])
    local target = math.max(0.0, tonumber(ARGV[b + 1]) - 1.0) + hold_share / interval
    local d, t = load_state(KEYS[i])
    if target > debt_at(d, t, interval, now) then
      store_state(KEYS[i], target, now, interval)
    end
    b = b + 2
  end
end
local cool_for = nil
if ARGV[4] ~= '' then
  cool_for = tonumber(ARGV[4])
end
local ev = nil
if ARGV[9] ~= '' then
  ev = {epoch = tonumber(ARGV[9]), sequence = tonumber(ARGV[10]), sent_at = tonumber(ARGV[11]),
    pace = tonumber(ARGV[12])}
end
local window = tonumber(ARGV[7])
local settled, changed, cooled, recovered, left = settle_health(copy(h), ARGV[3], lease_id,
  tonumber(ARGV[6]), window, tonumber(ARGV[8]), max_hold, now, cool_for, ARGV[5] == '1', ev)
if settled.epoch ~= epoch then
  -- bucket.held for each pacing window, then the (new) learned window
  local hold = hold_for(settled, now)
  for i = k, #KEYS do
    local interval = tonumber(ARGV[a])
    local capacity = tonumber(ARGV[a + 1])
    store_state(KEYS[i], math.max(0.0, capacity - 1.0) + hold / interval, now, interval)
    a = a + 2
  end
  local rate = learned_rate(settled, now)
  if rate > 0.0 then
    store_state(KEYS[3], math.max(0.0, 1.0 - 1.0) + hold / (1.0 / rate), now, 1.0 / rate)
  end
end
if changed then
  store_health(KEYS[1], settled, window, now)
end
return {cooled and '1' or '0', recovered and '1' or '0', fmt(left), tostring(settled.epoch)}
