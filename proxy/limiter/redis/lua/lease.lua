-- Leases of budget (allowance.py), mirrored line by line: same formulas in the same order.

-- allowance.lease_hold: buckets carry the lease's amount as their cost
local function lease_hold(buckets)
  local hold = LEASE_HOLD
  for _, b in ipairs(buckets) do
    local room = LEASE_FULL_AT * b.capacity - b.cost
    if b.debt > room then
      return 0.0
    end
    hold = math.min(hold, math.min(room, LEASE_HOLD_SHARE * b.capacity) * b.interval)
  end
  if hold >= LEASE_HOLD_MIN then
    return hold
  end
  return 0.0
end

-- allowance.lease_refund
local function lease_refund(amount, used, hold, age)
  if age > hold then
    return 0.0
  end
  return math.max(0.0, amount - used)
end

-- Charge a lease that may hold (bucket.charge with its hold as the wait); its reply
-- part: the hold, then each bucket's debt before it.
local function take_lease(buckets, hold, now)
  local reply = {fmt(hold)}
  for _, b in ipairs(buckets) do
    table.insert(reply, fmt(b.debt))
  end
  charge(buckets, hold, now)
  return reply
end
