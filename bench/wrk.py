"""Drive `wrk` with a Lua script and read its results as JSON.

Both scripts build the request body in Lua (random keys among `keys`), count answers
by status (2xx, 429, other) and the `"degraded":true` decisions in the bodies, and
print one `WRK_JSON {...}` line from wrk's `done()` callback, which this module parses.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.env import require_tool
from cluster.local.procs import child_preexec

LIMITS_JSON = '[{"algorithm":"fixed_window","limit":1000000000,"window":"1h"}]'

# Shared by both scripts: per-thread counters and the JSON summary.
TALLY_LUA = r"""
local threads = {}
function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end
function init(args)
  math.randomseed(os.time() * 1000 + id)
  ok, denied, other, degraded, decisions = 0, 0, 0, 0, 0
end
function response(status, headers, body)
  if status == 429 then
    denied = denied + 1
    decisions = decisions + PER_REQUEST
  elseif status >= 200 and status < 300 then
    ok = ok + 1
    decisions = decisions + PER_REQUEST
  else
    other = other + 1
  end
  local from = 1
  while true do
    local at = string.find(body, '"degraded":true', from, true)
    if not at then break end
    degraded = degraded + 1
    from = at + 15
  end
end
function done(summary, latency, requests)
  local t = {ok = 0, denied = 0, other = 0, degraded = 0, decisions = 0}
  for _, thread in ipairs(threads) do
    for name, _ in pairs(t) do t[name] = t[name] + (thread:get(name) or 0) end
  end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"seconds":%.3f,"requests":%d,"bytes":%d,"ok_2xx":%d,"denied_429":%d,' ..
    '"other_status":%d,"degraded":%d,"decisions":%d,"socket_errors":{"connect":%d,' ..
    '"read":%d,"write":%d,"timeout":%d},"latency_ms":{"mean":%.3f,"p50":%.3f,' ..
    '"p90":%.3f,"p99":%.3f,"max":%.3f}}\n',
    summary.duration / 1e6, summary.requests, summary.bytes, t.ok, t.denied, t.other,
    t.degraded, t.decisions, e.connect, e.read, e.write, e.timeout,
    latency.mean / 1000, latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
"""


def check_script(keys: int) -> str:
    """POST /v1/check, one random key per request."""
    return (
        f"local KEYS, PER_REQUEST = {keys}, 1\n"
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        "function request()\n"
        "  return wrk.format(nil, nil, nil, string.format(\n"
        f'    \'{{"key":"user:%d","limits":{LIMITS_JSON}}}\', math.random(0, KEYS - 1)))\n'
        "end\n" + TALLY_LUA
    )


def batch_script(keys: int, batch: int) -> str:
    """POST /v1/check/batch, `batch` random keys per request, body built per request."""
    return (
        f"local KEYS, BATCH, PER_REQUEST = {keys}, {batch}, {batch}\n"
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'local TAIL = \'","limits":{LIMITS_JSON}}}\'\n'
        "local parts = {}\n"
        "function request()\n"
        "  for i = 1, BATCH do\n"
        '    parts[i] = \'{"key":"user:\' .. math.random(0, KEYS - 1) .. TAIL\n'
        "  end\n"
        "  return wrk.format(nil, nil, nil, '{\"checks\":[' .. table.concat(parts, ',') .. ']}')\n"
        "end\n" + TALLY_LUA
    )


@dataclass(frozen=True)
class WrkSettings:
    threads: int = 1
    connections: int = 64
    seconds: float = 10.0
    timeout_s: float = 2.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "threads": self.threads,
            "connections": self.connections,
            "seconds": self.seconds,
            "timeout_s": self.timeout_s,
        }


def run_wrk(url: str, script: str, settings: WrkSettings) -> dict[str, Any]:
    """Run wrk against `url` with the Lua `script`; the parsed summary plus rates."""
    wrk = require_tool("wrk")
    with tempfile.TemporaryDirectory(prefix="sl-wrk-") as tmp:
        path = Path(tmp) / "load.lua"
        path.write_text(script)
        args = [
            wrk,
            f"-t{settings.threads}",
            f"-c{settings.connections}",
            f"-d{settings.seconds:g}s",
            f"--timeout={settings.timeout_s:g}s",
            "-s",
            str(path),
            url,
        ]
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=settings.seconds + 60,
            preexec_fn=child_preexec,
        )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("WRK_JSON ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-800:]} {done.stderr}")
    result: dict[str, Any] = json.loads(line.removeprefix("WRK_JSON "))
    seconds = result["seconds"] or settings.seconds
    result["requests_per_s"] = round(result["requests"] / seconds, 1)
    # Decisions: checks answered 2xx/429. A degraded one was decided without its node
    # (the rule's on_failure), so it is reported apart and not counted as served.
    result["decisions_per_s"] = round(result["decisions"] / seconds, 1)
    result["served_decisions_per_s"] = round(
        (result["decisions"] - result["degraded"]) / seconds, 1
    )
    return result
