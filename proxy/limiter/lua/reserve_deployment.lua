-- Reserve a turn on the candidate whose turn comes soonest (bucket.take_soonest).
-- KEYS: every candidate's buckets, in order (one hash tag per model group: one slot)
-- ARGV: now ('' = server time), max_wait, then per candidate: its bucket count n, then
--       n times: interval, capacity, cost
-- Reply: outcome, chosen index (0-based, -1 none), wait, retry_after, binding, then each
--        candidate's wait ('inf' when too large).
local now = clock(ARGV[1])
local max_wait = tonumber(ARGV[2])
local candidates = {}
local argi, keyi = 3, 1
while argi <= #ARGV do
  local n = tonumber(ARGV[argi])
  argi = argi + 1
  local buckets = {}
  for _ = 1, n do
    table.insert(buckets, bucket(KEYS[keyi], tonumber(ARGV[argi]), tonumber(ARGV[argi + 1]),
      tonumber(ARGV[argi + 2]), now))
    keyi = keyi + 1
    argi = argi + 3
  end
  table.insert(candidates, buckets)
end

local plans, waits, best = {}, {}, 0
for i, buckets in ipairs(candidates) do
  local wait, binding, too_large = plan(buckets)
  plans[i] = {wait, binding, too_large}
  if too_large >= 0 then
    waits[i] = math.huge
  else
    waits[i] = wait
  end
end
for i, w in ipairs(waits) do
  if w ~= math.huge and (best == 0 or w < waits[best]) then
    best = i
  end
end

local reply
if best == 0 then
  reply = {'too_large', '-1', fmt(0.0), fmt(0.0), tostring(plans[1][3])}
else
  local p = plans[best]
  local outcome, w, retry, bind = decide(p[1], p[2], p[3], max_wait)
  local chosen = -1
  if outcome == 'allowed' then
    charge(candidates[best], p[1], now)
    chosen = best - 1
  end
  reply = {outcome, tostring(chosen), fmt(w), fmt(retry), tostring(bind)}
end
for _, w in ipairs(waits) do
  table.insert(reply, fmt(w))
end
return reply
