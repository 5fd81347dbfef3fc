"""Router CPU per check: Envoy's ShouldRateLimit over gRPC against POST /v1/check.

Starts a scratch cluster (3 nodes, one router with `grpc_port` and a descriptors file),
then drives the router from another process at one fixed open-loop rate, once over
HTTP (bench.openloop: single checks, a fixed window of 1e9 an hour on `user:<n>`) and
once over gRPC (this module's `drive` mode: one descriptor `user=<n>` under a
`rate_limit` of 1e9 an hour, so the same check reaches a node), sent as Envoy's HTTP/2
codec sends it (`--client envoy-like`: raw HTTP/2, 256 MiB stream windows, so no
WINDOW_UPDATE per call) or by a grpcio asyncio client (`--client grpcio`, which sends two
WINDOW_UPDATE frames after every answer: one more read for the router per call).
Both loads send on the ticks of a kernel timer (bench.ticker). The router's CPU is
read from /proc/<pid>/stat (utime + stime, every thread) over the steady middle of each
run; CPU per check = CPU seconds / (rate x window), and its wake-ups per check (voluntary
context switches of its main thread) beside it. The two run
in `--repeat` pairs (alternating which goes first); prints JSON with each pair's
figures and the median pair's ratio (gRPC / HTTP); `--profile` adds a py-spy run per
protocol (bench/profile.py's summary: top innermost frames of busy samples);
`--server grpcio` measures grpcio's asyncio server instead of the lean one.

    .venv/bin/python -m bench.grpc_cost --rate 500 --seconds 10 [--profile] [--server grpcio]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from bench import ticker
from bench.cpu import CLK_TCK, voluntary_switches
from bench.profile import PY_SPY, summarize
from cluster.local.cluster import scratch_cluster
from cluster.local.ports import free_port

DOMAIN = "bench"
CONFIG = f"""
domain: {DOMAIN}
descriptors:
  - key: user
    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}
