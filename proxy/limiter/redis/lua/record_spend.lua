-- Add spend to the report's totals (spend.py): one hash per period, its fields summed.
-- KEYS: one hash per (period, index), all under one hash tag (one slot)
-- ARGV: per key: its expiry in ms, the number of fields n, then n pairs of field, amount
local a = 1
for i = 1, #KEYS do
  local ttl, n = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  for _ = 1, n do
    redis.call('HINCRBYFLOAT', KEYS[i], ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return 1
