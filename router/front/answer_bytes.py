"""The bytes of the front's answers (router/front/server.py), as aiohttp writes them: status
line, the answer's own headers, Content-Type, Content-Length, Date, Server, then
Connection where HTTP/1.0 keep-alive or HTTP/1.1 close needs it."""

from __future__ import annotations

import sys
import time
from email.utils import formatdate
from http import HTTPStatus

from aiohttp import __version__ as aiohttp_version

JSON = b"\r\nContent-Type: application/json\r\nContent-Length: "
PROBLEM_JSON = b"\r\nContent-Type: application/problem+json\r\nContent-Length: "
# The Server header of the router's aiohttp answers (its other endpoints), so that every
# answer of the router names the same software.
_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
_SERVER = f"\r\nServer: Python/{_PYTHON} aiohttp/{aiohttp_version}\r\n".encode()
_END = {
    # (HTTP/1.0, keep-alive): the Connection line, and the blank line ending the head
    (False, True): b"\r\n",
    (False, False): b"Connection: close\r\n\r\n",
    (True, True): b"Connection: keep-alive\r\n\r\n",
    (True, False): b"\r\n",
}
_status_lines: dict[tuple[bool, int], bytes] = {}
_date: tuple[int, bytes] = (0, b"")


def _status_line(http10: bool, status: int) -> bytes:
    line = _status_lines.get((http10, status))
    if line is None:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        version = "1.0" if http10 else "1.1"
        line = f"HTTP/{version} {status} {reason}".encode()
        _status_lines[(http10, status)] = line
    return line


def _date_value() -> bytes:
    global _date
    now = int(time.time())
    if now != _date[0]:  # formatted once a second
        _date = (now, formatdate(now, usegmt=True).encode())
    return _date[1]


def answer_bytes(
    http10: bool,
    keep_alive: bool,
    status: int,
    content_type: bytes,
    body: bytes,
    headers: dict[str, str] | None,
) -> bytes:
    """A whole answer, head and body, ready for one write. `content_type` is JSON or
    PROBLEM_JSON."""
    own = "".join([f"\r\n{name}: {value}" for name, value in headers.items()]) if headers else ""
    return b"".join(
        (
            _status_line(http10, status),
            own.encode(),
            content_type,
            str(len(body)).encode(),
            b"\r\nDate: ",
            _date_value(),
            _SERVER,
            _END[(http10, keep_alive)],
            body,
        )
    )
