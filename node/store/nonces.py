"""Lease nonces: NONCE_BITS random bits each (cluster/model/lease_ids.py), from the OS'
CSPRNG as secrets.randbits takes them, but read many at a time: one system call per
NONCES_PER_READ leases rather than one per lease."""

from __future__ import annotations

import os

from cluster.model.lease_ids import NONCE_BITS

__all__ = ["Nonces"]

_BYTES = NONCE_BITS // 8
NONCES_PER_READ = 256


class Nonces:
    __slots__ = ("_at", "_pool")

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def draw(self) -> int:
        """A fresh random nonce."""
        at = self._at
        if at >= len(self._pool):
            self._pool = os.urandom(_BYTES * NONCES_PER_READ)
            at = 0
        self._at = at + _BYTES
        return int.from_bytes(self._pool[at : at + _BYTES])
