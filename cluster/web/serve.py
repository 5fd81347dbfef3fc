"""Run one router or one node in this process (uvloop when available)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import ssl
from collections.abc import Callable

from aiohttp import web

log = logging.getLogger("shardlimit")


class CannotListenError(RuntimeError):
    """The listener could not be bound (the port is taken, the address is not ours)."""


def install_fast_loop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _serve(
    app: web.Application,
    host: str,
    port: int,
    on_hup: Callable[[], None] | None,
    ssl_context: ssl.SSLContext | None,
) -> None:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:  # cleaned up also when the port cannot be bound
        site = web.TCPSite(
            runner, host, port, backlog=1024, reuse_address=True, ssl_context=ssl_context
        )
        try:
            await site.start()
        except OSError as exc:
            raise CannotListenError(f"cannot listen on {host}:{port}: {exc}") from exc
        scheme = "http" if ssl_context is None else "https"
        log.info("listening on %s://%s:%d", scheme, host, port)
        # Everything built at start-up lives for the whole process: keep it out of the
        # cyclic GC's full collections, whose pauses otherwise land in the latency tail.
        gc.collect()
        gc.freeze()
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
) -> None:
    """Serve `app` until SIGINT/SIGTERM; HTTPS when given a server `ssl_context`.
    CannotListenError when it cannot bind its listener."""
    install_fast_loop()
    asyncio.run(_serve(app, host, port, on_hup, ssl_context))
