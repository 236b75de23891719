-- Reserve a turn on a deployment of one group (selection.select, and what the memory
-- backend's reserve_now does with its choice, fair share included: fairness.py).
-- KEYS: the claimant's held turns, the group's waiting keys (fair share), then per
--       candidate, in order: its health, its in-flight set, its learned window's bucket,
--       then its buckets (one hash tag per model group: one slot)
-- ARGV: now ('' = server time), max_wait, lease id ('' = none; a probe's, and in flight
--       under least_busy), least_busy (1/0), the claimant's key name, tier and weight,
--       the lookahead (0: no fair share), then per candidate: its bucket count n, its
--       probe_timeout, then n times: interval, capacity (Rate.capacity_for the cost), cost
-- Reply: outcome, chosen index (0-based, -1 none), wait, retry_after, binding, probe (1/0),
--        cooling (1/0), then the chosen turn's epoch, sequence and time (0s when none),
--        deferred (1/0), then each candidate's wait ('inf' when too large).
local now = clock(ARGV[1])
local max_wait = tonumber(ARGV[2])
local lease_id = ARGV[3]
local least_busy = ARGV[4] == '1'
local fair_key, fair_tier, fair_weight = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local lookahead = tonumber(ARGV[8])
local held_key, waiting_key = KEYS[1], KEYS[2]
local candidates = {}
local argi, keyi = 9, 3
while argi <= #ARGV do
  local n = tonumber(ARGV[argi])
  local c = {
    health_key = KEYS[keyi], flight_key = KEYS[keyi + 1],
    probe_timeout = tonumber(ARGV[argi + 1]), buckets = {}, in_flight = 0,
  }
  c.health, c.kept = load_health(c.health_key, now)
  local learned_key = KEYS[keyi + 2]
  argi = argi + 2
  keyi = keyi + 3
  for _ = 1, n do
    table.insert(c.buckets, bucket(KEYS[keyi], tonumber(ARGV[argi]), tonumber(ARGV[argi + 1]),
      tonumber(ARGV[argi + 2]), now))
    keyi = keyi + 1
    argi = argi + 3
  end
  local learned = learned_bucket(learned_key, c.health, now)
  if learned ~= nil then
    table.insert(c.buckets, learned)
  end
  if least_busy then
    c.in_flight = in_flight(c.flight_key, now)
  end
  table.insert(candidates, c)
end

-- selection.select
local plans, waits, reservable, held_back = {}, {}, {}, {}
local cooling, cooling_retry = false, math.huge
for i, c in ipairs(candidates) do
  local wait, binding, too_large = plan(c.buckets)
  plans[i] = {wait, binding, too_large}
  if too_large >= 0 then
    waits[i] = math.huge
    reservable[i] = false
    held_back[i] = false
  else
    local hold = hold_for(c.health, now)
    if wait_for(c.health, now) == 0.0 then
      waits[i] = math.max(hold, wait)
      reservable[i] = true
      held_back[i] = hold > max_wait
    else
      local out = unusable_for(c.health, now)
      waits[i] = math.max(out, wait)
      reservable[i] = false
      held_back[i] = false
      cooling = true
      cooling_retry = math.min(cooling_retry, math.max(out, wait - max_wait))
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

-- fairness (selection.select, before charging)
local deferral = nil
if best > 0 and lookahead > 0.0 then
  local p = plans[best]
  local outcome, w = decide(waits[best], p[2], p[3], max_wait)
  if outcome == 'allowed' and w > 0.0 then
    local held, waiting = load_fairness(held_key, waiting_key, now)
    local paces = {}
    for i, c in ipairs(candidates) do
      if reservable[i] then
        table.insert(paces, pace(c.buckets))
      end
    end
    local turns = depth(paces, lookahead)
    deferral = defer(fair_key, fair_tier, fair_weight, w, held, waiting, turns, lookahead, now)
    if deferral ~= nil then
      record_waiting(waiting_key, fair_key, fair_tier, fair_weight, deferral, now)
    end
  end
end

local reply
if deferral ~= nil then
  reply = {'refused', '-1', fmt(0.0), fmt(deferral), tostring(plans[best][2]), '0', '0',
    '0', '0', fmt(0.0), '1'}
elseif best == 0 then
  if not cooling then
    reply = {'too_large', '-1', fmt(0.0), fmt(0.0), tostring(plans[1][3]), '0', '0'}
  else
    reply = {'refused', '-1', fmt(0.0), fmt(cooling_retry), '-1', '0', '1'}
  end
  table.insert(reply, '0')
  table.insert(reply, '0')
  table.insert(reply, fmt(0.0))
  table.insert(reply, '0')
else
  local p = plans[best]
  local outcome, w, retry, bind = decide(waits[best], p[2], p[3], max_wait)
  if outcome == 'allowed' then
    local c = candidates[best]
    charge(c.buckets, waits[best], now)
    local probe = c.health.cooling
    local h = c.health
    if probe then
      h = start_probe(h, now, w + c.probe_timeout, lease_id)
    end
    h = counted(h, now + w)
    store_health(c.health_key, h, nil, now, c.kept)
    if lease_id ~= '' and least_busy then
      add_in_flight(c.flight_key, lease_id, now + w + c.probe_timeout + IN_FLIGHT_MARGIN, now)
    end
    if lookahead > 0.0 then
      record_turn(held_key, waiting_key, fair_key, w, lease_id, now)
    end
    reply = {outcome, tostring(best - 1), fmt(w), fmt(retry), tostring(bind),
      probe and '1' or '0', '0', tostring(h.epoch), tostring(h.sent), fmt(now + w), '0'}
  else
    local held = cooling or held_back[best]
    reply = {outcome, '-1', fmt(w), fmt(math.min(retry, cooling_retry)), tostring(bind), '0',
      held and '1' or '0', '0', '0', fmt(0.0), '0'}
  end
end
for _, w in ipairs(waits) do
  table.insert(reply, fmt(w))
end
return reply
