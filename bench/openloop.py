"""Open-loop latency: a fixed offered rate, each latency taken from the *scheduled* send time.

A low-overhead generator: raw asyncio Protocols (uvloop when run as a program) over a pool
of keep-alive HTTP/1.1 connections, every request encoded before the run. Each scheduled
request takes an idle connection; when none is idle a new one is opened (its connect
time counts), up to `max_connections`, after which requests queue (and that wait counts
too). A slow answer therefore never delays later sends: coordinated omission is not
hidden. Sends are paced by a kernel timer (`bench.ticker`, timerfd) rather than the
event loop's millisecond timers. Measured with the same code against the trivial aiohttp
handler, the result is this generator's own floor (`send_lag`: how late sends went out).

    python -m bench.openloop --url http://127.0.0.1:8080 --rate 1000 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import time
from array import array
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

from bench import ticker

CHECK_LIMITS = b'[{"algorithm":"fixed_window","limit":1000000000,"window":"1h"}]'


@dataclass(frozen=True)
class OpenLoopConfig:
    url: str
    rate: float = 1000.0
    seconds: float = 10.0
    warmup: float = 1.0
    keys: int = 100_000
    path: str = "/v1/check"
    initial_connections: int = 8
    max_connections: int = 512
    drain_timeout: float = 5.0
    distinct_requests: int = 20_000
    seed: int = 1


def encode_requests(config: OpenLoopConfig) -> list[bytes]:
    """Complete HTTP/1.1 POST requests of single checks on random keys, ready to write."""
    parts = urlsplit(config.url)
    host = f"{parts.hostname}:{parts.port or 80}".encode()
    rng = random.Random(config.seed)
    out = []
    for _ in range(config.distinct_requests):
        body = b'{"key":"user:%d","limits":%s}' % (rng.randrange(config.keys), CHECK_LIMITS)
        head = (
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n"
        ) % (config.path.encode(), host, len(body))
        out.append(head + body)
    return out


def percentile_ms(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)


class _Conn(asyncio.Protocol):
    """One keep-alive connection, at most one request in flight."""

    def __init__(self, owner: OpenLoop) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.need = -1
        self.header_end = 0
        self.status = 0
        self.busy = False
        self.record = False
        self.scheduled = 0.0
        self.sent = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but quacks like one.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, payload: bytes, scheduled: float, record: bool) -> None:
        assert self.transport is not None
        self.busy, self.record, self.scheduled = True, record, scheduled
        self.sent = time.monotonic()
        self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.need < 0:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            at = head.find(b"\r\ncontent-length:")
            if at < 0 or not self.busy:  # chunked answers are not expected from aiohttp here
                self.owner.failed(self, "response without content-length")
                return
            stop = head.find(b"\r\n", at + 17)
            length = int(head[at + 17 : stop if stop >= 0 else len(head)])
            self.status = int(head[9:12])
            self.header_end = end + 4
            self.need = self.header_end + length
        if len(self.buf) < self.need:
            return
        body = bytes(self.buf[self.header_end : self.need])
        del self.buf[: self.need]
        self.need = -1
        self.busy = False
        self.owner.answered(self, self.status, body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.owner.lost(self)


class OpenLoop:
    """One run at a fixed rate; `run()` returns the latency summary."""

    def __init__(self, config: OpenLoopConfig, stop: asyncio.Event | None = None) -> None:
        self.config = config
        self.stop = stop
        parts = urlsplit(config.url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.requests = encode_requests(config)
        self.idle: list[_Conn] = []
        self.open = 0
        self.queued: deque[tuple[bytes, float, bool]] = deque()
        self.in_flight: dict[_Conn, None] = {}
        self.latency = array("d")  # from the scheduled send time
        self.service = array("d")  # from the actual write: what the server side took
        self.lag = array("d")  # actual write - scheduled: the generator's own slack
        self.status: Counter[int] = Counter()
        self.degraded = 0
        self.errors: Counter[str] = Counter()
        self.sent = 0
        self.max_open = 0
        self.unanswered_waits: list[float] = []  # how long each unanswered check had waited
        self._tasks: set[asyncio.Task[None]] = set()
        self._finishing = False
        self._drained = asyncio.Event()

    # ------------------------------------------------------------------ connections

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: _Conn(self), self.host, self.port)
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        return conn

    async def _connect_and_send(self, payload: bytes, scheduled: float, record: bool) -> None:
        try:
            conn = await self._connect()
        except OSError as exc:
            self.errors[f"connect: {exc.__class__.__name__}"] += 1
            return
        self._send(conn, payload, scheduled, record)

    def _send(self, conn: _Conn, payload: bytes, scheduled: float, record: bool) -> None:
        self.in_flight[conn] = None
        conn.send(payload, scheduled, record)
        if record:
            self.lag.append(conn.sent - scheduled)

    def dispatch(self, payload: bytes, scheduled: float, record: bool) -> None:
        self.sent += record
        while self.idle:
            conn = self.idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                self._send(conn, payload, scheduled, record)
                return
        if self.open + len(self._tasks) < self.config.max_connections:
            self._spawn_connection(payload, scheduled, record)
        else:
            self.queued.append((payload, scheduled, record))

    def _spawn_connection(self, payload: bytes, scheduled: float, record: bool) -> None:
        task = asyncio.get_running_loop().create_task(
            self._connect_and_send(payload, scheduled, record)
        )
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    # ------------------------------------------------------------------ callbacks

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._maybe_drained()

    def _maybe_drained(self) -> None:
        if self._finishing and not (self.in_flight or self.queued or self._tasks):
            self._drained.set()

    def answered(self, conn: _Conn, status: int, body: bytes) -> None:
        now = time.monotonic()
        self.in_flight.pop(conn, None)
        if conn.record:
            self.latency.append(now - conn.scheduled)
            self.service.append(now - conn.sent)
            self.status[status] += 1
            self.degraded += b'"degraded":true' in body
        if self.queued:
            self._send(conn, *self.queued.popleft())
        else:
            self.idle.append(conn)
            self._maybe_drained()

    def failed(self, conn: _Conn, reason: str) -> None:
        self.errors[reason] += 1
        self.in_flight.pop(conn, None)
        if conn.transport is not None:
            conn.transport.abort()

    def lost(self, conn: _Conn) -> None:
        self.open -= 1
        if conn in self.in_flight:
            del self.in_flight[conn]
            if conn.record:
                self.errors["connection lost"] += 1
        if self.queued and self.open + len(self._tasks) < self.config.max_connections:
            self._spawn_connection(*self.queued.popleft())
        self._maybe_drained()

    # ------------------------------------------------------------------ run

    async def run(self) -> dict[str, Any]:
        config = self.config
        for _ in range(config.initial_connections):
            self.idle.append(await self._connect())
        warm = int(config.warmup * config.rate)
        total = warm + int(config.seconds * config.rate)
        requests = self.requests

        def send(i: int, due: float) -> None:
            self.dispatch(requests[i % len(requests)], due, i >= warm)

        start, ended = await ticker.send_on_schedule(config.rate, total, send, self._stopped)
        self._finishing = True
        self._maybe_drained()
        with contextlib.suppress(TimeoutError):  # the last answers, waited for a bounded time
            await asyncio.wait_for(self._drained.wait(), config.drain_timeout)
        now = time.monotonic()
        late = [now - c.scheduled for c in self.in_flight if c.record]
        late += [now - scheduled for _, scheduled, record in self.queued if record]
        self.unanswered_waits = late
        for conn in list(self.in_flight) + self.idle:
            if conn.transport is not None:
                conn.transport.close()
        result = self.summary(late, max(0.0, ended - start - config.warmup))
        result["timer"] = "timerfd" if ticker.available() else "sleep"
        return result

    def _stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def summary(self, unanswered: list[float], seconds: float) -> dict[str, Any]:
        # Unanswered requests count with the time they had waited: never hidden.
        ordered = sorted([*self.latency, *unanswered])
        service = sorted(self.service)
        lag = sorted(self.lag)
        return {
            "offered_per_s": self.config.rate,
            "seconds": round(seconds, 2),
            "sent": self.sent,
            "answered": len(self.latency),
            "checks": len(self.latency),
            "achieved_per_s": round(len(self.latency) / seconds, 1) if seconds else None,
            "p50_ms": percentile_ms(ordered, 0.5),
            "p99_ms": percentile_ms(ordered, 0.99),
            "p999_ms": percentile_ms(ordered, 0.999),
            "max_ms": percentile_ms(ordered, 1.0),
            "service_p50_ms": percentile_ms(service, 0.5),
            "service_p99_ms": percentile_ms(service, 0.99),
            "send_lag_p50_ms": percentile_ms(lag, 0.5),
            "send_lag_p99_ms": percentile_ms(lag, 0.99),
            "status": {str(code): count for code, count in sorted(self.status.items())},
            "degraded": self.degraded,
            "errors": dict(self.errors),
            "unanswered": len(unanswered),
            "connections": self.max_open,
        }


async def open_loop(config: OpenLoopConfig, stop: asyncio.Event | None = None) -> dict[str, Any]:
    """Run one open-loop measurement in the running event loop."""
    return await OpenLoop(config, stop).run()


def main() -> None:
    from cluster.web.serve import install_fast_loop

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--path", default="/v1/check")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args()
    config = OpenLoopConfig(
        url=args.url,
        rate=args.rate,
        seconds=args.seconds,
        warmup=args.warmup,
        keys=args.keys,
        path=args.path,
    )
    install_fast_loop()
    gc.collect()
    gc.disable()  # no collector pauses inside the measurement
    print(json.dumps(asyncio.run(open_loop(config)), indent=2))


if __name__ == "__main__":
    main()
