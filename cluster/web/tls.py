"""Every ssl context of the router and the node, built in one place.

A server context holds the listener's certificate and key and, with mutual TLS,
the CA that client certificates must chain to (one is then required). A client
context verifies the peer against the cluster's CA (the system's trusted CAs
without one), checks the host name against the certificate (IP addresses too), and
with mutual TLS presents this process's own certificate.

`TlsFiles.problems` names every bad combination or unreadable file by the setting
that holds it (`router.tls_key`, `--tls-key`); a file that is readable but not a
usable PEM certificate or key becomes TlsError when a context is built. Both are
for the command line to print as one line.
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cluster.web.cert_dates import not_after

__all__ = ["TlsError", "TlsFiles", "client_context", "default_client_context", "server_context"]

MIN_VERSION = ssl.TLSVersion.TLSv1_2


class TlsError(ValueError):
    """A certificate, key or CA file could not be loaded."""


def _load_chain(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    try:
        context.load_cert_chain(certfile=cert, keyfile=key)
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(f"cannot load certificate {cert} with key {key}: {_why(exc)}") from exc
    # OpenSSL loads an expired certificate; every peer would then refuse the handshake,
    # and say so only in its own log.
    expires = not_after(cert)
    if expires is not None and expires <= datetime.now(UTC):
        raise TlsError(f"certificate {cert} expired on {expires:%Y-%m-%d %H:%M:%S} UTC")


def _load_ca(context: ssl.SSLContext, ca: Path) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(f"cannot load CA certificates from {ca}: {_why(exc)}") from exc


def _why(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def server_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """A listener's context; with `client_ca`, clients must present a certificate
    chained to it. Raises TlsError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MIN_VERSION
    _load_chain(context, cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        _load_ca(context, client_ca)
    return context


def client_context(
    ca: Path | None = None, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    """A context for calls to peers: their certificate must chain to `ca` (the system's
    trusted CAs if None) and name the host called; `cert`/`key`: the certificate this
    side presents (mutual TLS). Raises TlsError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, checks host names
    context.minimum_version = MIN_VERSION
    if ca is None:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        _load_ca(context, ca)
    if cert is not None and key is not None:
        _load_chain(context, cert, key)
    return context


@functools.cache
def default_client_context() -> ssl.SSLContext:
    """The system's trusted CAs, no client certificate: for https peers when no TLS
    setting is given. Built once, on first use (loading the system CAs takes ~50 ms)."""
    return client_context()


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The TLS settings of one router or node.

    `cert`/`key`: the listener's certificate, also presented to peers when `mutual`.
    `ca`: what peers' certificates must chain to. `mutual`: certificates both ways
    (a node requires one from its clients and presents its own to peer nodes; a
    router presents its own to nodes).
    """

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    mutual: bool = False

    def problems(self, name: Callable[[str], str]) -> list[tuple[str, str]]:
        """(setting, message) for each bad combination or unreadable file; `name` maps
        "cert", "key", "ca", "mutual" to the setting's name as the user wrote it."""
        found: list[tuple[str, str]] = []
        if self.cert is not None and self.key is None:
            found.append((name("key"), f"is required with {name('cert')}"))
        if self.key is not None and self.cert is None:
            found.append((name("cert"), f"is required with {name('key')}"))
        if self.mutual and self.ca is None:
            found.append((name("ca"), f"is required with {name('mutual')}"))
        if self.mutual and self.cert is None and self.key is None:
            found.append((name("cert"), f"is required (with {name('key')}) with {name('mutual')}"))
        for field, path in (("cert", self.cert), ("key", self.key), ("ca", self.ca)):
            if path is not None and not (path.is_file() and os.access(path, os.R_OK)):
                found.append((name(field), f"cannot read {path}"))
        return found

    def server_context(self, *, client_certs: bool) -> ssl.SSLContext | None:
        """The listener's context (None: plain HTTP). `client_certs`: clients must
        present a certificate chained to `ca` (a node with mutual TLS; a router's
        clients never need one). Raises TlsError."""
        if self.cert is None or self.key is None:
            return None
        return server_context(self.cert, self.key, self.ca if client_certs else None)

    def client_context(self) -> ssl.SSLContext | None:
        """The context for calls to peers; None when neither a CA nor mutual TLS is set
        (then https peers are verified against the system's trusted CAs). Raises
        TlsError."""
        if self.ca is None and not self.mutual:
            return None
        if self.mutual:
            return client_context(self.ca, self.cert, self.key)
        return client_context(self.ca)
