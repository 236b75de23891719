-- Free a parallel slot and correct the key's token bucket.
-- KEYS: tpm bucket, leases. ARGV: now ('' = server time), lease id ('' = none),
--       tpm interval ('' = no tpm limit), token correction
local now = clock(ARGV[1])
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
end
if ARGV[3] ~= '' then
  adjust(KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4]), now)
end
return 1
