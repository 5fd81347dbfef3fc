"""A closed-loop HTTP load generator that runs in its own process.

Why it exists: tests and benchmarks must drive the router from a *separate* process. Load
made by threads or tasks inside pytest (or inside a benchmark driver) shares the GIL and
the event loop with the thing that judges the answers, and on a 2-core machine that skews
both the load and the verdict. The aiohttp client is too heavy for the job, so this is a
lean asyncio HTTP/1.1 keep-alive client (raw Protocols, uvloop when importable, every
request body encoded once) that counts every answer exactly and prints one JSON summary.

    python -m cluster.local.loadgen --url http://127.0.0.1:8080/v1/check --connections 128 \\
        --requests 3000 --body '{"key":"k:{i}","limits":[...]}' --keys 100 --per-key

Closed loop: each of the C connections sends its next request as soon as the previous
answer arrives, until N requests were sent (or the duration elapsed). A connection error or
a timeout is counted and the connection is reopened; the run goes on. Callers in other
processes use `run_loadgen` (asyncio, never blocks the caller's loop) or `run_loadgen_sync`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Required, TypedDict, Unpack, cast
from urllib.parse import urlsplit

import orjson

from cluster.local.procs import child_preexec

REASON_CHARS = 80
MAX_ERROR_SAMPLES = 10
_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class LoadConfig:
    url: str
    connections: int
    body: str
    requests: int | None = None
    duration_s: float | None = None
    keys: int = 1
    per_key: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    bodies: tuple[str, ...] = ()  # explicit bodies, sent round robin (instead of body/keys)


class HttpError(Exception):
    """The answer could not be read as HTTP/1.1 with a Content-Length."""


# ---------------------------------------------------------------- requests and answers


def encode_requests(config: LoadConfig) -> list[bytes]:
    """The K distinct complete HTTP/1.1 requests (`{i}` in the body = key index)."""
    parts = urlsplit(config.url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = {"Host": f"{parts.hostname}:{parts.port or 80}", "Content-Type": "application/json"}
    headers.update(config.headers)
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    bodies = config.bodies or tuple(
        config.body.replace("{i}", str(index)) for index in range(config.keys)
    )
    return [
        f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        for body in (text.encode() for text in bodies)
    ]


def _content_length(lowered: bytes) -> int:
    at = lowered.find(b"\r\ncontent-length:")
    if at < 0:
        raise HttpError("answer without Content-Length")
    stop = lowered.find(b"\r\n", at + 17)
    return int(lowered[at + 17 : stop if stop >= 0 else len(lowered)])


class _Conn(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes, float]] | None = None
        self.sent_at = 0.0
        self.buf = bytearray()
        self.need = -1
        self.body_at = 0
        self.status = 0
        self.last = False

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but quacks like one.
        self.transport = cast(asyncio.Transport, transport)

    def request(self, payload: bytes) -> asyncio.Future[tuple[int, bytes, float]]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.sent_at = time.perf_counter()
        self.transport.write(payload)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buf += data
        try:
            if self.need < 0 and not self._read_head():
                return
        except (HttpError, ValueError) as exc:
            self.fail(HttpError(f"bad answer: {exc}"))
            return
        if len(self.buf) < self.need:
            return
        body = bytes(self.buf[self.body_at : self.need])
        del self.buf[: self.need]
        self.need = -1
        if self.last and self.transport is not None:
            self.transport.close()
        self._resolve((self.status, body, time.perf_counter() - self.sent_at))

    def _read_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self.buf[:end]).lower()
        if not head.startswith(b"http/1."):
            raise HttpError(repr(head[:40]))
        self.status = int(head[9:12])
        self.body_at = end + 4
        self.need = self.body_at + _content_length(head)
        # The server will close after this answer: do not race its FIN with a new request.
        self.last = b"\r\nconnection: close" in head
        return True

    def _resolve(self, answer: tuple[int, bytes, float]) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    def fail(self, exc: BaseException) -> None:
        """Fail the request in flight and drop the connection (its state is unknown)."""
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.fail(exc or ConnectionResetError("connection closed by the server"))


# ---------------------------------------------------------------- counting


@dataclass
class Tally:
    per_key: bool
    status: Counter[int] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    by_key: Counter[str] = field(default_factory=Counter)
    latencies: array[float] = field(default_factory=lambda: array("d"))
    answered: int = 0
    allowed: int = 0
    denied: int = 0
    degraded: int = 0
    degraded_allowed: int = 0
    errors: int = 0
    samples: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.samples) < MAX_ERROR_SAMPLES:
            self.samples.append(text[:300])

    def answer(self, status: int, body: bytes, latency_s: float) -> None:
        self.answered += 1
        self.status[status] += 1
        self.latencies.append(latency_s)
        if status not in (200, 429):
            self.error(f"status {status}: {body[:200]!r}")
            return
        try:
            decision = orjson.loads(body)
            self._decision(bool(decision["allowed"]), decision)
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            self.error(f"status {status}, unreadable body ({type(exc).__name__}): {body[:200]!r}")

    def _decision(self, allowed: bool, decision: dict[str, Any]) -> None:
        degraded = bool(decision.get("degraded", False))
        if allowed:
            self.allowed += 1
        else:
            self.denied += 1
        if degraded:
            self.degraded += 1
            self.degraded_allowed += allowed
            self.reasons[str(decision.get("degraded_reason") or "")[:REASON_CHARS]] += 1
        elif allowed and self.per_key:
            self.by_key[str(decision["key"])] += 1

    def summary(self, config: LoadConfig, sent: int, elapsed_s: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": sent,
            "answered": self.answered,
            "connections": config.connections,
            "elapsed_s": round(elapsed_s, 4),
            "rate_per_s": round(self.answered / elapsed_s, 1) if elapsed_s > 0 else 0.0,
            "status": {str(code): n for code, n in sorted(self.status.items())},
            "allowed": self.allowed,
            "denied": self.denied,
            "degraded": self.degraded,
            "degraded_allowed": self.degraded_allowed,
            "degraded_reasons": dict(self.reasons.most_common()),
            "errors": self.errors,
            "error_samples": self.samples,
            "latency_ms": latency_summary(self.latencies),
        }
        if config.per_key:
            out["allowed_by_key"] = dict(sorted(self.by_key.items()))
        return out


def latency_summary(latencies: array[float]) -> dict[str, float | None]:
    ordered = sorted(latencies)

    def at(q: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {"p50": at(0.5), "p99": at(0.99), "p999": at(0.999), "max": at(1.0)}


# ---------------------------------------------------------------- the run


class LoadRun:
    """C connection slots sharing one request counter (closed loop)."""

    def __init__(self, config: LoadConfig) -> None:
        self.config = config
        self.payloads = encode_requests(config)
        parts = urlsplit(config.url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.tally = Tally(per_key=config.per_key)
        self.sent = 0
        self.deadline = float("inf")
        self.conns: list[_Conn | None] = []

    def _claim(self) -> int | None:
        """The next request number, or None when the run is over."""
        limit = self.config.requests
        if (limit is not None and self.sent >= limit) or time.monotonic() >= self.deadline:
            return None
        self.sent += 1
        return self.sent - 1

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(_Conn, self.host, self.port), self.config.timeout_s
        )
        return conn

    async def _try_connect(self, count: bool = True) -> _Conn | None:
        """A new connection, or None (counted as an error when it spends a request)."""
        try:
            return await self._connect()
        except (OSError, TimeoutError) as exc:
            if count:
                self.tally.error(f"connect: {type(exc).__name__}: {exc}")
            return None

    async def _slot(self, slot: int) -> None:
        while (number := self._claim()) is not None:
            conn = self.conns[slot]
            if conn is None or not conn.open:
                conn = self.conns[slot] = await self._try_connect()
                if conn is None:  # this request number is spent as a connect error
                    await asyncio.sleep(0.05)
                    continue
            await self._exchange(conn, self.payloads[number % len(self.payloads)])

    async def _exchange(self, conn: _Conn, payload: bytes) -> None:
        try:
            status, body, latency_s = await conn.request(payload)
        except TimeoutError:  # before OSError, its base class
            self.tally.error(f"timeout after {self.config.timeout_s:g} s")
            return
        except (OSError, HttpError) as exc:
            self.tally.error(f"{type(exc).__name__}: {exc}")
            return
        self.tally.answer(status, body, latency_s)

    async def _sweep_timeouts(self) -> None:
        """Fail requests older than the timeout (one timer for all, not one per request)."""
        while True:
            await asyncio.sleep(min(0.25, self.config.timeout_s / 4))
            now = time.perf_counter()
            for conn in self.conns:
                late = now - conn.sent_at > self.config.timeout_s if conn else False
                if conn is not None and conn.waiter is not None and late:
                    conn.fail(TimeoutError())

    def stop(self) -> None:
        """Send nothing more; the requests in flight still get their answers counted."""
        self.deadline = 0.0

    async def run(self) -> dict[str, Any]:
        # SIGTERM ends a run early but cleanly: its report still covers every answer.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.stop)
        # A connection that fails here is retried, and counted, by its slot's first request.
        first = [self._try_connect(count=False) for _ in range(self.config.connections)]
        self.conns = list(await asyncio.gather(*first))
        started = time.monotonic()
        if self.config.duration_s is not None:
            self.deadline = started + self.config.duration_s
        sweeper = asyncio.create_task(self._sweep_timeouts())
        try:
            await asyncio.gather(*(self._slot(i) for i in range(self.config.connections)))
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        elapsed = time.monotonic() - started
        for conn in self.conns:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
        return self.tally.summary(self.config, self.sent, elapsed)


# ---------------------------------------------------------------- command line


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected 'Name: value', got {text!r}")
    return name.strip(), value.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.local.loadgen",
        description="closed-loop HTTP/1.1 POST load, JSON out",
    )
    parser.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8080/v1/check")
    parser.add_argument("--connections", type=int, default=128)
    amount = parser.add_mutually_exclusive_group(required=True)
    amount.add_argument("--requests", type=int, help="send this many requests in total")
    amount.add_argument("--duration", type=float, help="send for this many seconds")
    bodies = parser.add_mutually_exclusive_group(required=True)
    bodies.add_argument("--body", help="JSON body; {i} = request number mod K")
    bodies.add_argument("--bodies-file", help="one JSON body per line, sent round robin")
    parser.add_argument("--keys", type=int, default=1, help="K distinct bodies (default 1)")
    parser.add_argument("--per-key", action="store_true", help="report allowed_by_key")
    parser.add_argument("--header", type=_header, action="append", default=[])
    parser.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    return parser


def _config(args: argparse.Namespace) -> LoadConfig:
    if args.connections < 1 or args.keys < 1 or args.timeout <= 0:
        raise SystemExit("--connections and --keys must be >= 1, --timeout > 0")
    return LoadConfig(
        url=args.url,
        connections=args.connections,
        body=args.body or "",
        bodies=_read_bodies(args.bodies_file),
        requests=args.requests,
        duration_s=args.duration,
        keys=args.keys,
        per_key=args.per_key,
        headers=dict(args.header),
        timeout_s=args.timeout,
    )


def _read_bodies(path: str | None) -> tuple[str, ...]:
    if path is None:
        return ()
    bodies = tuple(line for line in Path(path).read_text().splitlines() if line.strip())
    if not bodies:
        raise SystemExit(f"--bodies-file {path}: no bodies")
    return bodies


def _raise_fd_limit(wanted: int) -> None:
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            top = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))


def _event_loop_runner() -> Callable[[Any], Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return cast(Callable[[Any], Any], uvloop.run)


def main(argv: list[str] | None = None) -> int:
    config = _config(build_parser().parse_args(argv))
    _raise_fd_limit(config.connections + 64)
    result = _event_loop_runner()(LoadRun(config).run())
    _write_all(sys.stdout.fileno(), orjson.dumps(result) + b"\n")
    return 0


def _write_all(fd: int, data: bytes) -> None:
    """All of it, even to a pipe the event loop left non-blocking (a report of a few
    hundred KiB was cut at 128 KiB when written through sys.stdout)."""
    os.set_blocking(fd, True)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# ---------------------------------------------------------------- callers in other processes


class LoadOptions(TypedDict, total=False):
    """What a caller in another process says about one loadgen run (its command line)."""

    connections: Required[int]
    body: Required[str]
    requests: int | None
    duration_s: float | None
    keys: int
    per_key: bool
    headers: dict[str, str] | None
    timeout_s: float
    bodies_file: str | None  # one body per line, sent round robin, instead of `body`


def loadgen_args(url: str, **options: Unpack[LoadOptions]) -> list[str]:
    """The command line of one loadgen child process."""
    requests, duration_s = options.get("requests"), options.get("duration_s")
    if (requests is None) == (duration_s is None):
        raise ValueError("give exactly one of requests and duration_s")
    args = [
        sys.executable,
        "-m",
        "cluster.local.loadgen",
        "--url",
        url,
        "--connections",
        str(options["connections"]),
        "--keys",
        str(options.get("keys", 1)),
        "--timeout",
        str(options.get("timeout_s", 30.0)),
    ]
    bodies_file = options.get("bodies_file")
    args += ["--bodies-file", bodies_file] if bodies_file else ["--body", options["body"]]
    args += (
        ["--requests", str(requests)] if requests is not None else ["--duration", str(duration_s)]
    )
    args += ["--per-key"] if options.get("per_key") else []
    for name, value in (options.get("headers") or {}).items():
        args += ["--header", f"{name}: {value}"]
    return args


def _child_env() -> dict[str, str]:
    """This checkout first on sys.path, so the child runs this very loadgen."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    return env


