-- wrk script: POST a JSON body (BENCH_BODY) with an optional key, and print a JSON
-- summary line the runner parses (requests, duration, latency percentiles, errors).
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("BENCH_KEY")
if key and key ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. key
  wrk.headers["x-api-key"] = key
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"status_errors":%d,"socket_errors":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
