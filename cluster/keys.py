"""How limit keys map to Redis key names on a node.

Counter:  sl|c|<scope>|<shape>|<limit key>
Record:   sl|r|<scope>|<request id>|<limit key>

The limit key always comes last and the other parts never contain "|", so the
limit key (and therefore the owner) of any Redis key can be recovered; this is
what lets a node hand over exactly the keys that change owner.
"""

from __future__ import annotations

import re

PREFIX = "sl|"
INLINE_SCOPE = "~inline"
MAX_KEY_BYTES = 512
RULE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
REQUEST_ID = re.compile(r"^[A-Za-z0-9_.:@~+=/-]{1,128}$")


def counter_key(scope: str, shape: str, key: str) -> str:
    return f"sl|c|{scope}|{shape}|{key}"


def record_key(scope: str, request_id: str, key: str) -> str:
    return f"sl|r|{scope}|{request_id}|{key}"


def limit_key_of(redis_key: str) -> str | None:
    """The limit key a Redis key belongs to, or None for keys that are not ours."""
    if not redis_key.startswith(PREFIX):
        return None
    parts = redis_key.split("|", 4)
    if len(parts) != 5 or parts[1] not in ("c", "r"):
        return None
    return parts[4]
