"""aiohttp's protocol for one HTTP connection, as every shardlimit server makes it.

aiohttp answers a request it cannot read (a bad request line, a header over its limits, a
malformed Content-Length) before any handler or middleware runs, as text/plain. Here
those answers are problem+json like every other error, through `handle_error`, the
method aiohttp gives for it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from cluster.web.problem import problem

# aiohttp's keep-alive timeout before 3.12 (now 3630 s): an idle connection is closed
# after it, as the router's front closes its own.
KEEPALIVE_S = 75.0
# What every server's runner gives aiohttp's protocol: no access log.
PROTOCOL_OPTIONS: dict[str, Any] = {"access_log": None, "keepalive_timeout": KEEPALIVE_S}


class ProblemRequestHandler(web.RequestHandler):
    """aiohttp's protocol whose answers to requests it cannot read are problem+json."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's own logs the error and refuses once an answer has begun.
        super().handle_error(request, status, exc, message)
        if status >= 500:
            answer = problem(status, "internal", "internal error; the request may be retried")
        else:
            answer = problem(status, "malformed-request", message or "the request cannot be read")
        answer.force_close()
        return answer


def aiohttp_connection(server: web.Server) -> web.RequestHandler:
    """aiohttp's protocol for one new connection of `server`."""
    return ProblemRequestHandler(server, loop=asyncio.get_running_loop(), **PROTOCOL_OPTIONS)
