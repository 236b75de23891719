-- Lease a paced deployment's next turns (turns.py) while it is healthy (not cooling, no
-- probe out, no 429's hold, no learned rate), nobody waits for a fair share of its group,
-- and its first turn comes within TURN_WAIT. The turns it is expected to hand out are
-- counted in the health's period at once (health.counted, turns.counted), numbered from
-- the first's sequence. With lanes (turns.lanes_for: one window of requests), the next
-- lane of the bucket's open group is given if it has one (turns.join_lane: nothing is
-- charged); else the lease taken is a group, recorded in the bucket ('g', 'gn': lanes
-- taken) when its turns are evenly spaced.
-- KEYS: its health, its group's waiting keys (fair share), then one bucket per window
-- ARGV: now ('' = server time), the most turns (a group: TURN_MAX_GROUP), the lanes (1:
--       none), then per window:
--       interval, capacity (Rate.capacity_for the cost), cost, and its capacity if longer
--       than a minute (0: it paces)
-- Reply: '1', now, the health's epoch, the first turn's sequence, the turns taken, the
--        first and last turn's waits, '1' if it is a group (else '0'), then each
--        window's debt before and after; '2' (a lane joined), now, the epoch, the
--        sequence, the lane's slots, their first and last turn's waits, the group's time,
--        debt and slots, the lane's first slot; or '0' (nothing charged), then the first
--        turn's wait when that is what refused it.
local now = clock(ARGV[1])
local turns = tonumber(ARGV[2])
local lanes = tonumber(ARGV[3])
local h, kept = leasable_health(KEYS[1], now)
if h == nil or anyone_waiting(KEYS[2], now) then
  return {'0'}
end
local buckets = {}
for i = 3, #KEYS do
  local a = 4 * i - 8
  local b = bucket(KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), now)
  b.before = b.debt
  b.bound = turns_bound(tonumber(ARGV[a + 3]), b.debt)
  table.insert(buckets, b)
end
local grouped = false
if lanes > 1 and #buckets == 1 then
  local b = buckets[1]
  local g, joined = load_group(b.key)
  if g then
    local k, n, first, last = join_lane(g, joined, b.cost, b.capacity, b.interval, now)
    if k then
      redis.call('HSET', b.key, 'gn', tostring(joined + 1))
      local numbered = math.min(n, TURN_COUNTED)
      h = counted(h, now + math.max(first, 0.0), numbered)
      store_health(KEYS[1], h, nil, now, kept)
      return {'2', fmt(now), tostring(h.epoch), tostring(h.sent - numbered + 1), tostring(n),
        fmt(first), fmt(last), fmt(g.at), fmt(g.debt), tostring(g.slots), tostring(k)}
    end
  end
  grouped = evenly_spaced(b.debt, b.cost, b.capacity)
end
local span = TURN_SPAN
if grouped then -- a group: as many turns as its span holds, whatever the size asked
  span = TURN_GROUP_SPAN
  turns = TURN_MAX_GROUP
end
local taken, first, last = lease_turns(buckets, turns, span)
if not turns_granted(first, taken) then
  return {'0', fmt(first)}
end
local reply = {'1', fmt(now), '', '', tostring(taken), fmt(first), fmt(last), grouped and '1' or '0'}
for _, b in ipairs(buckets) do
  table.insert(reply, fmt(b.before))
  table.insert(reply, fmt(b.debt))
  store_state(b.key, b.debt, now, b.interval)
  -- A lease was taken since any budget lease of this bucket: that one is no longer its
  -- last, and gives nothing back (lease.lua's last_lease); and no settlement's refund
  -- takes the bucket below the lease's turns (its floor: bucket.lua's adjust)
  redis.call('HSET', b.key, 'ld', fmt(b.debt), 'lt', fmt(now), 'fd', fmt(b.debt), 'ft', fmt(now))
  if grouped then
    local g = table.concat({fmt(now), fmt(b.before), tostring(taken), fmt(b.cost),
      fmt(b.capacity), fmt(b.interval)}, ' ')
    redis.call('HSET', b.key, 'g', g, 'gn', '1')
  elseif lanes > 1 then
    redis.call('HDEL', b.key, 'g', 'gn') -- an earlier group's lanes: no longer offered
  end
end
local numbered = math.min(taken, TURN_COUNTED)
h = counted(h, now + first, numbered)
store_health(KEYS[1], h, nil, now, kept)
reply[3] = tostring(h.epoch)
reply[4] = tostring(h.sent - numbered + 1)
return reply
