-- Turn leases (turns.py), mirrored line by line: same formulas in the same order.

-- turns.bound: ``long_capacity`` is 0 for a window of a minute or less (it paces)
local function turns_bound(long_capacity, debt)
  if long_capacity == 0.0 then
    return math.huge
  end
  return math.min(LEASE_FULL_AT * long_capacity, debt + LEASE_SHARE * long_capacity)
end

-- turns._turn_wait: the wait of the k-th of consecutive reservations from debt d
local function turn_wait(d, k, c, cap, iv)
  local wait = (d + k * c - cap) * iv
  if wait > 0.0 then
    return wait
  end
  return 0.0
end

-- turns._fits: the k-th reservation comes within limit and keeps within bd
local function turn_fits(d, k, c, cap, iv, limit, bd)
  return turn_wait(d, k, c, cap, iv) <= limit and d + k * c <= bd
end

-- turns.lease_turns over buckets (bucket()), each with its bound: returns the number of
-- turns taken, the first and the last turn's waits; the buckets' ``debt`` is left at the
-- states after them (nothing stored). One window is counted without a loop
-- (turns.one_window_turns); with several, the loop runs once per turn (up to 512), so it
-- works on locals, not on the buckets' tables: the same operations on the same doubles
-- as plan() and charge(), a fraction of the cost (docs/performance.md).
local function lease_turns(buckets, turns)
  local first, _, too_large = plan(buckets)
  local taken, last = 0, first
  if too_large >= 0 then -- (a cost is a bucket's constant: every turn's plan says so)
    return taken, first, last
  end
  local n = #buckets
  local debt, cost, capacity, interval, bound, charged = {}, {}, {}, {}, {}, {}
  for i, b in ipairs(buckets) do
    debt[i], cost[i], capacity[i], interval[i], bound[i] = b.debt, b.cost, b.capacity, b.interval, b.bound
  end
  local limit = first + TURN_SPAN
  if n == 1 then -- one window (a deployment's rpm): turns.one_window_turns, no loop
    local d, c, cap, iv, bd = debt[1], cost[1], capacity[1], interval[1], bound[1]
    local most = turns -- a cost of nothing never fills the window: the checks below decide
    if c > 0.0 then
      most = math.min(most, math.floor((limit / iv + cap - d) / c))
      if bd < math.huge then
        most = math.min(most, math.floor((bd - d) / c))
      end
    end
    taken = math.max(0, most)
    while taken < turns and turn_fits(d, taken + 1, c, cap, iv, limit, bd) do
      taken = taken + 1
    end
    while taken > 0 and not turn_fits(d, taken, c, cap, iv, limit, bd) do
      taken = taken - 1
    end
    if taken > 0 then
      last = turn_wait(d, taken, c, cap, iv)
      buckets[1].debt = d + taken * c
    end
    return taken, first, last
  end
  while taken < turns do
    local wait = 0.0
    for i = 1, n do
      local w = (debt[i] + cost[i] - capacity[i]) * interval[i]
      if w > wait then
        wait = w
      end
    end
    if wait > limit then
      break
    end
    local over = false
    for i = 1, n do
      local d = math.max(debt[i], wait / interval[i]) + cost[i]
      if d > bound[i] then
        over = true
      end
      charged[i] = d
    end
    if over then
      break
    end
    for i = 1, n do
      debt[i] = charged[i]
    end
    taken = taken + 1
    last = wait
  end
  for i, b in ipairs(buckets) do
    b.debt = debt[i]
  end
  return taken, first, last
end

-- turns.grants
local function turns_granted(first, taken)
  return first <= TURN_WAIT and taken >= TURN_MIN
end

-- turns.returned (and the store): the local bucket if the stored one is still the lease's
local function return_turns(key, end_debt, end_at, debt, at, interval)
  local d, t = load_state(key)
  if d == end_debt and t == end_at then
    store_state(key, debt, at, interval)
    -- the floor refunds stop at: the turns really handed out
    redis.call('HSET', key, 'fd', fmt(debt), 'ft', fmt(at))
  end
end

-- Whether some key waits for its fair share in the group (fairness.lua's waiting hash,
-- its unexpired entries; read only)
local function anyone_waiting(waiting_key, now)
  local entries = redis.call('HGETALL', waiting_key)
  for i = 2, #entries, 2 do
    local expiry = tonumber(string.match(entries[i], '(%S+)$'))
    if expiry > now then
      return true
    end
  end
  return false
end
