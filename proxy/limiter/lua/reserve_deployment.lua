-- Reserve a turn on a deployment of one group (selection.select, and what the memory
-- backend's reserve_deployment_now does with its choice).
-- KEYS: per candidate, in order: its health, its in-flight set, then its buckets (one
--       hash tag per model group: one slot)
-- ARGV: now ('' = server time), max_wait, lease id ('' = none; a probe's, and in flight
--       under least_busy), least_busy (1/0), then
--       per candidate: its bucket count n, its probe_timeout, then n times: interval,
--       capacity (Rate.capacity_for the cost), cost
-- Reply: outcome, chosen index (0-based, -1 none), wait, retry_after, binding, probe (1/0),
--        cooling (1/0), then each candidate's wait ('inf' when too large).
local now = clock(ARGV[1])
local max_wait = tonumber(ARGV[2])
local lease_id = ARGV[3]
local least_busy = ARGV[4] == '1'
local candidates = {}
local argi, keyi = 5, 1
while argi <= #ARGV do
  local n = tonumber(ARGV[argi])
  local c = {
    health_key = KEYS[keyi], flight_key = KEYS[keyi + 1],
    probe_timeout = tonumber(ARGV[argi + 1]), buckets = {}, in_flight = 0,
  }
  c.health = load_health(c.health_key, now)
  local factor = rate_factor(c.health, now)
  argi = argi + 2
  keyi = keyi + 2
  for _ = 1, n do
    local interval = tonumber(ARGV[argi])
    table.insert(c.buckets, bucket(KEYS[keyi], interval / factor, tonumber(ARGV[argi + 1]),
      tonumber(ARGV[argi + 2]), now, interval / MIN_FACTOR))
    keyi = keyi + 1
    argi = argi + 3
  end
  if least_busy then
    c.in_flight = in_flight(c.flight_key, now)
  end
  table.insert(candidates, c)
end

local plans, waits, reservable = {}, {}, {}
local held, held_retry = false, math.huge
for i, c in ipairs(candidates) do
  local wait, binding, too_large = plan(c.buckets)
  plans[i] = {wait, binding, too_large}
  if too_large >= 0 then
    waits[i] = math.huge
    reservable[i] = false
  else
    local hold = unusable_for(c.health, now)
    if hold == 0.0 then
      waits[i] = wait
      reservable[i] = true
    else
      waits[i] = math.max(hold, wait)
      reservable[i] = false
      held = true
      held_retry = math.min(held_retry, math.max(hold, wait - max_wait))
    end
  end
end
local best = 0
if least_busy then
  for i, c in ipairs(candidates) do
    if reservable[i] and waits[i] == 0.0
        and (best == 0 or c.in_flight < candidates[best].in_flight) then
      best = i
    end
  end
end
if best == 0 then
  for i, w in ipairs(waits) do
    if reservable[i] and (best == 0 or w < waits[best]) then
      best = i
    end
  end
end

local reply
if best == 0 then
  if not held then
    reply = {'too_large', '-1', fmt(0.0), fmt(0.0), tostring(plans[1][3]), '0', '0'}
  else
    reply = {'refused', '-1', fmt(0.0), fmt(held_retry), '-1', '0', '1'}
  end
else
  local p = plans[best]
  local outcome, w, retry, bind = decide(p[1], p[2], p[3], max_wait)
  if outcome == 'allowed' then
    local c = candidates[best]
    charge(c.buckets, p[1], now)
    local probe = c.health.cooling
    if probe then
      store_health(c.health_key, start_probe(c.health, now, w + c.probe_timeout, lease_id),
        0.0, now)
    end
    if lease_id ~= '' and least_busy then
      add_in_flight(c.flight_key, lease_id, now + w + c.probe_timeout + IN_FLIGHT_MARGIN, now)
    end
    reply = {outcome, tostring(best - 1), fmt(w), fmt(retry), tostring(bind),
      probe and '1' or '0', '0'}
  else
    reply = {outcome, '-1', fmt(w), fmt(math.min(retry, held_retry)), tostring(bind), '0',
      held and '1' or '0'}
  end
end
for _, w in ipairs(waits) do
  table.insert(reply, fmt(w))
end
return reply
