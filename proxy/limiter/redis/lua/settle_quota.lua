-- Correct a key's budgets (quota.settle each): the period the reservation started in
-- (a charge for a period the budget has not reached yet starts it).
-- KEYS: one quota per budget to correct.
-- ARGV: now ('' = server time), then per budget: period, started (time), units
local now = clock(ARGV[1])
for j = 1, #KEYS do
  local a = 3 * j - 1
  local period, started, units = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local i = period_index(period, started)
  local p, s = load_quota(KEYS[j])
  if p == i or (p < i and units > 0) then
    local spent = math.max(0.0, spent_in(p, s, i) + units)
    store_quota(KEYS[j], {period = period, p = i, s = spent}, now)
  end
end
return 1
