-- Lease a client key's windows (allowance.py) or, when they are too full to lease from,
-- check them for this one request as acquire_key does (without parallel slots: a key
-- with max_parallel never leases).
-- KEYS: one bucket per window (one hash tag per key name: one slot)
-- ARGV: now ('' = server time), then per window: interval, capacity (Rate.capacity_for
--       the cost), capacity, the request's cost, the lease's amount
-- Reply: 'leased', now, hold, then each window's debt before the lease; or 'checked',
--        outcome, binding, wait, retry_after, now, then debt and time of each window
--        after the decision (acquire_key's).
local now = clock(ARGV[1])
local leased = {}
for i = 1, #KEYS do
  local a = 5 * i - 3
  table.insert(leased, bucket(KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 4]), now))
end
local hold = lease_hold(leased)
if hold > 0.0 then
  local reply = take_lease(leased, hold, now)
  table.insert(reply, 1, fmt(now))
  table.insert(reply, 1, 'leased')
  return reply
end
local buckets = {}
for i = 1, #KEYS do
  local a = 5 * i - 3
  table.insert(buckets, bucket(KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 3]), now))
end
local outcome, w, retry, bind = check_now(buckets, now)
local reply = {'checked', outcome, tostring(bind), fmt(w), fmt(retry), fmt(now)}
return append_states(reply, buckets)
