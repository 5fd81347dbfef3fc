"""One closed-loop run of the load generator: C connections sharing one request counter,
each sending its next request as soon as the previous answer arrives."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import Any
from urllib.parse import urlsplit

from cluster.local.load_http import HttpError, LoadConfig, LoadConnection, encode_requests
from cluster.local.load_tally import Tally


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
        self.conns: list[LoadConnection | None] = []

    def _claim(self) -> int | None:
        """The next request number, or None when the run is over."""
        limit = self.config.requests
        if (limit is not None and self.sent >= limit) or time.monotonic() >= self.deadline:
            return None
        self.sent += 1
        return self.sent - 1

    async def _connect(self) -> LoadConnection:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(LoadConnection, self.host, self.port), self.config.timeout_s
        )
        return conn

    async def _try_connect(self, count: bool = True) -> LoadConnection | None:
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

    async def _exchange(self, conn: LoadConnection, payload: bytes) -> None:
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
