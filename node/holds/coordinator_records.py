"""A coordinator leaving the cluster hands its all-or-nothing decision records over.

The orchestrator asks the leaving node (DECISIONS_HANDOVER_PATH) to give its records
(`sl|d|<batch>`, `sl|dp|<batch>`) to a successor before the topology without it is
published; that topology names the successor (`Topology.successors`), so sweepers
and routers ask it from then on. The hand-over first sets a fence in the leaving
node's Redis: decide.lua and settled.lua refuse from then on (checked inside the
scripts, so no decision can slip in between the fence and the copy), and a late
"abort" can never be recorded where no one will look for it, nor contradict a commit
the successor holds. Repeating a hand-over is harmless: the successor restores only
records it does not have.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from redis.exceptions import ResponseError

from cluster import wire
from cluster.model.keys import DECISION_FENCE_KEY, DECISION_PREFIX, PENDING_PREFIX
from node.errors import PeerError
from node.migration.peer_client import PeerClient
from node.store.counter_store import CounterStore
from node.topology.current import CurrentTopology

__all__ = ["CoordinatorRecords", "parse_entries"]

log = logging.getLogger("shardlimit.node")
CHUNK = 500


class CoordinatorRecords:
    """This node's decision records as a coordinator, and where other coordinators' are."""

    def __init__(self, current: CurrentTopology, store: CounterStore, peers: PeerClient) -> None:
        self.current = current
        self.store = store
        self.peers = peers

    async def hand_over(self, heir: str, heir_url: str) -> int:
        """Fence this node's decisions, then copy every record to `heir` (at `heir_url`,
        else its other endpoints); how many."""
        ownership = self.current.ownership
        spec = ownership.node_spec(heir) if ownership is not None else None
        others = spec.urls if spec is not None else ()
        heir_endpoints = (heir_url, *(url for url in others if url != heir_url))
        client = self.store.client
        await client.set(DECISION_FENCE_KEY, heir)
        handed = 0
        for pattern in (DECISION_PREFIX + "*", PENDING_PREFIX + "*"):
            names: list[str] = []
            async for raw in client.scan_iter(match=pattern, count=1000):
                names.append(raw.decode() if isinstance(raw, bytes) else str(raw))
            for start in range(0, len(names), CHUNK):
                entries = await self._dump(names[start : start + CHUNK])
                if entries:
                    await self.peers.post(
                        heir_endpoints,
                        wire.DECISIONS_ADOPT_PATH,
                        {"entries": entries},
                        timeout_s=30.0,
                    )
                handed += len(entries)
        return handed

    async def _dump(self, names: list[str]) -> list[list[Any]]:
        pipe = self.store.client.pipeline(transaction=False)
        for name in names:
            pipe.dump(name)
            pipe.pttl(name)
        replies = await pipe.execute()
        entries = []
        for i, name in enumerate(names):
            dump, pttl = replies[2 * i], replies[2 * i + 1]
            if dump is not None and pttl != -2:
                entries.append([name, base64.b64encode(dump).decode(), max(int(pttl), 0)])
        return entries

    async def adopt(self, entries: list[tuple[str, bytes, int]]) -> int:
        """Restore records this node does not hold yet; how many were restored."""
        restored = 0
        for name, dump, ttl in entries:
            try:
                await self.store.client.restore(name, ttl, dump)
            except ResponseError as exc:
                if "BUSYKEY" not in str(exc):
                    raise
                continue  # held already: this one is at least as recent
            restored += 1
        return restored

    def where_decided(self, coordinator: str) -> str | None:
        """The node that holds the records of `coordinator` now: itself while it is in the
        topology (or leaving it), else its successor; None when no one does."""
        ownership = self.current.ownership
        if ownership is None:
            return None
        found = ownership.topology.coordinator(coordinator)
        if found is not None:
            return found
        return coordinator if ownership.node_spec(coordinator) is not None else None

    async def resolve(self, batch: str, coordinator: str) -> str | None:
        """A held batch's fate, asking its coordinator to record "abort" if undecided."""
        where = self.where_decided(coordinator)
        if where == self.current.node_id:
            decided = await self.store.decide(batch, "abort")
            return None if decided == "fenced" else decided  # ask the successor, later
        ownership = self.current.ownership
        spec = ownership.node_spec(where) if ownership and where else None
        if spec is None:
            log.warning(
                "batch %s: coordinator %s is not in the topology; aborting", batch, coordinator
            )
            return "abort"
        try:
            body = await self.peers.post(
                spec.urls, wire.DECISION_PATH, {"batch": batch, "decision": "abort"}, timeout_s=1.0
            )
        except PeerError:
            return None
        decision = body.get("decision") if isinstance(body, dict) else None
        return decision if decision in ("commit", "abort") else None


def parse_entries(raw: Any) -> list[tuple[str, bytes, int]] | str:
    """[[name, base64 dump, ttl ms (0: none)], ...] of decision records, or why not."""
    if not isinstance(raw, list):
        return "entries must be a list"
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3):
            return "each entry is [name, dump, ttl_ms]"
        name, dump, ttl = item
        if not isinstance(name, str) or not name.startswith((DECISION_PREFIX, PENDING_PREFIX)):
            return "only decision records can be adopted"
        if not isinstance(dump, str) or type(ttl) is not int or ttl < 0:
            return "each entry is [name, dump, ttl_ms]"
        try:
            out.append((name, base64.b64decode(dump, validate=True), ttl))
        except ValueError:
            return "dump must be base64"
    return out
