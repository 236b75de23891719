-- A client key as stored now: its live parallel slots (memory.Slots.live) and the raw
-- state of each window's bucket (the figures: verdicts.key_state, in Python).
-- KEYS: the key's leases, then one bucket per window
-- ARGV: now ('' = server time)
-- Reply: now, live slots, then debt and time of each window
local now = clock(ARGV[1])
local reply = {fmt(now), tostring(redis.call('ZCOUNT', KEYS[1], fmt(now), '+inf'))}
for i = 2, #KEYS do
  local d, t = load_state(KEYS[i])
  table.insert(reply, fmt(d))
  table.insert(reply, fmt(t))
end
return reply
