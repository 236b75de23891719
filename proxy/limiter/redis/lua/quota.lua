-- Budgets: quotas for calendar periods (prepended to the key scripts after bucket.lua).
-- A line-by-line mirror of proxy/limiter/periods.py and proxy/limiter/quota.py: same
-- integer arithmetic, same order. Change them together.

-- A quota key outlives its period by a day (read by nothing after its period).
local QUOTA_SLACK_S = 86400

local function idiv(a, b)
  return math.floor(a / b)
end

-- periods.days_from_civil (Howard Hinnant's algorithm)
local function days_from_civil(y, m, d)
  if m <= 2 then
    y = y - 1
  end
  local era = idiv(y, 400)
  local yoe = y - era * 400
  local mm = m + 9
  if m > 2 then
    mm = m - 3
  end
  local doy = idiv(153 * mm + 2, 5) + d - 1
  local doe = yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + doy
  return era * 146097 + doe - 719468
end

-- periods.civil_from_days: year and month
local function civil_from_days(days)
  local z = days + 719468
  local era = idiv(z, 146097)
  local doe = z - era * 146097
  local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
  local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
  local mp = idiv(5 * doy + 2, 153)
  local month = mp - 9
  if mp < 10 then
    month = mp + 3
  end
  local year = yoe + era * 400
  if month <= 2 then
    year = year + 1
  end
  return year, month
end

-- periods.index
local function period_index(period, t)
  local days = math.floor(t / 86400)
  if period == 'day' then
    return days
  end
  if period == 'week' then
    return idiv(days + 3, 7)
  end
  local year, month = civil_from_days(days)
  return year * 12 + month - 1
end

-- periods.start
local function period_start(period, i)
  if period == 'day' then
    return i * 86400
  end
  if period == 'week' then
    return (i * 7 - 3) * 86400
  end
  return days_from_civil(idiv(i, 12), i % 12 + 1, 1) * 86400
end

-- A missing key is quota.EMPTY: nothing spent.
local function load_quota(key)
  return load_pair(key, 'p', 's', -1, 0.0)
end

local function store_quota(key, q, now)
  redis.call('HSET', key, 'p', fmt(q.p), 's', fmt(q.s))
  local ttl = period_start(q.period, q.p + 1) - now + QUOTA_SLACK_S
  redis.call('PEXPIRE', key, string.format('%d', math.ceil(ttl * 1000)))
end

-- quota.spent_in
local function spent_in(p, s, i)
  if p == i then
    return s
  end
  return 0.0
end

-- quota.check without the store: each quota's state if charged; refused, retry_after
local function quota_check(quotas, now)
  local refused, retry_after = -1, 0.0
  for n, q in ipairs(quotas) do
    local i = period_index(q.period, now)
    local spent = spent_in(q.p0, q.s0, i)
    if q.cost > 0 and spent + q.cost > q.limit then
      local reset = period_start(q.period, i + 1) - now
      if reset > retry_after or refused < 0 then
        refused, retry_after = n - 1, reset
      end
    end
    q.p, q.s = i, spent + q.cost
  end
  return refused, retry_after
end

-- edge.fit: the output cap the budgets that clamp can pay (most when none lowers it,
-- or when one cannot pay least: quota_check then refuses). A line-by-line mirror of
-- proxy/limiter/core/edge.py: same operations, same order.
local function quota_fit(quotas, most, least, now)
  local cap = most
  for _, q in ipairs(quotas) do
    if q.clamp and q.per > 0 then
      local spent = spent_in(q.p0, q.s0, period_index(q.period, now))
      if spent + (q.base + q.per * cap) > q.limit then
        local left = q.limit - spent - q.base
        if left < q.per * least then
          return most
        end
        cap = math.min(cap, math.floor(left / q.per))
        while cap >= least and spent + (q.base + q.per * cap) > q.limit do
          cap = cap - 1
        end
        if cap < least then
          return most
        end
      end
    end
  end
  return cap
end

local function quota(key, period, limit, cost)
  local p, s = load_quota(key)
  return {key = key, period = period, limit = limit, cost = cost, p0 = p, s0 = s, p = p, s = s}
end

local function charge_quotas(quotas, now)
  for _, q in ipairs(quotas) do
    store_quota(q.key, q, now)
  end
end

local function unchanged_quotas(quotas)
  for _, q in ipairs(quotas) do
    q.p, q.s = q.p0, q.s0
  end
end
