-- Shared by the deployment scripts (prepended after bucket.lua by scripts.py, with the
-- constants MARGIN, GROWTH, LEARNED_SPAN, DECREASE, MIN_RATE, HOLD_WITHOUT_HINT,
-- PERIOD_IDLE, FORGET_AFTER, FORGET_SLACK and IN_FLIGHT_MARGIN taken from the Python
-- modules, so they cannot drift).
-- A line-by-line mirror of proxy/limiter/health.py, and of the in-flight slots, the
-- learned window and the health storage in memory.py and verdicts.py: same formulas in
-- the same order. Change them together.

-- health.HEALTHY
local function healthy()
  return {
    failures = {}, cool_until = 0.0, cooling = false, probe_until = 0.0, probe_lease = '',
    hold_until = 0.0, learned = 0.0, learned_at = 0.0, epoch = 0, sent = 0,
    sent_from = 0.0, sent_last = 0.0,
  }
end

-- A hash {x: expires_at, f: failures (space separated), cu, c (0/1), pu, pl, hu, l, la, e,
-- n, nf, nl}. A missing key, or one read at or after its expiry, is HEALTHY.
local function load_health(key, now)
  local v = redis.call('HMGET', key, 'x', 'f', 'cu', 'c', 'pu', 'pl', 'hu', 'l', 'la', 'e',
    'n', 'nf', 'nl')
  if not v[1] or now >= tonumber(v[1]) then
    return healthy(), -math.huge
  end
  local failures = {}
  for t in string.gmatch(v[2], '%S+') do
    table.insert(failures, tonumber(t))
  end
  return {
    failures = failures, cool_until = tonumber(v[3]), cooling = v[4] == '1',
    probe_until = tonumber(v[5]), probe_lease = v[6], hold_until = tonumber(v[7]),
    learned = tonumber(v[8]), learned_at = tonumber(v[9]), epoch = tonumber(v[10]),
    sent = tonumber(v[11]), sent_from = tonumber(v[12]), sent_last = tonumber(v[13]),
  }, tonumber(v[1])
end

local function copy(h)
  local c = {}
  for k, value in pairs(h) do
    c[k] = value
  end
  return c
end

