-- The report's totals of some periods (read only). KEYS: one hash per (period, index).
-- Reply: per key, its fields and values flattened (HGETALL's).
local reply = {}
for i = 1, #KEYS do
  table.insert(reply, redis.call('HGETALL', KEYS[i]))
end
return reply
