-- A client key's windows (requests cost 1, tokens cost the estimate), its budgets and
-- max_parallel, all or nothing.
-- KEYS: the key's leases, then one bucket per window, then one quota per budget (one hash
-- tag per key name: one slot)
-- ARGV: now ('' = server time), max_parallel ('' = none), lease id, lease ttl, number of
--       budgets, then per window: interval, capacity (Rate.capacity_for the cost), cost;
--       then per budget: period (day | week | month), limit, cost
-- Reply: outcome, binding, wait, retry_after, parallel_full (0/1), now, then debt and
--        time of each window after the decision, then the budget that refused (-1: none),
--        its retry_after, then period index and spent of each budget after the decision.
local now = clock(ARGV[1])
local nq = tonumber(ARGV[5])
local nb = #KEYS - 1 - nq
local buckets = {}
for i = 2, nb + 1 do
  local a = 3 * i
  table.insert(buckets, bucket(KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2]), now))
end
local quotas = {}
for j = 1, nq do
  local a = 3 * nb + 3 + 3 * j
  table.insert(quotas, quota(KEYS[nb + 1 + j], ARGV[a], tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2])))
end
local q_refused, q_retry = quota_check(quotas, now)
local admit = nil
if ARGV[2] ~= '' or q_refused >= 0 then
  admit = function()
    if q_refused >= 0 then
      return false
    end
    return acquire_lease(KEYS[1], ARGV[3], tonumber(ARGV[2]), now, tonumber(ARGV[4]))
  end
end
local outcome, w, retry, bind, refused = check_now(buckets, now, admit)
local parallel_full = refused and q_refused < 0
if outcome == 'allowed' and not refused then
  charge_quotas(quotas, now)
else
  unchanged_quotas(quotas)
end
local reply = {outcome, tostring(bind), fmt(w), fmt(retry), parallel_full and '1' or '0', fmt(now)}
append_states(reply, buckets)
table.insert(reply, tostring(q_refused))
table.insert(reply, fmt(q_retry))
return append_pairs(reply, quotas, 'p', 's')
