-- Shared by the deployment scripts (prepended after bucket.lua by scripts.py, with the
-- constants DECREASE, MIN_FACTOR, RECOVERY_PER_SECOND, FORGET_AFTER, FORGET_SLACK and
-- IN_FLIGHT_MARGIN taken from the Python modules, so they cannot drift).
-- A line-by-line mirror of proxy/routing/health.py, and of the in-flight leases and the
-- health storage in memory.py: same formulas in the same order. Change them together.

-- health.HEALTHY
local function healthy()
  return {
    failures = {}, cool_until = 0.0, cooling = false, probe_until = 0.0,
    factor = 1.0, factor_at = 0.0, probe_lease = '',
  }
end

-- A hash {x: expires_at, f: failures (space separated), cu, c (0/1), pu, k, ka, pl}.
-- A missing key, or one read at or after its expiry, is HEALTHY.
local function load_health(key, now)
  local v = redis.call('HMGET', key, 'x', 'f', 'cu', 'c', 'pu', 'k', 'ka', 'pl')
  if not v[1] or now >= tonumber(v[1]) then
    return healthy()
  end
  local failures = {}
  for t in string.gmatch(v[2], '%S+') do
    table.insert(failures, tonumber(t))
  end
  return {
    failures = failures, cool_until = tonumber(v[3]), cooling = v[4] == '1',
    probe_until = tonumber(v[5]), factor = tonumber(v[6]), factor_at = tonumber(v[7]),
    probe_lease = v[8],
  }
end

-- health.expires_at
local function expires_at(h, window)
  local expiry = -math.huge
  if h.cooling then
    expiry = math.max(h.cool_until, h.probe_until) + FORGET_AFTER
  elseif #h.failures > 0 then
    expiry = h.failures[#h.failures] + window + FORGET_SLACK
  end
  if h.factor < 1.0 then
    local recovered = h.factor_at + (1.0 - h.factor) / RECOVERY_PER_SECOND + FORGET_SLACK
    expiry = math.max(expiry, recovered)
  end
  return expiry
end

-- memory.MemoryLimiter._store_health (and the key's expiry, in server time)
local function store_health(key, h, window, now)
  local x = expires_at(h, window)
  if x == -math.huge then
    redis.call('DEL', key)
    return
  end
  local failures = {}
  for i, t in ipairs(h.failures) do
    failures[i] = fmt(t)
  end
  redis.call('HSET', key, 'x', fmt(x), 'f', table.concat(failures, ' '),
    'cu', fmt(h.cool_until), 'c', h.cooling and '1' or '0', 'pu', fmt(h.probe_until),
    'k', fmt(h.factor), 'ka', fmt(h.factor_at), 'pl', h.probe_lease)
  local ttl = math.min(math.max(0, math.ceil((x - now) * 1000)) + EXPIRE_SLACK_MS, EXPIRE_MAX_MS)
  redis.call('PEXPIRE', key, string.format('%d', ttl))
end

-- health.rate_factor
local function rate_factor(h, now)
  if h.factor >= 1.0 then
    return 1.0
  end
  return math.min(1.0, h.factor + RECOVERY_PER_SECOND * math.max(0.0, now - h.factor_at))
end

-- health.wait_for (nil: a probe is out)
local function wait_for(h, now)
  if not h.cooling then
    return 0.0
  end
  if now < h.cool_until then
    return h.cool_until - now
  end
  if now < h.probe_until then
    return nil
  end
  return 0.0
end

-- health.unusable_for
local function unusable_for(h, now)
  local wait = wait_for(h, now)
  if wait == nil then
    return h.probe_until - now
  end
  return wait
end

-- health.start_probe
local function start_probe(h, now, probe_timeout, lease_id)
  if not h.cooling or now < h.cool_until then
    return h
  end
  h.probe_until = now + probe_timeout
  h.probe_lease = lease_id
  return h
end

-- health.abandon_probe; also returns whether it changed anything
local function abandon_probe(h, lease_id)
  if not h.cooling or lease_id == '' or lease_id ~= h.probe_lease then
    return h, false
  end
  h.probe_until = 0.0
  h.probe_lease = ''
  return h, true
end

-- health.on_success; also returns whether it changed anything
local function on_success(h, now)
  if h.cooling and now >= h.cool_until then
    h.cooling = false
    h.cool_until = 0.0
    h.probe_until = 0.0
    h.failures = {}
    h.probe_lease = ''
    return h, true
  end
  return h, false
end

-- health.on_failure: returns the new health and whether it cooled
local function on_failure(h, allowed_fails, window, cool_time, now, cool_for, rate_limited)
  local factor = h.factor
  local factor_at = h.factor_at
  if rate_limited and not (h.cooling and now < h.cool_until) then
    factor = math.max(MIN_FACTOR, rate_factor(h, now) * DECREASE)
    factor_at = now
  end
  if cool_for ~= nil or h.cooling then
    local cooled_until = now + (cool_for ~= nil and cool_for or cool_time)
    return {
      failures = {}, cool_until = math.max(h.cool_until, cooled_until), cooling = true,
      probe_until = 0.0, factor = factor, factor_at = factor_at, probe_lease = '',
    }, true
  end
  local recent = {}
  for _, t in ipairs(h.failures) do
    if t > now - window then
      table.insert(recent, t)
    end
  end
  table.insert(recent, now)
  if #recent >= allowed_fails then
    return {
      failures = {}, cool_until = now + cool_time, cooling = true, probe_until = 0.0,
      factor = factor, factor_at = factor_at, probe_lease = '',
    }, true
  end
  return {
    failures = recent, cool_until = h.cool_until, cooling = false, probe_until = 0.0,
    factor = factor, factor_at = factor_at, probe_lease = '',
  }, false
end

-- health.settle: returns the new health, whether it changed, cooled, recovered, and the
-- seconds left of its cooldown
local function settle_health(h, kind, lease_id, allowed_fails, window, cool_time, now,
                             cool_for, rate_limited)
  local changed, cooled, recovered = false, false, false
  if kind == 'success' then
    h, recovered = on_success(h, now)
    changed = recovered
  elseif kind == 'failure' then
    h, cooled = on_failure(h, allowed_fails, window, cool_time, now, cool_for, rate_limited)
    changed = true
  else
    h, changed = abandon_probe(h, lease_id)
  end
  local left = 0.0
  if h.cooling then
    left = math.max(0.0, h.cool_until - now)
  end
  return h, changed, cooled, recovered, left
end

-- memory.Leases.put for in-flight requests: a sorted set of lease ids scored by their
-- deadline; the key lives as long as its latest deadline
local function add_in_flight(key, lease_id, deadline, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. fmt(now))
  redis.call('ZADD', key, fmt(deadline), lease_id)
  local ttl = math.min(math.ceil((deadline - now) * 1000) + EXPIRE_SLACK_MS, EXPIRE_MAX_MS)
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  end
end

-- memory.Leases.live: leases whose deadline is not yet past
local function in_flight(key, now)
  return redis.call('ZCOUNT', key, fmt(now), '+inf')
end