-- health.expires_at
local function expires_at(h, window)
  local expiry = -math.huge
  if h.cooling then
    expiry = math.max(h.cool_until, h.probe_until) + FORGET_AFTER
  elseif #h.failures > 0 then
    expiry = h.failures[#h.failures] + window + FORGET_SLACK
  end
  if h.hold_until > 0.0 then
    expiry = math.max(expiry, h.hold_until + FORGET_SLACK)
  end
  if h.learned > 0.0 then
    local doubled = h.learned_at + (LEARNED_SPAN - 1.0) / GROWTH + FORGET_SLACK
    expiry = math.max(expiry, doubled)
  end
  if h.sent > 0 then
    expiry = math.max(expiry, h.sent_last + PERIOD_IDLE + FORGET_SLACK)
  end
  return expiry
end

-- memory.MemoryLimiter._store_health (and the key's expiry, in server time). ``window``
-- nil: unknown (a reservation): the stored expiry ``kept`` is kept if it is later.
local function store_health(key, h, window, now, kept)
  local x = expires_at(h, window or 0.0)
  if window == nil and kept ~= nil then
    x = math.max(x, kept)
  end
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
    'pl', h.probe_lease, 'hu', fmt(h.hold_until), 'l', fmt(h.learned),
    'la', fmt(h.learned_at), 'e', tostring(h.epoch), 'n', tostring(h.sent),
    'nf', fmt(h.sent_from), 'nl', fmt(h.sent_last))
  local ttl = math.min(math.max(0, math.ceil((x - now) * 1000)) + EXPIRE_SLACK_MS, EXPIRE_MAX_MS)
  redis.call('PEXPIRE', key, string.format('%d', ttl))
end

-- health.bounded_hold (nil: no hint; ``seconds ~= seconds``: a NaN)
local function bounded_hold(seconds, max_hold)
  if seconds == nil or seconds ~= seconds then
    return nil
  end
  return math.min(math.max(seconds, 0.0), max_hold)
end

-- health.learned_rate
local function learned_rate(h, now)
  if h.learned <= 0.0 then
    return 0.0
  end
  local growth = 1.0 + GROWTH * math.max(0.0, now - h.learned_at)
  if growth >= LEARNED_SPAN then
    return 0.0
  end
  return h.learned * growth
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

-- health.hold_for
local function hold_for(h, now)
  return math.max(0.0, h.hold_until - now)
end

-- health.unusable_for
local function unusable_for(h, now)
  local wait = wait_for(h, now)
  local cooling = wait
  if wait == nil then
    cooling = h.probe_until - now
  end
  return math.max(cooling, hold_for(h, now))
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

-- health.counted
local function counted(h, turn, turns)
  turns = turns or 1
  if h.sent == 0 or turn - h.sent_last > PERIOD_IDLE then
    h.sent = turns
    h.sent_from = turn
    h.sent_last = turn
  else
    h.sent = h.sent + turns
    h.sent_last = math.max(h.sent_last, turn)
  end
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

-- health.on_rate_limited; ``ev``: {epoch, sequence, sent_at, pace, hold} (hold nil: none)
local function on_rate_limited(h, now, ev)
  local hold = ev.hold
  if hold == nil then
    hold = HOLD_WITHOUT_HINT
  end
  h.hold_until = math.max(h.hold_until, now + hold)
  if ev.epoch ~= h.epoch or h.sent == 0 then
    return h
  end
  local learned = learned_rate(h, now)
  local in_force = learned
  if in_force == 0.0 then
    in_force = ev.pace
  end
  local admitted = math.min(ev.sequence, h.sent) - 1
  local span = ev.sent_at - h.sent_from + hold
  local rate
  if admitted > 0 and span > 0 then
    rate = MARGIN * admitted / span
  elseif in_force > 0 then
    rate = DECREASE * in_force
  else
    return h
  end
  if learned > 0 then
    rate = math.max(rate, MARGIN * learned)
  end
  if in_force > 0 then
    rate = math.min(rate, in_force)
  end
  h.learned = math.max(MIN_RATE, rate)
  h.learned_at = now + hold
  h.epoch = h.epoch + 1
  h.sent = 0
  h.sent_from = 0.0
  h.sent_last = 0.0
  return h
end

-- health.on_failure: returns the new health and whether it cooled
local function on_failure(h, allowed_fails, window, cool_time, now, cool_for)
  if cool_for ~= nil or h.cooling then
    local until_ = now + cool_time
    if cool_for ~= nil then
      until_ = now + cool_for
    end
    h.failures = {}
    h.cool_until = math.max(h.cool_until, until_)
    h.cooling = true
    h.probe_until = 0.0
    h.probe_lease = ''
    return h, true
  end
  local recent = {}
  for _, t in ipairs(h.failures) do
    if t > now - window then
      table.insert(recent, t)
    end
  end
  table.insert(recent, now)
  if #recent >= allowed_fails then
    h.failures = {}
    h.cool_until = now + cool_time
    h.cooling = true
    h.probe_until = 0.0
    return h, true
  end
  h.failures = recent
  h.probe_until = 0.0
  return h, false
end

-- health.settle: returns the new health, whether it changed, cooled, recovered, and the
-- seconds until it may take a request (health.unusable_for)
local function settle_health(h, kind, lease_id, allowed_fails, window, cool_time, max_hold,
                             now, cool_for, rate_limited, ev)
  local changed, cooled, recovered = false, false, false
  if kind == 'success' then
    h, recovered = on_success(h, now)
    changed = recovered
  elseif kind == 'failure' and rate_limited then
    if ev == nil then
      ev = {epoch = -1, sequence = 0, sent_at = 0.0, pace = 0.0}
    end
    ev.hold = bounded_hold(cool_for, max_hold)
    h = on_rate_limited(h, now, ev)
    changed = true
    cooled = true
  elseif kind == 'failure' then
    h, cooled = on_failure(h, allowed_fails, window, cool_time, now, cool_for)
    changed = true
  else
    h, changed = abandon_probe(h, lease_id)
  end
  return h, changed, cooled, recovered, unusable_for(h, now)
end

-- verdicts.with_learned: the learned window's bucket for a candidate (nil: none)
local function learned_bucket(key, h, now)
  local rate = learned_rate(h, now)
  if rate <= 0.0 then
    return nil
  end
  -- Rate(limit=rate, period=1.0, capacity=1.0): its interval is 1.0 / rate.
  return bucket(key, 1.0 / rate, 1.0, 1.0, now)
end

-- memory.Slots.put for in-flight requests: a sorted set of lease ids scored by their
-- deadline; the key lives as long as its latest deadline
local function add_in_flight(key, lease_id, deadline, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. fmt(now))
  redis.call('ZADD', key, fmt(deadline), lease_id)
  local ttl = math.min(math.ceil((deadline - now) * 1000) + EXPIRE_SLACK_MS, EXPIRE_MAX_MS)
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  end
end

-- memory.Slots.live: leases whose deadline is not yet past
local function in_flight(key, now)
  return redis.call('ZCOUNT', key, fmt(now), '+inf')
end
