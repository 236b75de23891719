-- A client key's windows (requests cost 1, tokens cost the estimate) and max_parallel,
-- all or nothing.
-- KEYS: the key's leases, then one bucket per window (one hash tag per key name: one slot)
-- ARGV: now ('' = server time), max_parallel ('' = none), lease id, lease ttl, then per
--       window: interval, capacity (Rate.capacity_for the cost), cost
-- Reply: outcome, binding, wait, retry_after, parallel_full (0/1), now, then debt and
--        time of each window after the decision.
local now = clock(ARGV[1])
local buckets = {}
for i = 2, #KEYS do
  local a = 3 * i - 1
  table.insert(buckets, bucket(KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2]), now))
end
local slots = nil
if ARGV[2] ~= '' then
  slots = function()
    return acquire_lease(KEYS[1], ARGV[3], tonumber(ARGV[2]), now, tonumber(ARGV[4]))
  end
end
local outcome, w, retry, bind, parallel_full = check_now(buckets, now, slots)
local reply = {outcome, tostring(bind), fmt(w), fmt(retry), parallel_full and '1' or '0', fmt(now)}
return append_states(reply, buckets)
