"""Opening a TCP connection by host name: the router's to its nodes (its HTTP client,
router/channel/control_client.py, and its channel, link.py), a node's to its Redis
(node/store/resp.py).

The host is looked up with `loop.getaddrinfo` before connecting to each address it
gives, rather than by `loop.create_connection`: cancelled during its lookup (the caller's
timeout, with a name whose DNS answers slowly), uvloop's create_connection leaves the
lookup's future to fail later with nobody to read it, and asyncio logs "Future exception
was never retrieved" as an error at each attempt. A cancelled `getaddrinfo` leaves
nothing behind.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from typing import TypeVar

_P = TypeVar("_P", bound=asyncio.BaseProtocol)


async def connect(
    factory: Callable[[], _P], host: str, port: int, tls: ssl.SSLContext | None = None
) -> _P:
    """A connected protocol from `factory`, over TLS (SNI and verification on `host`)
    when `tls` is given. Tries each address of `host` in turn. Raises OSError (a name
    IDNA refuses included) or ssl.SSLError."""
    loop = asyncio.get_running_loop()
    try:
        addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except UnicodeError as exc:  # IDNA refuses the name (an empty or 64-letter label)
        raise OSError(f"host name {host!r} cannot be looked up: {exc}") from exc
    failures: list[OSError] = []
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            failures.append(exc)
            continue
        except BaseException:
            sock.close()
            raise
        # The TLS handshake is part of the connect, so the caller's timeout bounds it.
        _, protocol = await loop.create_connection(
            factory, sock=sock, ssl=tls, server_hostname=host if tls is not None else None
        )
        return protocol
    if len(failures) == 1:
        raise failures[0]
    raise OSError(f"cannot connect to {host}:{port}: " + "; ".join(map(str, failures)))
