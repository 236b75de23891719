-- What the live replicas last reported doing (heartbeat.lua keeps it).
-- KEYS: the replicas sorted set, the activity hash
-- ARGV: alive window in ms
-- Reply: replica id, activity, for each replica seen within the window that reported one
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%d', now_ms - tonumber(ARGV[1])), '+inf')
local reply = {}
for _, replica in ipairs(live) do
  local report = redis.call('HGET', KEYS[2], replica)
  if report then
    table.insert(reply, replica)
    table.insert(reply, report)
  end
end
return reply
