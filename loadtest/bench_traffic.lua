-- wrk script of loadtest/bench/ (real traffic): each request's client key, model group and
-- streaming drawn from a seeded PRNG, on the group's route (OpenAI chat, Anthropic
-- Messages, OpenAI Responses); the run's figures printed as one JSON line when done
-- (parsed by loadtest/bench/wrk.py). Told by environment (loadtest/bench/traffic.py):
--   BENCH_KEYS=1000 BENCH_GROUPS=chat:gpt-4o-mini:55,messages:claude-sonnet:30 \
--   BENCH_STREAM_PERCENT=20 BENCH_SEED=1 BENCH_PORTS=8001,8002 \
--   wrk -t2 -c64 -d10s -s loadtest/bench_traffic.lua http://127.0.0.1:8001/
-- BENCH_PORTS: thread i sends to the i-th port (mod their number): one replica each.
-- BENCH_THREAD_KEYS=0,0,1,1 (saturation): thread i sends only with that key, after an
-- exponential pause of mean BENCH_THREAD_DELAYS_MS (one per thread) before each request,
-- and counts its answers by status, reported per thread.
local keys = tonumber(os.getenv("BENCH_KEYS") or "1000")
local stream_percent = tonumber(os.getenv("BENCH_STREAM_PERCENT") or "0")
local seed = tonumber(os.getenv("BENCH_SEED") or "1")
local version = os.getenv("BENCH_ANTHROPIC_VERSION") or "2023-06-01"
local paths = {chat = "/v1/chat/completions", messages = "/v1/messages", responses = "/v1/responses"}
local prompt = "Benchmark: say something short."

local function list(name)
  local found = {}
  for item in string.gmatch(os.getenv(name) or "", "[^,]+") do found[#found + 1] = item end
  return found
end

local groups = {}  -- {api, model, cumulative share}
local total = 0
for _, item in ipairs(list("BENCH_GROUPS")) do
  local api, model, share = string.match(item, "^(%w+):([^:]+):(%d+)$")
  total = total + tonumber(share)
  groups[#groups + 1] = {api = api, model = model, upto = total}
end
local ports = list("BENCH_PORTS")
local thread_keys = list("BENCH_THREAD_KEYS")
local thread_delays = list("BENCH_THREAD_DELAYS_MS")

local function body(api, model, stream)
  local tail = stream and ',"stream":true}' or "}"
  if api == "responses" then
    return '{"model":"' .. model .. '","max_output_tokens":16,"input":"' .. prompt .. '"' .. tail
  end
  return '{"model":"' .. model .. '","max_tokens":16,'
    .. '"messages":[{"role":"user","content":"' .. prompt .. '"}]' .. tail
end

-- Each (group, streamed) request as the text before the key and after it.
local before, after = {}, {}

local threads, counter = {}, 0
function setup(thread)
  counter = counter + 1
  thread:set("id", counter)
  if #ports > 0 then
    thread.addr = wrk.lookup(wrk.host, ports[(counter - 1) % #ports + 1])[1]
  end
  threads[#threads + 1] = thread
end

local fixed_key, mean_delay = nil, nil
function init(args)
  local id = tonumber(wrk.thread:get("id")) or 1
  math.randomseed(seed * 1000 + id)
  if thread_keys[id] then fixed_key = tonumber(thread_keys[id]) end
  if thread_delays[id] then mean_delay = tonumber(thread_delays[id]) end
  local host = wrk.headers["Host"]
  for i, g in ipairs(groups) do
    for _, stream in ipairs({false, true}) do
      local text = body(g.api, g.model, stream)
      local auth = "Authorization: Bearer "
      if g.api == "messages" then auth = "anthropic-version: " .. version .. "\r\nx-api-key: " end
      local slot = i * 2 + (stream and 1 or 0)
      before[slot] = "POST " .. paths[g.api] .. " HTTP/1.1\r\nHost: " .. host
        .. "\r\nContent-Type: application/json\r\nContent-Length: " .. #text .. "\r\n" .. auth
      after[slot] = "\r\n\r\n" .. text
    end
  end
end

function request()
  local key = fixed_key or math.random(0, keys - 1)
  local draw = math.random(1, total)
  local i = 1
  while groups[i].upto < draw do i = i + 1 end
  local slot = i * 2 + ((math.random(1, 100) <= stream_percent) and 1 or 0)
  return before[slot] .. string.format("sk-bench-%06d", key) .. after[slot]
end

if #thread_delays > 0 then
  function delay()
    if not mean_delay or mean_delay <= 0 then return 0 end
    return math.floor(-math.log(1 - math.random()) * mean_delay)
  end
end

-- Globals: done() reads each thread's with thread:get.
ok, refused, other = 0, 0, 0
if #thread_keys > 0 then
  function response(status, headers, body)
    if status == 200 then ok = ok + 1 elseif status == 429 then refused = refused + 1
    else other = other + 1 end
  end
end

done = function(summary, latency, requests)
  local e = summary.errors
  local per_thread = {}
  if #thread_keys > 0 then
    for i, t in ipairs(threads) do
      per_thread[#per_thread + 1] = string.format(
        '{"key":%d,"ok":%d,"refused":%d,"other":%d}',
        tonumber(thread_keys[i]) or -1, t:get("ok") or 0, t:get("refused") or 0, t:get("other") or 0)
    end
  end
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,"connect_errors":%d,"read_errors":%d,'
      .. '"write_errors":%d,"timeouts":%d,"non_2xx":%d,'
      .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d,"threads":[%s]}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.timeout, e.status, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.mean, latency.max, table.concat(per_thread, ",")))
end
