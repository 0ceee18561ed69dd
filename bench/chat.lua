-- wrk script for bench/load.sh: POSTs an OpenAI chat completion (or an embedding) and prints one
-- JSON line of results from done().
--
-- Settings come from environment variables (wrk passes no options to Lua threads):
--   BENCH_MODE=m          plain (default): a chat completion; stream: a streamed one
--                         ("stream": true); embed: an embedding (the URL's path must be
--                         /v1/embeddings); BENCH_STREAM=1 is the old spelling of stream
--   BENCH_KEY=sk-...      bearer key sent in Authorization
--   BENCH_PROJECTS=N      cycle x-project-id over N fixed values (default 1000); requests are
--                         pre-formatted once, so the client spends nothing per request on them
--   BENCH_DISTINCT=1      instead, a fresh x-project-id on every request: "<prefix>-<thread>-<n>"
--   BENCH_PREFIX=s        prefix of distinct project ids (so a second batch stays distinct)
--   BENCH_LIMIT=N         with BENCH_DISTINCT: each thread stops after N responses
--   BENCH_LABEL=json      a JSON object merged into the output line (mode, target, ...)
--
-- Output: one line `BENCH_RESULT {...}` with requests, duration_s, rps, errors and latency
-- percentiles in microseconds (wrk measures each request until its last body byte, so a
-- streamed answer counts until the end of the stream).

local mode = os.getenv("BENCH_MODE") or "plain"
if os.getenv("BENCH_STREAM") == "1" then
  mode = "stream"
end
local key = os.getenv("BENCH_KEY") or "sk-bench"
local projects = tonumber(os.getenv("BENCH_PROJECTS") or "1000")
local distinct = os.getenv("BENCH_DISTINCT") == "1"
local prefix = os.getenv("BENCH_PREFIX") or "p"
local limit = tonumber(os.getenv("BENCH_LIMIT") or "0")

local body
if mode == "stream" then
  body = '{"model":"bench-chat","stream":true,"max_tokens":16,'
    .. '"messages":[{"role":"user","content":"Say hello in one short sentence."}]}'
elseif mode == "embed" then
  body = '{"model":"bench-embed","input":"Say hello in one short sentence."}'
elseif mode == "plain" then
  body = '{"model":"bench-chat","max_tokens":16,'
    .. '"messages":[{"role":"user","content":"Say hello in one short sentence."}]}'
else
  error("BENCH_MODE must be plain, stream or embed, not " .. mode)
end

local headers = {
  ["Content-Type"] = "application/json",
  ["Authorization"] = "Bearer " .. key,
}

-- Main-thread bookkeeping: give every thread its own number for distinct ids.
local threads = {}
local next_id = 0

function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

local prepared = {}
local cursor = 0
local sent = 0
local received = 0

function init(args)
  wrk.method = "POST"
  if not distinct then
    for i = 1, projects do
      headers["x-project-id"] = string.format("bench-project-%d", i)
      prepared[i] = wrk.format("POST", wrk.path, headers, body)
    end
    cursor = (tid or 0) * 7919 % projects
  end
end

function request()
  if distinct then
    sent = sent + 1
    headers["x-project-id"] = string.format("%s-%d-%d", prefix, tid or 0, sent)
    return wrk.format("POST", wrk.path, headers, body)
  end
  cursor = cursor % projects + 1
  return prepared[cursor]
end

-- response() is only defined when a request limit is set: defining it makes wrk hand every
-- body to Lua, which would cost client CPU in the timed runs.
if distinct and limit > 0 then
  function response(status, hdrs, resp_body)
    received = received + 1
    if received >= limit then
      wrk.thread:stop()
    end
  end
end

function done(summary, latency, requests)
  local errors = summary.errors
  local duration_s = summary.duration / 1e6
  local out = {
    string.format('"requests":%d', summary.requests),
    string.format('"duration_s":%.3f', duration_s),
    string.format('"rps":%.1f', summary.requests / duration_s),
    string.format('"errors_connect":%d', errors.connect),
    string.format('"errors_read":%d', errors.read),
    string.format('"errors_write":%d', errors.write),
    string.format('"errors_status":%d', errors.status),
    string.format('"errors_timeout":%d', errors.timeout),
    string.format('"lat_mean_us":%.1f', latency.mean),
    string.format('"lat_max_us":%d', latency.max),
  }
  for _, p in ipairs({ 50, 90, 99, 99.9 }) do
    local name = string.gsub(tostring(p), "%.", "_")
    table.insert(out, string.format('"p%s_us":%d', name, latency:percentile(p)))
  end
  local label = os.getenv("BENCH_LABEL")
  if label and #label > 2 then
    table.insert(out, string.sub(label, 2, -2))
  end
  io.write("BENCH_RESULT {" .. table.concat(out, ",") .. "}\n")
end
