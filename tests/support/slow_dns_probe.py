"""Run in a mount namespace whose /etc/resolv.conf names `--dns`, a DNS server this
process starts and that never answers: one connect to a name, given up at a timeout, by
uvloop's create_connection and by the router's connect (cluster/web/connect.py).
Prints one JSON object: each one's exception and what asyncio logged after it."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import socket
from collections.abc import Awaitable, Callable

import uvloop

from cluster.web.connect import connect


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def _attempt(opening: Callable[[], Awaitable[object]], errors: _Errors) -> dict[str, object]:
    errors.messages.clear()
    outcome = "connected"
    try:
        async with asyncio.timeout(0.3):
            await opening()
    except (OSError, TimeoutError) as exc:
        outcome = type(exc).__name__
    # The lookup is given up by the resolver (timeout:1 in resolv.conf) after the connect
    # was: what it leaves behind is logged when its future is collected.
    await asyncio.sleep(1.5)
    gc.collect()
    await asyncio.sleep(0)
    return {"outcome": outcome, "logged": list(errors.messages)}


async def main(name: str) -> None:
    errors = _Errors()
    logging.getLogger("asyncio").addHandler(errors)
    loop = asyncio.get_running_loop()
    report = {
        "create_connection": await _attempt(
            lambda: loop.create_connection(asyncio.Protocol, f"a.{name}", 80), errors
        ),
        "connect": await _attempt(lambda: connect(asyncio.Protocol, f"b.{name}", 80), errors),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dns", required=True, help="the address the silent DNS binds")
    parser.add_argument("--name", default="slow-dns.internal")
    args = parser.parse_args()
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind((args.dns, 53))  # questions arrive and are never answered
    uvloop.run(main(args.name))
    silent.close()
