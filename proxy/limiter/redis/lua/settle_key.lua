-- Free a parallel slot (the key's and its team's) and correct the windows (bucket.adjust
-- each).
-- KEYS: the key's leases, its team's leases (the key's again without a team), then the
--       buckets to correct.
-- ARGV: now ('' = server time), lease id ('' = none), then per bucket: interval, units
local now = clock(ARGV[1])
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[2], ARGV[2])
end
for i = 3, #KEYS do
  adjust(KEYS[i], tonumber(ARGV[2 * i - 3]), tonumber(ARGV[2 * i - 2]), now)
end
return 1
