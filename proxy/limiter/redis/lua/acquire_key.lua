-- A client key's windows and its team's (requests cost 1, tokens cost the estimate), both
-- owners' budgets and max_parallel, all or nothing.
-- KEYS: the key's leases, its team's leases (the key's again without a team), then one
--       bucket per window, the key's then its team's, then one quota per budget, the
--       key's then its team's (a key in a team lives under the team's hash tag: one slot)
-- ARGV: now ('' = server time), the key's max_parallel ('' = none), lease id, lease ttl,
--       the team's max_parallel ('' = none), number of budgets, then per window:
--       interval, capacity (Rate.capacity_for the cost), cost; then per budget: period
--       (day | week | month), limit, cost (its base when clamped), what a token of
--       output cap adds, whether it clamps ('1' | '0'); then, with budgets, the clamp's
--       most and least output caps ('0' '0': none; core/edge.py)
-- Reply: outcome, binding, wait, retry_after, slots_full ('' | 'key' | 'team'), now,
--        then debt and time of each window after the decision, then the budget that
--        refused (-1: none), its retry_after, the output cap lowered to (0: not), then
--        period index and spent of each budget after the decision.
local now = clock(ARGV[1])
local nq = tonumber(ARGV[6])
local nb = #KEYS - 2 - nq
local buckets = {}
for i = 3, nb + 2 do
  local a = 3 * i - 2
  table.insert(buckets, bucket(KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2]), now))
end
local quotas = {}
for j = 1, nq do
  local a = 3 * nb + 2 + 5 * j
  local q = quota(KEYS[nb + 2 + j], ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]))
  q.base, q.per, q.clamp = q.cost, tonumber(ARGV[a + 3]), ARGV[a + 4] == '1'
  table.insert(quotas, q)
end
local lowered = 0
if nq > 0 then
  local most = tonumber(ARGV[3 * nb + 7 + 5 * nq])
  if most > 0 then
    local cap = quota_fit(quotas, most, tonumber(ARGV[3 * nb + 8 + 5 * nq]), now)
    for _, q in ipairs(quotas) do
      q.cost = q.base + q.per * cap
    end
    if cap < most then
      lowered = cap
    end
  end
end
local q_refused, q_retry = quota_check(quotas, now)
-- memory.MemoryLimiter._take_slots: the key's slot, then the team's; the key's given
-- back when the team's are full. A budget that refuses takes none.
local full = ''
local slots = nil
if ARGV[2] ~= '' or ARGV[5] ~= '' or q_refused >= 0 then
  slots = function()
    if q_refused >= 0 then
      return false
    end
    local ttl = tonumber(ARGV[4])
    if ARGV[2] ~= '' and not acquire_lease(KEYS[1], ARGV[3], tonumber(ARGV[2]), now, ttl) then
      full = 'key'
      return false
    end
    if ARGV[5] ~= '' and not acquire_lease(KEYS[2], ARGV[3], tonumber(ARGV[5]), now, ttl) then
      if ARGV[2] ~= '' then
        redis.call('ZREM', KEYS[1], ARGV[3])
      end
      full = 'team'
      return false
    end
    return true
  end
end
local outcome, w, retry, bind, refused = check_now(buckets, now, slots)
if outcome == 'allowed' and not refused then
  charge_quotas(quotas, now)
else
  unchanged_quotas(quotas)
end
local reply = {outcome, tostring(bind), fmt(w), fmt(retry), full, fmt(now)}
append_states(reply, buckets)
table.insert(reply, tostring(q_refused))
table.insert(reply, fmt(q_retry))
table.insert(reply, string.format('%d', lowered))
return append_pairs(reply, quotas, 'p', 's')
