-- Give back what a turn lease did not hand out (turns.returned): each bucket that still
-- holds what the lease left is set to the replica's local bucket.
-- KEYS: the lease's buckets
-- ARGV: the lease's time, then per bucket: interval, the debt the lease left, the local
--       bucket's debt and time
local at = tonumber(ARGV[1])
for i = 1, #KEYS do
  local a = 4 * i - 2
  return_turns(KEYS[i], tonumber(ARGV[a + 1]), at, tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
    tonumber(ARGV[a]))
end
return 1
