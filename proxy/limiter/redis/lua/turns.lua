-- Turn leases (turns.py), mirrored line by line: same formulas in the same order.

-- turns.bound: ``long_capacity`` is 0 for a window of a minute or less (it paces)
local function turns_bound(long_capacity, debt)
  if long_capacity == 0.0 then
    return math.huge
  end
  return math.min(LEASE_FULL_AT * long_capacity, debt + LEASE_SHARE * long_capacity)
end

-- turns.lease_turns over buckets (bucket()), each with its bound: returns the number of
-- turns taken, the first and the last turn's waits; the buckets' ``debt`` is left at the
-- states after them (nothing stored).
local function lease_turns(buckets, turns)
  local first = plan(buckets)
  local taken, last = 0, first
  while taken < turns do
    local wait, _, too_large = plan(buckets)
    if too_large >= 0 or wait > first + TURN_SPAN then
      break
    end
    local over = false
    for _, b in ipairs(buckets) do
      if math.max(b.debt, wait / b.interval) + b.cost > b.bound then
        over = true
      end
    end
    if over then
      break
    end
    for _, b in ipairs(buckets) do
      b.debt = math.max(b.debt, wait / b.interval) + b.cost
    end
    taken = taken + 1
    last = wait
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
