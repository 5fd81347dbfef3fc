"""Where a key lands: the part of it that is hashed (its Redis hash tag), its CRC16 slot
and its position on the ring."""

from __future__ import annotations

import binascii
import hashlib

HASH_SLOTS: int = 16384
RING_SIZE: int = 1 << 64
"""Size of the ring's hash space: points and key positions are in ``[0, RING_SIZE)``."""

SLOT_MASK = HASH_SLOTS - 1


def routing_part(key: str) -> str:
    """Return the part of `key` that is hashed: its non-empty `{tag}`, else the whole key."""
    start = key.find("{")
    if start == -1:
        return key
    end = key.find("}", start + 1)
    if end == -1 or end == start + 1:
        return key
    return key[start + 1 : end]


def key_slot(key: str) -> int:
    """Return the Redis Cluster hash slot of `key` (same answer as ``CLUSTER KEYSLOT``)."""
    return binascii.crc_hqx(routing_part(key).encode("utf-8"), 0) & SLOT_MASK


def ring_hash(value: str) -> int:
    """Return the 64-bit ring position of `value` (first 8 bytes of its MD5, big-endian)."""
    # uhashring's default hash is the full 128-bit MD5; 64 bits keep ring points within
    # what orjson (and any JSON consumer using int64/uint64) can carry, e.g. in /v1/locate.
    digest = hashlib.md5(value.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big")
