-- Seconds until each deployment may take a request (health.unusable_for).
-- KEYS: the deployments' health keys. ARGV: now ('' = server time)
-- Reply: one number per key
local now = clock(ARGV[1])
local reply = {}
for i, key in ipairs(KEYS) do
  reply[i] = fmt(unusable_for(load_health(key, now), now))
end
return reply
