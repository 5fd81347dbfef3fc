"""Bearer tokens, compared in constant time."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

ADMIN_TOKEN_ENV = "SHARDLIMIT_ADMIN_TOKEN"  # noqa: S105 - a variable name
CLUSTER_TOKEN_ENV = "SHARDLIMIT_CLUSTER_TOKEN"  # noqa: S105


def bearer_matches(header: str | None, expected: str | None) -> bool:
    """True if the Authorization header carries `expected`. No token configured: open."""
    return bearer_check(header, expected) == "ok"


def bearer_check(header: str | None, expected: str | None) -> str:
    """ "ok" if the Authorization header carries `expected` (or none is configured),
    "missing" if it carries no bearer token, "wrong" if another one (compared in
    constant time)."""
    if expected is None:
        return "ok"
    # The scheme is case-insensitive (RFC 9110, 11.1): "bearer" is Bearer.
    given = header[7:].strip() if header and header[:7].lower() == "bearer " else ""
    if not given:
        return "missing"
    # A header's bytes that are not UTF-8 reach here as surrogates: kept, never equal.
    given_bytes = given.encode("utf-8", "surrogateescape")
    return "ok" if hmac.compare_digest(given_bytes, expected.encode()) else "wrong"


def token_from(env_name: str, file: str | None = None) -> str | None:
    """A secret from a file (first line) or an environment variable; never logged."""
    if file:
        return Path(file).read_text().strip() or None
    value = os.environ.get(env_name, "").strip()
    return value or None
