"""Bearer tokens, compared in constant time."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

ADMIN_TOKEN_ENV = "SHARDLIMIT_ADMIN_TOKEN"  # noqa: S105 - a variable name
CLUSTER_TOKEN_ENV = "SHARDLIMIT_CLUSTER_TOKEN"  # noqa: S105


def bearer_matches(header: str | None, expected: str | None) -> bool:
    """True if the Authorization header carries `expected`. No token configured: open."""
    if expected is None:
        return True
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[7:].strip().encode(), expected.encode())


def token_from(env_name: str, file: str | None = None) -> str | None:
    """A secret from a file (first line) or an environment variable; never logged."""
    if file:
        return Path(file).read_text().strip() or None
    value = os.environ.get(env_name, "").strip()
    return value or None
