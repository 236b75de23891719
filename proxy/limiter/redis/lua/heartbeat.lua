-- Mark a replica alive, keep what it reports doing (its activity) and the pacing margin
-- its turns need, and count the live ones; times are the server's, so replicas' clocks
-- need not agree.
-- KEYS: the replicas sorted set, the activity hash, [the margins hash] (same slot: hash
--       tag of the set's name)
-- ARGV: replica id, alive window in ms, its activity ('' = none), [its margin ('' = none)]
-- Reply: how many replicas were seen within the window (this one included); with the
--        margins hash, {that count, then replica id, margin for each live replica's}
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window_ms = tonumber(ARGV[2])
local oldest = '(' .. string.format('%d', now_ms - window_ms)
redis.call('ZADD', KEYS[1], string.format('%d', now_ms), ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', oldest)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', oldest)
redis.call('PEXPIRE', KEYS[1], string.format('%d', 2 * window_ms))
for i = 2, 3 do
  if KEYS[i] then
    for _, replica in ipairs(gone) do
      redis.call('HDEL', KEYS[i], replica)
    end
    local own = ARGV[i + 1]
    if own and own ~= '' then
      redis.call('HSET', KEYS[i], ARGV[1], own)
    elseif i == 3 then
      redis.call('HDEL', KEYS[i], ARGV[1])
    end
    redis.call('PEXPIRE', KEYS[i], string.format('%d', 2 * window_ms))
  end
end
local count = redis.call('ZCARD', KEYS[1])
if not KEYS[3] then
  return count
end
local reply = {count}
local margins = redis.call('HGETALL', KEYS[3])
for i = 1, #margins, 2 do
  if redis.call('ZSCORE', KEYS[1], margins[i]) then
    table.insert(reply, margins[i])
    table.insert(reply, margins[i + 1])
  end
end
return reply
