"""A lease's public id: its fencing value and the random nonce the node drew for it
("17.3f9a0c2b11de"). The node keeps the lease as the member "<fencing>:<nonce>" of its
concurrency limit's set (node/store/lua/concurrency.lua); only the id names it, and the
nonce (48 random bits) is what makes an id impossible to guess from a fencing value."""

from __future__ import annotations

import re

__all__ = ["LEASE_ID_PATTERN", "NONCE_BITS", "lease_id", "parse_lease_id"]

NONCE_BITS = 48  # exact in a Lua double, as the fencing value is (< 2**53)
# At most 15 digits of fencing (below 10**15, exact in a Lua double): the OpenAPI
# document states this very pattern (LEASE_ID_PATTERN).
LEASE_ID_PATTERN = r"^[1-9][0-9]{0,14}\.[0-9a-f]{12}$"
_ID = re.compile(r"([1-9][0-9]{0,14})\.([0-9a-f]{12})")


def lease_id(fencing: int, nonce: int) -> str:
    return f"{fencing}.{nonce:012x}"


def parse_lease_id(text: object) -> tuple[int, int] | None:
    """(fencing, nonce) of a well-formed id, else None."""
    if not isinstance(text, str):
        return None
    match = _ID.fullmatch(text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2), 16)
