-- POST /v1/sagas/bench_order, optionally with a fresh Idempotency-Key per request
-- (WRK_KEYS=1). Each wrk thread numbers its own keys, prefixed by its thread id.
local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  keys = os.getenv("WRK_KEYS") == "1"
  prefix = tostring(tid) .. "-" .. tostring(os.time()) .. "-"
end

function request()
  counter = counter + 1
  local headers = { ["Content-Type"] = "application/json" }
  if keys then
    headers["Idempotency-Key"] = prefix .. counter
  end
  return wrk.format("POST", "/v1/sagas/bench_order", headers, '{"order":"http"}')
end

function done(summary, latency, requests)
  io.write(string.format("wrk_summary requests=%d errors_status=%d p50_ms=%.2f p99_ms=%.2f\n",
    summary.requests, summary.errors.status, latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
