"""The keys a migration hands over: DUMP, absolute expiry and whether the sender's copy is
the current one, as read from a Redis and as sent between nodes (base64 in JSON)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from cluster.model.keys import limit_key_of

__all__ = ["ExportEntry", "decode_entries", "encode_entries", "entries_of"]

# (redis key, dump or None, absolute expiry ms or -1, authoritative): authoritative is
# False only when a migration is aborted and the sender never held the key (the
# receiver's own copy is then the current one).
ExportEntry = tuple[str, bytes | None, int, bool]


def entries_of(keys: Sequence[str], replies: Sequence[Any], reverted: bool) -> list[ExportEntry]:
    """The entries of `keys` from a pipeline's replies: TIME, then per key DUMP, PTTL and,
    when `reverted` (an abort hands keys back), EXISTS of the reverted migration's marker:
    a key is then authoritative only if it is held or was imported in that migration."""
    seconds, micros = replies[0]
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    width = 3 if reverted else 2
    out: list[ExportEntry] = []
    for i, key in enumerate(keys):
        dump, pttl = replies[1 + width * i], replies[2 + width * i]
        imported = reverted and bool(replies[3 + width * i])
        if dump is None or pttl == -2:
            out.append((key, None, -1, not reverted or imported))
        else:
            out.append((key, dump, -1 if pttl < 0 else now_ms + pttl, True))
    return out


def encode_entries(entries: Sequence[ExportEntry]) -> list[list[Any]]:
    return [
        [key, base64.b64encode(dump).decode() if dump is not None else None, expiry, authoritative]
        for key, dump, expiry, authoritative in entries
    ]


def decode_entries(raw: Any) -> list[ExportEntry]:
    if not isinstance(raw, list):
        raise ValueError("entries must be a list")
    out: list[ExportEntry] = []
    for item in raw:
        if not (isinstance(item, list) and len(item) in (3, 4) and isinstance(item[0], str)):
            raise ValueError("each entry is [key, dump or null, expiry, authoritative?]")
        key, dump, expiry = item[:3]
        authoritative = item[3] if len(item) == 4 else True
        if not isinstance(expiry, int) or isinstance(expiry, bool):
            raise ValueError("expiry must be an integer")
        if not isinstance(authoritative, bool):
            raise ValueError("authoritative must be a boolean")
        if limit_key_of(key) is None:
            raise ValueError(f"not a shardlimit key: {key[:80]!r}")
        decoded = base64.b64decode(dump) if isinstance(dump, str) else None
        out.append((key, decoded, expiry, authoritative))
    return out
