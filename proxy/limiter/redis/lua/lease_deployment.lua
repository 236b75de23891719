-- Lease a deployment's windows (allowance.py) while it is healthy: not cooling, no probe
-- out, no 429's hold, no learned rate (its turns then go one by one, reserve_deployment).
-- Its turns are counted in the health's period at once (health.counted), so a 429 on
-- one of them teaches as a reserved turn's would (its sequence: the first's plus its
-- place in the lease).
-- KEYS: its health, its learned window's bucket, then one bucket per window
-- ARGV: now ('' = server time), the lease's turns, then per window: interval, capacity,
--       the lease's amount
-- Reply: '1', now, the health's epoch, the first turn's sequence, hold, then each
--        window's debt before the lease; or '0' (nothing charged).
local now = clock(ARGV[1])
local turns = tonumber(ARGV[2])
local h, kept = leasable_health(KEYS[1], now)
if h == nil then
  return {'0'}
end
local buckets = {}
for i = 3, #KEYS do
  local a = 3 * i - 6
  table.insert(buckets, bucket(KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2]), now))
end
local hold = lease_hold(buckets)
if hold <= 0.0 then
  return {'0'}
end
local reply = take_lease(buckets, hold, now)
h = counted(h, now, turns)
store_health(KEYS[1], h, nil, now, kept)
table.insert(reply, 1, tostring(h.sent - turns + 1))
table.insert(reply, 1, tostring(h.epoch))
table.insert(reply, 1, fmt(now))
table.insert(reply, 1, '1')
return reply
