-- fairness.py, line by line (prepended to reserve_deployment after bucket.lua and
-- health.lua). The claimant's committed turns ahead: a sorted set scored by turn time;
-- the keys waiting without a turn: a hash of key name -> 'tier weight until'.

-- How long the waiting hash outlives its last write (entries expire by their ``until``).
local WAITING_KEEP_MS = 60000

-- memory._fair_view: the claimant's turns ahead (ascending) and the unexpired waiters
local function load_fairness(held_key, waiting_key, now)
  redis.call('ZREMRANGEBYSCORE', held_key, '-inf', fmt(now))
  local held = {}
  local raw = redis.call('ZRANGE', held_key, 0, -1, 'WITHSCORES')
  for i = 2, #raw, 2 do
    table.insert(held, tonumber(raw[i]))
  end
  local waiting = {}
  local entries = redis.call('HGETALL', waiting_key)
  for i = 1, #entries, 2 do
    local tier, weight, expiry = string.match(entries[i + 1], '^(%S+) (%S+) (%S+)$')
    expiry = tonumber(expiry)
    if expiry > now then
      table.insert(waiting, {key = entries[i], tier = tonumber(tier), weight = tonumber(weight)})
    else
      redis.call('HDEL', waiting_key, entries[i])
    end
  end
  table.sort(waiting, function(a, b) return a.key < b.key end)
  return held, waiting
end

-- selection.pace
local function pace(buckets)
  local p = 0.0
  for _, b in ipairs(buckets) do
    p = math.max(p, b.cost * b.interval)
  end
  return p
end

-- fairness.depth (over the paces of the reservable candidates)
local function depth(paces, lookahead)
  local total = 0.0
  for _, seconds in ipairs(paces) do
    if seconds <= 0.0 then
      return math.huge
    end
    total = total + lookahead / seconds
  end
  return total
end

-- fairness.defer: nil (commit) or retry_after, reason
local function defer(key, tier, weight, wait, held, waiting, turns, lookahead, now)
  if wait <= 0.0 then
    return nil
  end
  local tier_weight = weight
  for _, w in ipairs(waiting) do
    if w.key ~= key then
      if w.tier > tier then
        return math.max(wait - lookahead, FAIR_MIN_RETRY), 'tier'
      end
      if w.tier == tier then
        tier_weight = tier_weight + w.weight
      end
    end
  end
  if wait > lookahead + FAIR_SLACK then
    return math.max(wait - lookahead, FAIR_MIN_RETRY), 'lookahead'
  end
  local share = math.max(1.0, turns * weight / tier_weight)
  if #held > 0 and #held + 1 > share + FAIR_SLACK then
    return math.max(held[1] - now, FAIR_MIN_RETRY), 'share'
  end
  return nil
end

-- memory._record_fairness, deferred: the claimant waits until retry + WAITING_MARGIN
local function record_waiting(waiting_key, key, tier, weight, retry_after, now)
  local expiry = now + retry_after + FAIR_WAITING_MARGIN
  redis.call('HSET', waiting_key, key, fmt(tier) .. ' ' .. fmt(weight) .. ' ' .. fmt(expiry))
  redis.call('PEXPIRE', waiting_key, WAITING_KEEP_MS)
end

-- memory._record_fairness, committed: it stops waiting; a turn ahead is held
local function record_turn(held_key, waiting_key, key, wait, lease_id, now)
  redis.call('HDEL', waiting_key, key)
  if wait > 0.0 then
    local turn = now + wait
    redis.call('ZADD', held_key, fmt(turn), fmt(turn) .. ' ' .. lease_id)
    local keep = math.ceil(wait * 1000) + 1000
    if redis.call('PTTL', held_key) < keep then
      redis.call('PEXPIRE', held_key, string.format('%d', keep))
    end
  end
end
