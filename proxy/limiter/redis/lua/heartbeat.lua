-- Mark a replica alive, keep what it reports doing (its activity) and count the live
-- ones; times are the server's, so replicas' clocks need not agree.
-- KEYS: the replicas sorted set, the activity hash (same slot: hash tag of the set's name)
-- ARGV: replica id, alive window in ms, its activity ('' = none)
-- Reply: how many replicas were seen within the window (this one included)
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window_ms = tonumber(ARGV[2])
local oldest = '(' .. string.format('%d', now_ms - window_ms)
redis.call('ZADD', KEYS[1], string.format('%d', now_ms), ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', oldest)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', oldest)
redis.call('PEXPIRE', KEYS[1], string.format('%d', 2 * window_ms))
if KEYS[2] then
  for _, replica in ipairs(gone) do
    redis.call('HDEL', KEYS[2], replica)
  end
  if ARGV[3] and ARGV[3] ~= '' then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  end
  redis.call('PEXPIRE', KEYS[2], string.format('%d', 2 * window_ms))
end
return redis.call('ZCARD', KEYS[1])
