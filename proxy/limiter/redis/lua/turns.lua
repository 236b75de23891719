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

-- turns.lease_turns over buckets (bucket()), each with its bound, within span: returns the number of
-- turns taken, the first and the last turn's waits; the buckets' ``debt`` is left at the
-- states after them (nothing stored). One window is counted without a loop
-- (turns.one_window_turns); with several, the loop runs once per turn (up to 512), so it
-- works on locals, not on the buckets' tables: the same operations on the same doubles
-- as plan() and charge(), a fraction of the cost (docs/performance.md).
local function lease_turns(buckets, turns, span)
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
  local limit = first + span
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

-- turns.evenly_spaced
local function evenly_spaced(d, c, cap)
  return d + c - cap >= 0.0
end

-- turns.lane_start: the first slot from k on in k's lane still usable at since
local function lane_start(d, c, cap, iv, k, slots, since)
  local gap = TURN_LANES * c * iv
  local start = k
  local x = ((since - gap) / iv + cap - d) / c
  if x >= start then
    k = start + TURN_LANES * math.ceil((math.floor(x) + 1 - start) / TURN_LANES)
  end
  while k - TURN_LANES >= start and turn_wait(d, k - TURN_LANES, c, cap, iv) + gap > since do
    k = k - TURN_LANES
  end
  while k <= slots and turn_wait(d, k, c, cap, iv) + gap <= since do
    k = k + TURN_LANES
  end
  return k
end

-- turns.lane_count
local function lane_count(k, slots)
  if k > slots then
    return 0
  end
  return math.floor((slots - k) / TURN_LANES) + 1
end

-- turns.join_lane: the next lane (taken are taken) of the group g for a replica asking at
-- now; nil, or its first slot, its slots, and their first and last turn's waits from now
local function join_lane(g, taken, c, cap, iv, now)
  if taken >= TURN_LANES or c ~= g.cost or cap ~= g.capacity or iv ~= g.interval then
    return nil
  end
  local since = now - g.at
  local k = lane_start(g.debt, c, cap, iv, taken + 1, g.slots, since)
  local n = lane_count(k, g.slots)
  if n < TURN_MIN then
    return nil
  end
  local first = turn_wait(g.debt, k, c, cap, iv) - since
  if first > TURN_WAIT then
    return nil
  end
  local last = turn_wait(g.debt, k + TURN_LANES * (n - 1), c, cap, iv) - since
  return k, n, first, last
end

-- A bucket's open group (turns.Group), from its 'g' field: nil when it has none
local function load_group(key)
  local g = redis.call('HMGET', key, 'g', 'gn')
  if not g[1] then
    return nil, 0
  end
  local f = {}
  for x in string.gmatch(g[1], '%S+') do
    table.insert(f, tonumber(x))
  end
  local group = {at = f[1], debt = f[2], slots = f[3], cost = f[4], capacity = f[5], interval = f[6]}
  return group, tonumber(g[2] or '1') -- (written together with 'g': its taker's lane)
end

-- turns.grants
local function turns_granted(first, taken)
  return first <= TURN_WAIT and taken >= TURN_MIN
end

-- turns.returned (and the store): the local bucket if the stored one is still the lease's
-- and nobody joined a lane of it
local function return_turns(key, end_debt, end_at, debt, at, interval)
  local d, t = load_state(key)
  local joined = tonumber(redis.call('HGET', key, 'gn') or '0')
  if d == end_debt and t == end_at and joined <= 1 then
    store_state(key, debt, at, interval)
    redis.call('HDEL', key, 'g', 'gn') -- its slots are no longer reserved: no lane of them
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
