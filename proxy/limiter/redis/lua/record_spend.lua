-- Add spend to the report's totals (spend.py): one hash per period, its fields summed;
-- and hold background responses' estimates (ledger.py). Once per write: a write sent
-- again after a timeout (it may have run) adds nothing if its number is not past the
-- last one its ledger wrote.
-- KEYS: the writer's mark, one hash per (period, index), then one key per estimate held;
--       all under one hash tag (one slot)
-- ARGV: the write's number, the mark's expiry in ms, the number of estimates held h;
--       per hash: its expiry in ms, the number of fields n, then n pairs of field,
--       amount; per estimate held: its expiry in ms, its record
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= last then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local held = tonumber(ARGV[3])
local a = 4
for i = 2, #KEYS - held do
  local ttl, n = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  for _ = 1, n do
    redis.call('HINCRBYFLOAT', KEYS[i], ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  redis.call('PEXPIRE', KEYS[i], ttl)
end
for i = #KEYS - held + 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[a + 1], 'PX', ARGV[a])
  a = a + 2
end
return 1
