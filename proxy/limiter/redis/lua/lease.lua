-- Leases of budget (allowance.py), mirrored line by line: same formulas in the same order.

-- A deployment's health, if it may be leased from (budget or turns) now, else nil: it is
-- healthy, not cooling, no probe out, no 429's hold, no learned rate (its turns then go
-- one by one).
local function leasable_health(key, now)
  local h, kept = load_health(key, now)
  if h.cooling or hold_for(h, now) > 0.0 or learned_rate(h, now) > 0.0 then
    return nil
  end
  return h, kept
end

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
local function lease_refund(amount, used, hold, age, last)
  if age > hold or not last then
    return 0.0
  end
  return math.max(0.0, amount - used)
end

-- allowance.lease_floor: a bucket's floor after its lease of b.cost holding ``hold``
local function raised_floor(b, hold, now)
  local fd, ft = load_pair(b.key, 'fd', 'ft', 0.0, -math.huge)
  return math.max(debt_at(fd, ft, b.interval, now), hold / b.interval) + b.cost
end

-- Lower a bucket's floor by what its last lease gives back (bucket.adjust of it).
local function lower_floor(key, interval, refund, now)
  local fd, ft = load_pair(key, 'fd', 'ft', 0.0, -math.huge)
  fd = math.max(0.0, debt_at(fd, ft, interval, now) - refund)
  redis.call('HSET', key, 'fd', fmt(fd), 'ft', fmt(now))
end

-- Charge a lease that may hold (bucket.charge with its hold as the wait), raise each
-- bucket's floor (allowance.lease_floor) and mark each bucket with the debt it left
-- (Allowance.marks: the last lease); its reply part: the hold, then each bucket's debt
-- before it.
local function take_lease(buckets, hold, now)
  local reply = {fmt(hold)}
  for _, b in ipairs(buckets) do
    table.insert(reply, fmt(b.debt))
  end
  local floors = {}
  for i, b in ipairs(buckets) do
    floors[i] = raised_floor(b, hold, now)
  end
  charge(buckets, hold, now)
  for i, b in ipairs(buckets) do
    redis.call('HSET', b.key, 'ld', fmt(b.d), 'lt', fmt(now), 'fd', fmt(floors[i]), 'ft', fmt(now))
  end
  return reply
end

-- Whether the lease granted at ``at`` that left debt ``mark`` is still the bucket's last.
local function last_lease(key, at, mark)
  local d, t = load_pair(key, 'ld', 'lt', nil, nil)
  return d == mark and t == at
end
