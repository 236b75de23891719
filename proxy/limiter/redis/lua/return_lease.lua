-- Give back what a lease did not use (allowance.lease_refund, then bucket.adjust of the
-- floor and of the bucket) to the buckets it is still the last lease of.
-- KEYS: the lease's buckets
-- ARGV: now ('' = server time), the lease's time and hold, then per bucket: interval,
--       the lease's amount, the units its requests used, its mark (Allowance.marks)
local now = clock(ARGV[1])
local at, hold = tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 1, #KEYS do
  local a = 4 * i
  local interval = tonumber(ARGV[a])
  local last = last_lease(KEYS[i], at, tonumber(ARGV[a + 3]))
  local refund = lease_refund(tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), hold, now - at,
    last)
  if refund > 0.0 then
    lower_floor(KEYS[i], interval, refund, now)
    adjust(KEYS[i], interval, -refund, now)
  end
end
return 1
