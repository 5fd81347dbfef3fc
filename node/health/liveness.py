"""Liveness answered from a thread of its own.

A router must tell a hung node (stopped, SIGSTOP) from a busy one: a busy event
loop can take longer to reach a probe than a hung process takes to be noticed.
This responder runs in its own thread on its own port, so it answers within
milliseconds however long the event loop's queue is (the thread needs only a GIL
switch), while a stopped process answers nothing at all. The event loop beats a
heartbeat; a loop that has not beaten for LOOP_STALL_S (wedged, not merely busy)
is reported down too (503).

The port is ephemeral and announced in every batch answer (`live`), so routers
need no configuration for it.

It speaks what the node's main listener speaks: with a server ssl context (the
node's own, cluster/web/tls.py) every probe is a TLS connection, so a router that
talks https to a node probes it the same way, and with mutual TLS only a client
with the cluster's certificate gets an answer. The handshake runs in this thread,
and OpenSSL releases the GIL while it works, so a busy event loop does not delay it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import time

from cluster.web.serve import CannotListenError

__all__ = ["LivenessResponder"]

log = logging.getLogger("shardlimit.node")
LOOP_STALL_S = 5.0
BEAT_S = 1.0  # well inside LOOP_STALL_S: each beat wakes the event loop
_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
_STALLED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 7\r\nConnection: close\r\n\r\nstalled"
)


class LivenessResponder:
    def __init__(self, host: str, ssl_context: ssl.SSLContext | None = None, port: int = 0) -> None:
        try:
            self._socket = socket.create_server((host, port))
        except OSError as exc:
            raise CannotListenError(f"cannot listen on {host}:{port} (liveness): {exc}") from exc
        self._ssl = ssl_context
        self.port: int = self._socket.getsockname()[1]
        self._heartbeat = time.monotonic()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="liveness", daemon=True)
        self._beater: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the thread, and the event loop's heartbeat (call from the loop)."""
        self._thread.start()
        self._beater = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            self._heartbeat = time.monotonic()
            await asyncio.sleep(BEAT_S)  # heartbeat cadence

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    conn.settimeout(1.0)  # bounds the TLS handshake too
                    if self._ssl is None:
                        self._answer(conn)
                    else:
                        with self._ssl.wrap_socket(conn, server_side=True) as tls:
                            self._answer(tls)
                except OSError as exc:  # ssl.SSLError included: a refused handshake
                    log.debug("liveness probe connection failed: %s", exc)

    def _answer(self, conn: socket.socket) -> None:
        conn.recv(4096)  # the probe's request; its content does not matter
        alive = time.monotonic() - self._heartbeat < LOOP_STALL_S
        conn.sendall(_OK if alive else _STALLED)

    async def close(self) -> None:
        self._closed = True
        if self._beater is not None:
            self._beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beater
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
