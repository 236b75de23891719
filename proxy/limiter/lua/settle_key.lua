-- Free a parallel slot and correct the key's token windows (bucket.adjust each).
-- KEYS: the key's leases, then the buckets to correct.
-- ARGV: now ('' = server time), lease id ('' = none), then per bucket: interval, units
local now = clock(ARGV[1])
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[1], ARGV[2])
end
for i = 2, #KEYS do
  adjust(KEYS[i], tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i]), now)
end
return 1
