-- A key's budgets now (read only).
-- KEYS: one quota per budget. ARGV: now ('' = server time)
-- Reply: now, then period index and spent of each budget.
local now = clock(ARGV[1])
local reply = {fmt(now)}
for j = 1, #KEYS do
  local p, s = load_quota(KEYS[j])
  table.insert(reply, fmt(p))
  table.insert(reply, fmt(s))
end
return reply
