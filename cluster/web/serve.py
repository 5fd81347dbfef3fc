"""Run one router or one node in this process (uvloop when available)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import ssl
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from cluster.web.connections import PROTOCOL_OPTIONS, aiohttp_connection

log = logging.getLogger("shardlimit")

# How long a stopping server lets the answers in flight be written: aiohttp's default,
# given to the runner and to a front alike.
SHUTDOWN_TIMEOUT_S = 60.0


class CannotListenError(RuntimeError):
    """The listener could not be bound (the port is taken, the address is not ours)."""


class Front(Protocol):
    """A protocol factory serving some requests itself and handing connections to
    aiohttp's server for the rest (the router's, router/front/server.py)."""

    def __call__(self) -> asyncio.BaseProtocol: ...

    async def shutdown(self, grace_s: float) -> None:
        """Stop taking requests, let the answers in flight be written, close."""


# Given aiohttp's web.Server (cluster.web.connections makes aiohttp's protocol of it).
FrontFactory = Callable[[web.Server], Front]


class AiohttpFront:
    """The Front of a server that has no lean one: every connection is aiohttp's."""

    def __init__(self, server: web.Server) -> None:
        self.server = server

    def __call__(self) -> asyncio.BaseProtocol:
        return aiohttp_connection(self.server)

    async def shutdown(self, grace_s: float) -> None:
        """Nothing of its own: the runner's cleanup closes aiohttp's connections."""


class FrontSite(web.TCPSite):
    """A TCP site whose connections start with a Front (aiohttp's protocol as made in
    cluster.web.connections, or the router's lean front)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        front: Front,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        backlog: int,
        shutdown_timeout: float,
    ) -> None:
        super().__init__(
            runner, host, port, ssl_context=ssl_context, backlog=backlog, reuse_address=True
        )
        self.front = front
        self.shutdown_timeout = shutdown_timeout  # as the runner's (aiohttp keeps it private)

    async def start(self) -> None:
        await web.BaseSite.start(self)
        self._server = await asyncio.get_running_loop().create_server(
            self.front,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await super().stop()  # the listener first, as aiohttp's own sites
        await self.front.shutdown(self.shutdown_timeout)


async def start_site(
    runner: web.BaseRunner,
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    front: FrontFactory | None = None,
    backlog: int = 1024,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT_S,
) -> web.TCPSite:
    """Listen on host:port for the set-up `runner`, through `front` when given, else
    straight to aiohttp; `shutdown_timeout` is the one `runner` was made with."""
    assert runner.server is not None
    site = FrontSite(
        runner,
        (front or AiohttpFront)(runner.server),
        host,
        port,
        ssl_context=ssl_context,
        backlog=backlog,
        shutdown_timeout=shutdown_timeout,
    )
    await site.start()
    return site


async def _serve(
    app: web.Application,
    host: str,
    port: int,
    on_hup: Callable[[], None] | None,
    ssl_context: ssl.SSLContext | None,
    front: FrontFactory | None,
) -> None:
    runner = web.AppRunner(
        app, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S, **PROTOCOL_OPTIONS
    )
    await runner.setup()
    try:  # cleaned up also when the port cannot be bound
        try:
            await start_site(
                runner,
                host,
                port,
                ssl_context=ssl_context,
                front=front,
                shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            )
        except OSError as exc:
            raise CannotListenError(f"cannot listen on {host}:{port}: {exc}") from exc
        scheme = "http" if ssl_context is None else "https"
        log.info("listening on %s://%s:%d", scheme, host, port)
        # Everything built at start-up lives for the whole process: keep it out of the
        # cyclic GC's full collections, whose pauses otherwise land in the latency tail.
        gc.collect()
        gc.freeze()
        # A request's objects die young and hold no cycles. At the default 700, young
        # collections ran every few checks and traversed the requests still in flight
        # (about 6% of the router's samples under batch load); at 50,000 most of them
        # are gone before one runs, at the cost of up to 50,000 objects waiting.
        gc.set_threshold(50_000, 50, 100)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if on_hup is not None:
            loop.add_signal_handler(signal.SIGHUP, on_hup)
        await stop.wait()
    finally:
        await runner.cleanup()


def run_app(
    app: web.Application,
    host: str,
    port: int,
    on_hup: Callable[[], None] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    front: FrontFactory | None = None,
) -> None:
    """Serve `app` until SIGINT/SIGTERM; HTTPS when given a server `ssl_context`; through
    `front` when given (see Front). CannotListenError when it cannot bind its listener."""
    install_fast_loop()
    asyncio.run(_serve(app, host, port, on_hup, ssl_context, front))


def install_fast_loop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