"""
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
SETTLE_S = 1.0  # the start of a run left out of the CPU window (connections, warm-up)


def encoded_requests(keys: int, count: int, seed: int = 1) -> list[bytes]:
    """Serialized RateLimitRequests of one descriptor `user=<n>` on random keys."""
    from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped]

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        request = rls_pb2.RateLimitRequest(domain=DOMAIN)
        descriptor = request.descriptors.add()
        descriptor.entries.add(key="user", value=str(rng.randrange(keys)))
        out.append(request.SerializeToString())
    return out


async def drive(
    target: str, rate: float, seconds: float, keys: int, channels: int
) -> dict[str, Any]:
    """Open-loop ShouldRateLimit calls: call i is sent at start + i / rate whatever the
    answers do (each call its own task); latency from the scheduled time."""
    import grpc  # type: ignore[import-untyped]

    requests = encoded_requests(keys, 20_000)
    pool = [grpc.aio.insecure_channel(target) for _ in range(channels)]
    calls = [c.unary_unary(METHOD) for c in pool]  # bytes in, bytes out
    for channel in pool:
        await channel.channel_ready()
    latency = array("d")
    errors: dict[str, int] = {}
    tasks: set[asyncio.Task[None]] = set()

    async def one(index: int, scheduled: float) -> None:
        try:
            await calls[index % channels](requests[index % len(requests)], timeout=10)
        except grpc.aio.AioRpcError as exc:
            errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
        else:
            latency.append(time.monotonic() - scheduled)

    loop = asyncio.get_running_loop()

    def send(index: int, due: float) -> None:
        task = loop.create_task(one(index, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    total = int(rate * seconds)
    start, ended = await ticker.send_on_schedule(rate, total, send)
    if tasks:
        await asyncio.wait(list(tasks), timeout=10)
    for channel in pool:
        await channel.close()
    return _summary(rate, total, sorted(latency), ended - start, errors)


class _EnvoyLike(asyncio.Protocol):
    """One HTTP/2 connection speaking to the gRPC port as Envoy's HTTP/2 codec does:
    stream windows of 256 MiB (Envoy's default initial_stream_window_size), so no
    WINDOW_UPDATE per call; each call one write of HEADERS + DATA (END_STREAM)."""

    def __init__(self, authority: bytes) -> None:
        from router.envoy import h2_frames as f
        from router.envoy.hpack import Decoder, encode_int, literal

        self.f = f
        self.decoder = Decoder()
        path = METHOD.encode()
        self.head = (
            b"\x83\x86"  # :method POST, :scheme http
            + b"\x04"
            + encode_int(len(path), 7)
            + path  # :path, literal
            + b"\x01"
            + encode_int(len(authority), 7)
            + authority  # :authority
            + f.RESPONSE_HEADERS[1:]  # content-type: application/grpc
            + literal(b"te", b"trailers")
        )
        self.transport: asyncio.Transport | None = None
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.buffer = bytearray()
        self.next_id = 1
        self.open: dict[int, float] = {}  # stream -> scheduled send time
        self.latency = array("d")
        self.errors: dict[str, int] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        f = self.f
        self.transport = cast(asyncio.Transport, transport)
        window = 256 * 1024 * 1024
        settings = f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: window})
        self.transport.write(f.PREFACE + settings + f.window_update(0, window - f.DEFAULT_WINDOW))

    def send(self, message: bytes, scheduled: float) -> None:
        f = self.f
        stream, self.next_id = self.next_id, self.next_id + 2
        self.open[stream] = scheduled
        assert self.transport is not None
        self.transport.write(
            f.frame(f.HEADERS, f.END_HEADERS, stream, self.head)
            + f.frame(f.DATA, f.END_STREAM, stream, f.grpc_message(message))
        )

    def data_received(self, data: bytes) -> None:
        f = self.f
        self.buffer += data
        at, buffer, out = 0, self.buffer, []
        while len(buffer) - at >= 9:
            length = int.from_bytes(buffer[at : at + 3], "big")
            if len(buffer) - at < 9 + length:
                break
            kind, flags = buffer[at + 3], buffer[at + 4]
            stream = int.from_bytes(buffer[at + 5 : at + 9], "big")
            payload = bytes(buffer[at + 9 : at + 9 + length])
            at += 9 + length
            if kind == f.SETTINGS and not flags & f.ACK:
                out.append(f.frame(f.SETTINGS, f.ACK, 0))
                if not self.settled.done():
                    self.settled.set_result(None)
            elif kind == f.PING and not flags & f.ACK:
                out.append(f.frame(f.PING, f.ACK, 0, payload))
            elif kind == f.HEADERS:
                headers = dict(self.decoder.decode(payload))
                if flags & f.END_STREAM and stream in self.open:
                    scheduled = self.open.pop(stream)
                    status = headers.get(b"grpc-status", b"?").decode()
                    if status == "0":
                        self.latency.append(time.monotonic() - scheduled)
                    else:
                        self.errors[status] = self.errors.get(status, 0) + 1
        del buffer[:at]
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def drive_envoy_like(
    target: str, rate: float, seconds: float, keys: int, connections: int
) -> dict[str, Any]:
    """As `drive`, over raw HTTP/2 connections that behave as Envoy's (`_EnvoyLike`)."""
    host, port = target.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    pool = []
    for _ in range(connections):
        _, conn = await loop.create_connection(lambda: _EnvoyLike(target.encode()), host, int(port))
        pool.append(conn)
    await asyncio.wait_for(asyncio.gather(*(c.settled for c in pool)), 10)
    requests = encoded_requests(keys, 20_000)

    def send(index: int, due: float) -> None:
        pool[index % connections].send(requests[index % len(requests)], due)

    total = int(rate * seconds)
    start, ended = await ticker.send_on_schedule(rate, total, send)
    deadline = ended + 10
    while any(c.open for c in pool) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)  # the last answers, for a bounded time
    ordered = sorted(x for c in pool for x in c.latency)
    errors: dict[str, int] = {}
    for conn in pool:
        for code, count in conn.errors.items():
            errors[code] = errors.get(code, 0) + count
        if conn.transport is not None:
            conn.transport.close()
    return _summary(rate, total, ordered, ended - start, errors)


