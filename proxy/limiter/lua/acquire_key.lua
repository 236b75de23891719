-- A client key's rpm (cost 1), tpm (cost ARGV[2]) and max_parallel, all or nothing.
-- KEYS: rpm bucket, tpm bucket, leases (one hash tag per key name: one slot)
-- ARGV: now ('' = server time), tokens, rpm interval, rpm capacity, tpm interval,
--       tpm capacity ('' interval = no such limit), max_parallel ('' = none), lease id,
--       lease ttl
-- Reply: outcome, binding, wait, retry_after, parallel_full (0/1), now, then debt and
--        time of each present bucket (rpm first) after the decision.
local now = clock(ARGV[1])
local buckets = {}
if ARGV[3] ~= '' then
  table.insert(buckets, bucket(KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4]), 1.0, now))
end
if ARGV[5] ~= '' then
  table.insert(buckets, bucket(KEYS[2], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[2]), now))
end
local wait, binding, too_large = plan(buckets)
local outcome, w, retry, bind = decide(wait, binding, too_large, 0.0)
local parallel_full = false
if outcome == 'allowed' and ARGV[7] ~= '' then
  parallel_full = not acquire_lease(KEYS[3], ARGV[8], tonumber(ARGV[7]), now, tonumber(ARGV[9]))
end
if outcome == 'allowed' and not parallel_full then
  charge(buckets, wait, now)
end
local reply = {outcome, tostring(bind), fmt(w), fmt(retry), parallel_full and '1' or '0', fmt(now)}
return append_states(reply, buckets)
