"""aiohttp's protocol for one HTTP connection, as every shardlimit server makes it.

aiohttp answers a request it cannot read (a bad request line, a header over its limits, a
malformed Content-Length) before any handler or middleware runs, as text/plain. Here
those answers are problem+json like every other error, through `handle_error`, the
method aiohttp gives for it. And a client that half-closes after its request gets the
answer, where aiohttp would close at once.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError

from cluster.web.problem import problem, version_not_supported

# aiohttp's keep-alive timeout before 3.12 (now 3630 s): an idle connection is closed
# after it, as the router's front closes its own.
KEEPALIVE_S = 75.0
# How long a half-closed connection has to finish the request in flight (a router
# answers by its node deadline and margin): after it, the connection is closed.
HALF_CLOSED_GRACE_S = 5.0
# llhttp refuses a request line of a well-formed version it does not know (HTTP/1.2,
# HTTP/3.0) as malformed: that is a version not served (RFC 9110, 15.6.6), not a 400.
_UNKNOWN_VERSION = re.compile(r"Invalid HTTP version:.*? HTTP/([0-9]\.[0-9])'", re.S)
# What every server's runner gives aiohttp's protocol: no access log.
PROTOCOL_OPTIONS: dict[str, Any] = {"access_log": None, "keepalive_timeout": KEEPALIVE_S}


class ProblemRequestHandler(web.RequestHandler):
    """aiohttp's protocol whose answers to requests it cannot read are problem+json, and
    that answers the request in flight when the client half-closes."""

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio.Protocol: True keeps it open
        # The client sent all it will. aiohttp's own would close the connection now, and a
        # check it had counted would never be answered: this one takes no more requests,
        # answers the one in flight, and closes, within HALF_CLOSED_GRACE_S at most.
        # TLS has no such state in asyncio: its transport closes on a close_notify
        # whatever this answers, and the request in flight is one whose client left.
        if self.transport is not None and self.transport.get_extra_info("ssl_object"):
            return False
        self.close()
        asyncio.get_running_loop().call_later(HALF_CLOSED_GRACE_S, self.force_close)
        return True

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
        elif isinstance(exc, ContentEncodingError):  # one aiohttp cannot decode: br, zstd
            answer = problem(
                415,
                "unsupported-content-encoding",
                "Content-Encoding not served: send the body as is, or in gzip or deflate",
                headers={"Accept-Encoding": "gzip, deflate"},
            )
        elif (version := _UNKNOWN_VERSION.search(message or "")) is not None:
            answer = version_not_supported(version.group(1)).response()
        else:
            answer = problem(status, "malformed-request", message or "the request cannot be read")
        answer.force_close()
        return answer


def aiohttp_connection(server: web.Server) -> web.RequestHandler:
    """aiohttp's protocol for one new connection of `server`."""
    return ProblemRequestHandler(server, loop=asyncio.get_running_loop(), **PROTOCOL_OPTIONS)
