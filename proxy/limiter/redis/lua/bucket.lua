-- Shared by every bucket script (prepended by proxy/limiter/scripts.py).
-- A line-by-line mirror of proxy/limiter/bucket.py and of the lease rules in memory.py:
-- same formulas in the same order, so results are bit-identical. Change them together.

-- Keys stay this long after their bucket has refilled (a missing key reads as full).
local EXPIRE_SLACK_MS = 10000
-- Never ask Redis to keep a key longer than this (30 days), whatever the debt.
local EXPIRE_MAX_MS = 2592000000

-- Numbers cross the boundary as strings: 17 significant digits round-trip a double
-- exactly (Lua's default tostring keeps only 14).
local function fmt(x)
  return string.format('%.17g', x)
end

-- An explicit time (tests) or the server's clock; one clock per slot, so per bucket.
local function clock(arg)
  if arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- Two numbers of a hash, or the defaults when the key is missing.
local function load_pair(key, first, second, default_first, default_second)
  local v = redis.call('HMGET', key, first, second)
  if v[1] then
    return tonumber(v[1]), tonumber(v[2])
  end
  return default_first, default_second
end

-- A missing key is bucket.FULL: no debt, full forever.
local function load_state(key)
  return load_pair(key, 'd', 't', 0.0, -math.huge)
end

local function store_state(key, d, t, interval)
  redis.call('HSET', key, 'd', fmt(d), 't', fmt(t))
  local ttl = math.min(math.ceil(d * interval * 1000) + EXPIRE_SLACK_MS, EXPIRE_MAX_MS)
  redis.call('PEXPIRE', key, string.format('%d', ttl))
end

-- bucket.debt_at
local function debt_at(d, t, interval, now)
  return math.max(0.0, d - (now - t) / interval)
end

-- ``interval`` is the effective one (bucket.Bucket.interval); the key's expiry is
-- computed with ``ttl_interval`` (default: the same), the slowest it may ever refill at.
local function bucket(key, interval, capacity, cost, now, ttl_interval)
  local d, t = load_state(key)
  return {
    key = key, interval = interval, capacity = capacity, cost = cost,
    d = d, t = t, debt = debt_at(d, t, interval, now), ttl_interval = ttl_interval or interval,
  }
end

-- bucket.plan: returns wait, binding, too_large (indices 0-based, -1 for none)
local function plan(buckets)
  local wait, binding, too_large = 0.0, -1, -1
  for i, b in ipairs(buckets) do
    if b.cost > b.capacity and too_large < 0 then
      too_large = i - 1
    end
    local w = (b.debt + b.cost - b.capacity) * b.interval
    if w > wait then
      wait = w
      binding = i - 1
    end
  end
  return wait, binding, too_large
end

-- bucket.decide: returns outcome, wait, retry_after, binding
local function decide(wait, binding, too_large, max_wait)
  if too_large >= 0 then
    return 'too_large', 0.0, 0.0, too_large
  end
  if wait <= max_wait then
    return 'allowed', wait, 0.0, binding
  end
  return 'refused', 0.0, wait - max_wait, binding
end

-- bucket.charge (and the store)
local function charge(buckets, wait, now)
  for _, b in ipairs(buckets) do
    b.d = math.max(b.debt, wait / b.interval) + b.cost
    b.t = now
    store_state(b.key, b.d, b.t, b.ttl_interval)
  end
end

-- bucket.take_all with no wait (a client key's check): every bucket or none is charged;
-- ``admit`` (its parallel slots), when given, may still refuse what the buckets allow.
-- Returns outcome, wait, retry_after, binding, and whether ``admit`` refused.
local function check_now(buckets, now, admit)
  local wait, binding, too_large = plan(buckets)
  local outcome, w, retry, bind = decide(wait, binding, too_large, 0.0)
  local refused = false
  if outcome == 'allowed' and admit ~= nil then
    refused = not admit()
  end
  if outcome == 'allowed' and not refused then
    charge(buckets, wait, now)
  end
  return outcome, w, retry, bind, refused
end

-- bucket.adjust (and the store); ``interval`` is the effective one. The floor is what
-- the bucket's leases still count on (allowance.lease_floor: fields fd, ft; none: 0).
local function adjust(key, interval, units, now, ttl_interval)
  local v = redis.call('HMGET', key, 'd', 't', 'fd', 'ft')
  local debt = 0.0
  if v[1] then
    debt = debt_at(tonumber(v[1]), tonumber(v[2]), interval, now)
  end
  local keep = 0.0
  if v[3] then
    keep = math.min(debt, debt_at(tonumber(v[3]), tonumber(v[4]), interval, now))
  end
  store_state(key, math.max(keep, debt + units), now, ttl_interval or interval)
end

-- memory.Slots.acquire: a sorted set of lease ids scored by their deadline
local function acquire_lease(key, lease_id, limit, now, ttl)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. fmt(now))
  if not redis.call('ZSCORE', key, lease_id) and redis.call('ZCARD', key) >= limit then
    return false
  end
  redis.call('ZADD', key, fmt(now + ttl), lease_id)
  redis.call('PEXPIRE', key, string.format('%d', math.ceil(ttl * 1000) + EXPIRE_SLACK_MS))
  return true
end

-- Two fields of each item, in order: a bucket's debt and time, a quota's period and spend.
local function append_pairs(reply, items, first, second)
  for _, item in ipairs(items) do
    table.insert(reply, fmt(item[first]))
    table.insert(reply, fmt(item[second]))
  end
  return reply
end

local function append_states(reply, buckets)
  return append_pairs(reply, buckets, 'd', 't')
end
