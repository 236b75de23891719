-- Each deployment of a group as stored now: the health fields a snapshot reads and the
-- raw state of its learned bucket and of each window's bucket. The figures (what is
-- left, the next turn, ...) are computed from them in Python (verdicts.deployment_state),
-- as the memory backend does from its own state.
-- KEYS: per deployment: its health, its learned bucket, then its window buckets
-- ARGV: now ('' = server time), then per deployment: its window count n
-- Reply: now, then per deployment: cooling (0/1), cool_until, probe_until, hold_until,
--        learned, learned_at, the learned bucket's debt and time, then debt and time of
--        each window
local now = clock(ARGV[1])
local reply = {fmt(now)}
local keyi = 1
for argi = 2, #ARGV do
  local h = load_health(KEYS[keyi], now)
  table.insert(reply, h.cooling and '1' or '0')
  for _, v in ipairs({h.cool_until, h.probe_until, h.hold_until, h.learned, h.learned_at}) do
    table.insert(reply, fmt(v))
  end
  for i = 1, tonumber(ARGV[argi]) + 1 do
    local d, t = load_state(KEYS[keyi + i])
    table.insert(reply, fmt(d))
    table.insert(reply, fmt(t))
  end
  keyi = keyi + tonumber(ARGV[argi]) + 2
end
return reply
