-- wrk script of loadtest/bench/: POST one chat completion per request, and print the
-- run's figures as one JSON line (parsed by loadtest/bench/wrk.py) when wrk is done.
--   BENCH_API_KEY=sk-... wrk -t1 -c64 -d10s -s loadtest/bench_chat.lua http://HOST/v1/chat/completions
-- BENCH_MODEL names the model (default gpt-4o-mini; the peer gateway's name differs).
local key = os.getenv("BENCH_API_KEY")
local model = os.getenv("BENCH_MODEL")
if not model or model == "" then
  model = "gpt-4o-mini"
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
if key and key ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. key
end
wrk.body = '{"model":"' .. model .. '","max_tokens":16,'
  .. '"messages":[{"role":"user","content":"Benchmark: say something short."}]}'

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,"connect_errors":%d,"read_errors":%d,'
      .. '"write_errors":%d,"timeouts":%d,"non_2xx":%d,'
      .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.timeout, e.status, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.mean, latency.max))
end
