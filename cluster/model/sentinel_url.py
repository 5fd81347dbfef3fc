"""`redis+sentinel://` URLs: a shard's Redis primary, found through Redis Sentinel.

    redis+sentinel://[[user]:password@]host:port[,host:port...]/master-name[/db]

The hosts are Sentinels; the master name is the one they monitor; user and password are
the Redis servers' (AUTH), not the Sentinels'. Parsing is pure: the node builds its
clients from the result (node/store/connect.py), the CLI refuses a bad URL with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

__all__ = ["SCHEME", "SentinelUrl", "is_sentinel_url", "parse_sentinel_url", "sentinel_url"]

SCHEME = "redis+sentinel://"
_MASTER = re.compile(r"[A-Za-z0-9._-]{1,100}")


@dataclass(frozen=True, slots=True)
class SentinelUrl:
    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SCHEME)


def _address(part: str) -> tuple[str, int]:
    host, sep, port = part.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a Sentinel is host:port, not {part!r}")
    return host.strip("[]"), int(port)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The URL's parts; ValueError naming what is wrong."""
    if not is_sentinel_url(url):
        raise ValueError(f"not a {SCHEME} URL")
    rest = url[len(SCHEME) :]
    userinfo, at, rest = rest.rpartition("@")
    hosts, _, path = rest.partition("/")
    if not hosts:
        raise ValueError("no Sentinel addresses (host:port[,host:port...])")
    sentinels = tuple(_address(part) for part in hosts.split(","))
    name, _, db_part = path.partition("/")
    if not _MASTER.fullmatch(name):
        raise ValueError("the path must name the master the Sentinels monitor: /master-name")
    if db_part and not db_part.isdigit():
        raise ValueError(f"the database must be a number, not {db_part!r}")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    return SentinelUrl(sentinels, name, int(db_part or 0), username, password)


def sentinel_url(sentinels: Sequence[tuple[str, int]], master: str, db: int = 0) -> str:
    hosts = ",".join(f"{host}:{port}" for host, port in sentinels)
    return f"{SCHEME}{hosts}/{master}" + (f"/{db}" if db else "")
