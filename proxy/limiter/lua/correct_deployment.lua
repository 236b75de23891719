-- Add corrections to a deployment's buckets (bucket.adjust each).
-- KEYS: the buckets to correct. ARGV: now ('' = server time), then per bucket: interval,
--       units (negative refunds)
local now = clock(ARGV[1])
for i, key in ipairs(KEYS) do
  adjust(key, tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1]), now)
end
return 1
