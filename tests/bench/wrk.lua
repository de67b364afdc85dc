-- wrk script for the mesh benchmarks: POSTs a JSON body read from a template file, replacing
-- the one "{{ID}}" with an id unique across threads and runs (an A2A node dedupes repeated
-- messageIds, so a constant body would measure the dedupe path, not the work), and checks each
-- response contains an expected substring. Prints one JSON line prefixed "BENCH_JSON ".
--
--   wrk -t1 -c16 -d5s -s wrk.lua URL -- TEMPLATE_FILE RUN_PREFIX EXPECT [HEADER=VALUE ...]

local threads = {}
local next_tid = 0

function setup(thread)
  next_tid = next_tid + 1
  thread:set("tid", next_tid)
  table.insert(threads, thread)
end

function init(args)
  local fh = assert(io.open(args[1], "rb"))
  local template = fh:read("*a")
  fh:close()
  local at = assert(string.find(template, "{{ID}}", 1, true), "template has no {{ID}}")
  head = string.sub(template, 1, at - 1)
  tail = string.sub(template, at + 6)
  prefix = args[2] .. "-" .. tid .. "-"
  expect = args[3]
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  for i = 4, #args do
    local name, value = string.match(args[i], "^([^=]+)=(.*)$")
    wrk.headers[name] = value
  end
  counter = 0
  bad = 0
  first_bad = ""
end

function request()
  counter = counter + 1
  return wrk.format(nil, nil, nil, head .. prefix .. counter .. tail)
end

function response(status, headers, body)
  if status ~= 200 or not string.find(body, expect, 1, true) then
    bad = bad + 1
    if first_bad == "" then
      first_bad = status .. " " .. string.sub(body, 1, 200)
    end
  end
end

local function quote(s)
  return '"' .. string.gsub(s, '[%c"\\]', function(c)
    return string.format("\\u%04x", string.byte(c))
  end) .. '"'
end

function done(summary, latency, requests)
  local bad_total, sent, sample = 0, 0, ""
  for _, t in ipairs(threads) do
    bad_total = bad_total + t:get("bad")
    sent = sent + t:get("counter")
    if sample == "" then sample = t:get("first_bad") end
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"sent":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d,"status":%d,"unexpected":%d},' ..
    '"first_unexpected":%s,' ..
    '"latency_us":{"min":%d,"mean":%.1f,"max":%d,"p50":%d,"p90":%d,"p99":%d}}\n',
    summary.requests, sent, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.timeout, e.status, bad_total, quote(sample),
    latency.min, latency.mean, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