def _parse(returncode: int | None, stdout: bytes, stderr: bytes) -> dict[str, Any]:
    if returncode != 0:
        raise RuntimeError(f"loadgen exited with {returncode}: {stderr.decode(errors='replace')}")
    try:
        result: dict[str, Any] = orjson.loads(stdout)
    except orjson.JSONDecodeError as exc:
        text = (stdout[-500:] + b"\n" + stderr).decode(errors="replace")
        raise RuntimeError(f"loadgen printed no JSON ({exc}): {text}") from exc
    return result


async def _spawn(args: list[str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_child_env(),
        preexec_fn=child_preexec,
    )


async def run_loadgen(url: str, **options: Unpack[LoadOptions]) -> dict[str, Any]:
    """Run the load generator in a child process without blocking the caller's event loop."""
    proc = await _spawn(loadgen_args(url, **options))
    try:
        stdout, stderr = await proc.communicate()
    except BaseException:  # cancelled (e.g. a test timeout): leave no child behind
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return _parse(proc.returncode, stdout, stderr)


class LoadProcess:
    """A loadgen child that runs until stopped (load for as long as a scenario lasts)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def stop(self) -> dict[str, Any]:
        """SIGTERM: it sends nothing more, waits for the answers in flight, reports."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        stdout, stderr = await self.proc.communicate()
        return _parse(self.proc.returncode, stdout, stderr)

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()


async def start_loadgen(url: str, **options: Unpack[LoadOptions]) -> LoadProcess:
    """Start a loadgen child that sends until `stop()` (at most a day)."""
    options = {**options, "requests": None, "duration_s": 86_400.0}
    return LoadProcess(await _spawn(loadgen_args(url, **options)))


def run_loadgen_sync(url: str, **options: Unpack[LoadOptions]) -> dict[str, Any]:
    """The blocking twin of `run_loadgen` (for benchmark drivers)."""
    done = subprocess.run(
        loadgen_args(url, **options),
        capture_output=True,
        env=_child_env(),
        preexec_fn=child_preexec,
        check=False,
    )
    return _parse(done.returncode, done.stdout, done.stderr)


if __name__ == "__main__":
    sys.exit(main())
