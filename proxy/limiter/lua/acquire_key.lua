-- A client key's windows and its team's (requests cost 1, tokens cost the estimate) and
-- both owners' max_parallel, all or nothing.
-- KEYS: the key's leases, its team's leases (the key's again without a team), then one
--       bucket per window, the key's then its team's (a key in a team lives under the
--       team's hash tag: one slot)
-- ARGV: now ('' = server time), the key's max_parallel ('' = none), lease id, lease ttl,
--       the team's max_parallel ('' = none), then per window: interval, capacity
--       (Rate.capacity_for the cost), cost
-- Reply: outcome, binding, wait, retry_after, slots_full ('' | 'key' | 'team'), now,
--        then debt and time of each window after the decision.
local now = clock(ARGV[1])
local buckets = {}
for i = 3, #KEYS do
  local a = 3 * i - 3
  table.insert(buckets, bucket(KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2]), now))
end
-- memory.MemoryLimiter._take_slots: the key's slot, then the team's; the key's given
-- back when the team's are full.
local full = ''
local slots = nil
if ARGV[2] ~= '' or ARGV[5] ~= '' then
  slots = function()
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
local outcome, w, retry, bind = check_now(buckets, now, slots)
local reply = {outcome, tostring(bind), fmt(w), fmt(retry), full, fmt(now)}
return append_states(reply, buckets)
