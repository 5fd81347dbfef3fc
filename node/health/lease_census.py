"""Leases held per rule on this node, sampled for /metrics: SCAN walks the node's keys
a bounded slice per scrape (SCANS_PER_SCRAPE calls of SCAN_COUNT), counting the
unexpired leases of every concurrency limit it meets (ZCOUNT of the members whose
expiry is after now; the fencing member's score is negative). A rule's figure is that
of the last complete pass, so it lags by as many scrapes as a pass takes: one for up to
10,000 keys. Which keys hold leases comes from the cluster's rules document the node
holds: a rule with a concurrency limit keeps its leases in `c<shape id>|<key>`
(cluster/model/keys.py), shape "cc"."""

from __future__ import annotations

from typing import Any

import orjson
import redis.asyncio as aioredis

from cluster.model.keys import RULES_KEY, shape_id

__all__ = ["LeaseCensus"]

SCAN_COUNT = 1000
SCANS_PER_SCRAPE = 10
_SHAPE = "cc"  # LimitSpec.shape of every concurrency limit


def _prefixes(doc: Any) -> dict[bytes, str]:
    """Key prefix -> rule, for every rule of a rules document with a concurrency limit."""
    rules = orjson.loads(doc) if doc else {}
    found: dict[bytes, str] = {}
    for name, body in rules.items() if isinstance(rules, dict) else ():
        limits = body.get("limits") if isinstance(body, dict) else None
        if isinstance(limits, list) and any(
            isinstance(limit, dict) and limit.get("algorithm") == "concurrency" for limit in limits
        ):
            found[f"c{shape_id(name, _SHAPE)}|".encode()] = name
    return found


class LeaseCensus:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.held: dict[str, int] = {}  # rule -> leases, as the last complete pass found
        self._counting: dict[str, int] = {}
        self._cursor = 0
        self._doc: Any = None
        self._prefixes: dict[bytes, str] = {}

    async def advance(self) -> None:
        """Walk the next slice of the keyspace; publish `held` when a pass completes."""
        doc = await self.client.hget(RULES_KEY, "doc")
        if doc != self._doc:
            self._doc, self._prefixes = doc, _prefixes(doc)
            self._counting, self._cursor = {}, 0
        if not self._prefixes:
            self.held = {}
            return
        width = len(next(iter(self._prefixes)))
        seconds, micros = await self.client.time()
        after = f"({seconds * 1000 + micros // 1000}"
        for _ in range(SCANS_PER_SCRAPE):
            self._cursor, keys = await self.client.scan(self._cursor, count=SCAN_COUNT)
            found = []
            for key in keys:
                raw = key if isinstance(key, bytes) else str(key).encode()
                rule = self._prefixes.get(raw[:width])
                if rule is not None:
                    found.append((raw, rule))
            if found:
                async with self.client.pipeline(transaction=False) as pipe:
                    for raw, _ in found:
                        pipe.zcount(raw, after, "+inf")
                    counts = await pipe.execute()
                for (_, rule), count in zip(found, counts, strict=True):
                    self._counting[rule] = self._counting.get(rule, 0) + int(count)
            if self._cursor == 0:
                self.held = {rule: self._counting.get(rule, 0) for rule in self._prefixes.values()}
                self._counting = {}
                return