def _summary(
    rate: float, total: int, ordered: list[float], seconds: float, errors: dict[str, int]
) -> dict[str, Any]:
    def pct(q: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {
        "offered_per_s": rate,
        "sent": total,
        "answered": len(ordered),
        "achieved_per_s": round(len(ordered) / seconds, 1),
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "errors": errors,
    }


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(whole process, its main thread) utime + stime in seconds."""

    def ticks(path: Path) -> int:
        raw = path.read_text()
        fields = raw[raw.rindex(")") + 2 :].split()
        return int(fields[11]) + int(fields[12])

    proc = Path(f"/proc/{pid}")
    return ticks(proc / "stat") / CLK_TCK, ticks(proc / "task" / str(pid) / "stat") / CLK_TCK


def batches(router_url: str) -> tuple[float, float]:
    """(ops, batch requests) sent to nodes so far: shardlimit_node_batch_ops' sum and count."""
    with urllib.request.urlopen(router_url + "/metrics", timeout=10) as answer:  # noqa: S310
        text = answer.read().decode()
    ops = count = 0.0
    for line in text.splitlines():
        if line.startswith("shardlimit_node_batch_ops_sum"):
            ops += float(line.rsplit(" ", 1)[1])
        elif line.startswith("shardlimit_node_batch_ops_count"):
            count += float(line.rsplit(" ", 1)[1])
    return ops, count


@dataclass(frozen=True)
class Target:
    router_pid: int
    router_url: str
    rate: float
    spy_native: bool = False


def run_phase(
    name: str, argv: list[str], target: Target, seconds: float, spy_to: Path | None
) -> dict[str, Any]:
    """Run one load process; the router's CPU over [SETTLE_S, seconds - 0.5) of it."""
    router_pid, rate = target.router_pid, target.rate
    load = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    spy = None
    try:
        time.sleep(SETTLE_S + 0.5)  # the driver's start-up and first second
        window = max(1.0, seconds - SETTLE_S - 1.0)
        if spy_to is not None:
            spy_args = ["record", "--nonblocking", "--format", "raw", "--rate", "250"]
            spy_args += ["--duration", str(int(window)), "--pid", str(router_pid)]
            if target.spy_native:  # stacks with C frames need the process paused
                spy_args = [a for a in spy_args if a != "--nonblocking"] + ["--native"]
            spy = subprocess.Popen(
                [PY_SPY, *spy_args, "--output", str(spy_to)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        ops0, batches0 = batches(target.router_url)
        cpu0, main0 = cpu_seconds(router_pid)
        waits0 = voluntary_switches(router_pid) or 0
        t0 = time.monotonic()
        time.sleep(window)
        cpu1, main1 = cpu_seconds(router_pid)
        waits1 = voluntary_switches(router_pid) or 0
        ops1, batches1 = batches(target.router_url)
        elapsed = time.monotonic() - t0
        out, _ = load.communicate(timeout=seconds + 60)
    finally:
        if load.poll() is None:
            load.kill()
        if spy is not None:
            spy.wait(60)
    checks = rate * elapsed
    result: dict[str, Any] = {
        "load": {k: v for k, v in json.loads(out).items() if k in _LOAD_KEYS},
        "window_s": round(elapsed, 2),
        "router_cores": round((cpu1 - cpu0) / elapsed, 3),
        "router_main_thread_cores": round((main1 - main0) / elapsed, 3),
        "router_us_per_check": round((cpu1 - cpu0) / checks * 1e6, 1),
        "ops_per_node_batch": round((ops1 - ops0) / max(1.0, batches1 - batches0), 2),
        "router_waits_per_check": round((waits1 - waits0) / checks, 2),
    }
    if spy_to is not None and spy_to.exists():
        result["profile"] = summarize(spy_to.read_text(), top=15)
    print(f"{name}: {json.dumps(result)}", file=sys.stderr)
    return result


_LOAD_KEYS = (
    "offered_per_s",
    "sent",
    "answered",
    "achieved_per_s",
    "p50_ms",
    "p99_ms",
    "errors",
    "status",
    "degraded",
)


@dataclass(frozen=True)
class Options:
    rate: float = 500.0
    seconds: float = 10.0
    keys: int = 100_000
    channels: int = 1
    profile: bool = False
    native: bool = False  # py-spy --native: C frames too (grpcio's core, protobuf's upb)
    spy_dir: Path | None = None  # keep the raw py-spy stacks here
    server: str = "lean"  # SHARDLIMIT_GRPC_SERVER for the router: lean or grpcio
    repeat: int = 3  # pairs of runs (HTTP, gRPC); the median pair's ratio is reported
    client: str = "envoy-like"  # the gRPC load: raw HTTP/2 as Envoy's codec, or grpcio


def _argv(
    name: str, options: Options, run_s: float, router_url: str, grpc_target: str
) -> list[str]:
    common = ["--rate", str(options.rate), "--seconds", str(run_s), "--keys", str(options.keys)]
    if name == "http":
        return [
            sys.executable,
            "-m",
            "bench.openloop",
            "--url",
            router_url,
            "--warmup",
            "0",
            *common,
        ]
    drive_args = ["drive", "--target", grpc_target, "--channels", str(options.channels)]
    drive_args += ["--client", options.client]
    return [sys.executable, "-m", "bench.grpc_cost", *drive_args, *common]


def measure(options: Options) -> dict[str, Any]:
    before = os.environ.get("SHARDLIMIT_GRPC_SERVER")
    try:
        return _measure(options)
    finally:
        if before is None:
            os.environ.pop("SHARDLIMIT_GRPC_SERVER", None)
        else:
            os.environ["SHARDLIMIT_GRPC_SERVER"] = before


def _measure(options: Options) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sl-grpc-cost-") as tmp:
        config = Path(tmp) / "ratelimit.yaml"
        config.write_text(CONFIG)
        os.environ["SHARDLIMIT_GRPC_SERVER"] = options.server  # the router inherits it
        with scratch_cluster(3, grpc_port=free_port(), envoy_config=config) as local:
            grpc_target = f"127.0.0.1:{local.options.grpc_port}"
            target = Target(local.routers[0].pid, local.router_url, options.rate, options.native)

            def run(name: str, label: str, run_s: float, spy_to: Path | None) -> dict[str, Any]:
                argv = _argv(name, options, run_s, local.router_url, grpc_target)
                return run_phase(label, argv, target, run_s, spy_to)

            result: dict[str, Any] = {
                "grpc_server": options.server,
                "grpc_client": options.client,
                "rate_per_s": options.rate,
                "seconds": options.seconds,
                "cpus": os.cpu_count(),
            }
            for name in ("http", "grpc"):  # warm-up: the router's caches, connections, imports
                run(name, f"{name} (warm-up)", 4.0, None)
            # Pairs of runs, in alternating order (drift and neighbours' load spread over
            # both); the ratio reported is the median pair's.
            pairs: list[dict[str, Any]] = []
            for index in range(options.repeat):
                order = ("http", "grpc") if index % 2 == 0 else ("grpc", "http")
                pair = {name: run(name, name, options.seconds, None) for name in order}
                pairs.append(
                    {
                        "http_us_per_check": pair["http"]["router_us_per_check"],
                        "grpc_us_per_check": pair["grpc"]["router_us_per_check"],
                        "ratio": round(
                            pair["grpc"]["router_us_per_check"]
                            / pair["http"]["router_us_per_check"],
                            3,
                        ),
                        **{f"{name}_detail": pair[name] for name in order},
                    }
                )
            median = sorted(pairs, key=lambda p: p["ratio"])[len(pairs) // 2]
            result["http"], result["grpc"] = median["http_detail"], median["grpc_detail"]
            result["ratio_grpc_over_http"] = median["ratio"]
            result["pairs"] = [
                {k: v for k, v in p.items() if not k.endswith("_detail")} for p in pairs
            ]
            if options.profile:
                spy_dir = options.spy_dir or Path(tmp)
                spy_dir.mkdir(parents=True, exist_ok=True)
                for name in ("http", "grpc"):
                    spied = run(name, f"{name} (py-spy)", options.seconds, spy_dir / f"{name}.txt")
                    result[f"{name}_profile"] = spied.get("profile")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode")
    one = sub.add_parser("drive", help="(internal) the gRPC load process")
    one.add_argument("--target", required=True)
    for p in (parser, one):
        p.add_argument("--rate", type=float, default=500.0)
        p.add_argument("--seconds", type=float, default=10.0)
        p.add_argument("--keys", type=int, default=100_000)
        p.add_argument("--channels", type=int, default=1, help="gRPC connections (Envoy: few)")
        p.add_argument(
            "--client",
            choices=("envoy-like", "grpcio"),
            default="envoy-like",
            help="gRPC load: raw HTTP/2 as Envoy's codec sends it, or a grpcio client",
        )
    parser.add_argument("--profile", action="store_true", help="also a py-spy run per protocol")
    parser.add_argument("--native", action="store_true", help="py-spy --native")
    parser.add_argument("--spy-dir", type=Path, help="keep py-spy's raw stacks here")
    parser.add_argument(
        "--server", choices=("lean", "grpcio"), default="lean", help="the router's gRPC server"
    )
    parser.add_argument("--repeat", type=int, default=3, help="pairs of runs (median reported)")
    args = parser.parse_args()
    if args.mode == "drive":
        driver = drive_envoy_like if args.client == "envoy-like" else drive
        load = driver(args.target, args.rate, args.seconds, args.keys, args.channels)
        print(json.dumps(asyncio.run(load)))
        return
    options = Options(
        args.rate,
        args.seconds,
        args.keys,
        args.channels,
        args.profile,
        args.native,
        args.spy_dir,
        args.server,
        args.repeat,
        args.client,
    )
    print(json.dumps(measure(options), indent=2))


if __name__ == "__main__":
    main()
