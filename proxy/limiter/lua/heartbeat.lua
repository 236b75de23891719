-- Mark a replica alive and count the live ones; times are the server's, so replicas'
-- clocks need not agree.
-- KEYS: the replicas sorted set. ARGV: replica id, alive window in ms
-- Reply: how many replicas were seen within the window (this one included)
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window_ms = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], string.format('%d', now_ms), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now_ms - window_ms))
redis.call('PEXPIRE', KEYS[1], string.format('%d', 2 * window_ms))
return redis.call('ZCARD', KEYS[1])
