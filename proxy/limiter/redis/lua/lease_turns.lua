-- Lease a paced deployment's next turns (turns.py) while it is healthy (not cooling, no
-- probe out, no 429's hold, no learned rate), nobody waits for a fair share of its group,
-- and its first turn comes within TURN_WAIT. The turns it is expected to hand out are
-- counted in the health's period at once (health.counted, turns.counted), numbered from
-- the first's sequence.
-- KEYS: its health, its group's waiting keys (fair share), then one bucket per window
-- ARGV: now ('' = server time), the most turns, then per window: interval, capacity
--       (Rate.capacity_for the cost), cost, and its capacity if longer than a minute (0:
--       it paces)
-- Reply: '1', now, the health's epoch, the first turn's sequence, the turns taken, the
--        first and last turn's waits, then each window's debt before and after; or '0'
--        (nothing charged), then the first turn's wait when that is what refused it.
local now = clock(ARGV[1])
local turns = tonumber(ARGV[2])
local h, kept = leasable_health(KEYS[1], now)
if h == nil or anyone_waiting(KEYS[2], now) then
  return {'0'}
end
local buckets = {}
for i = 3, #KEYS do
  local a = 4 * i - 9
  local b = bucket(KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), now)
  b.before = b.debt
  b.bound = turns_bound(tonumber(ARGV[a + 3]), b.debt)
  table.insert(buckets, b)
end
local taken, first, last = lease_turns(buckets, turns)
if not turns_granted(first, taken) then
  return {'0', fmt(first)}
end
local reply = {'1', fmt(now), '', '', tostring(taken), fmt(first), fmt(last)}
for _, b in ipairs(buckets) do
  table.insert(reply, fmt(b.before))
  table.insert(reply, fmt(b.debt))
  store_state(b.key, b.debt, now, b.interval)
  -- A lease was taken since any budget lease of this bucket: that one is no longer its
  -- last, and gives nothing back (lease.lua's last_lease); and no settlement's refund
  -- takes the bucket below the lease's turns (its floor: bucket.lua's adjust)
  redis.call('HSET', b.key, 'ld', fmt(b.debt), 'lt', fmt(now), 'fd', fmt(b.debt), 'ft', fmt(now))
end
local numbered = math.min(taken, TURN_COUNTED)
h = counted(h, now + first, numbered)
store_health(KEYS[1], h, nil, now, kept)
reply[3] = tostring(h.epoch)
reply[4] = tostring(h.sent - numbered + 1)
return reply
