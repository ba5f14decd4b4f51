-- wrk script of the serving benchmark: POST /v1/embeddings (or PATH), one text per request.
--
-- wrk -t T ... -s bench/embed.lua URL -- BODIES FIRST COUNT T [PATH]
--   BODIES: a file with one JSON request body per line (bench/run.py writes it)
--   FIRST, COUNT: this measurement's slice of lines (1-based FIRST)
--   T: wrk's thread count (-t)
--   PATH: the route posted to (default /v1/embeddings; the frontend section posts
--   System One questions to /v1/systemone)
-- wrk thread t (0-based) of T takes lines FIRST+t, FIRST+t+T, ... of the slice, so
-- no two threads and no two connections ever send the same sentence. Past the
-- end of its share a thread starts over (counted as "wrapped": repeats would be
-- result-cache hits); bench/run.py sizes slices so that this does not happen.
-- done() prints one line "WRKJSON {...}" with the totals and latency percentiles (us).

local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  local path, first, count = args[1], tonumber(args[2]), tonumber(args[3])
  local nthreads = tonumber(args[4]) or 1
  local route = args[5] or "/v1/embeddings"
  requests_ = {}
  local index = 0
  for line in io.lines(path) do
    index = index + 1
    if index >= first + count then break end
    if index >= first and (index - first) % nthreads == tid then
      requests_[#requests_ + 1] = wrk.format(
        "POST", route, { ["Content-Type"] = "application/json" }, line)
    end
  end
  sent = 0
  wrapped = 0
  share = #requests_
end

function request()
  counter = counter + 1
  if counter > share then
    counter = 1
    wrapped = wrapped + 1
  end
  sent = sent + 1
  return requests_[counter]
end

function done(summary, latency, requests)
  local sent_total, wrapped_total, share_total = 0, 0, 0
  for _, thread in ipairs(threads) do
    sent_total = sent_total + (thread:get("sent") or 0)
    wrapped_total = wrapped_total + (thread:get("wrapped") or 0)
    share_total = share_total + (thread:get("share") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "mean": %.1f, "max": %d, "min": %d}, ' ..
    '"sent": %d, "wrapped": %d, "slice": %d}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max, latency.min,
    sent_total, wrapped_total, share_total))
end
