"""Rules as cluster state: one versioned document, held by the nodes, served by every
router exactly as the cluster holds it (docs/rules.md).

Every node keeps the newest rules document it was given (`sl|rules`, node/store/lua/rules.lua:
a version only ever grows there). The cluster's rules are the newest version that a
majority of the member nodes answering shows: a write is stored on every member and
counts once a majority stored it, so any majority read meets it. Writes take the
"rules" lease on a majority of the members (the same fenced lease as topology
changes, held on each), so they keep working while any majority is up, whichever nodes
are down.

A router serves the cluster's rules, never its file's: it learns of another version
from the node stats its epoch poll reads (about a second), re-reads the majority and
adopts what it holds, lower versions included (the cluster was wiped and began again:
its past, in a router's memory or a rules file's `version:`, neither blocks nor forks
publication). It copies the majority's document to a node found behind, never its own.

A router's rules file seeds a cluster that holds no rules, and an edit of it (or SIGHUP)
is published as the next version when it only adds or changes rules; one that would
delete rules is not published (`shardlimit rules apply --prune` does that), and an edit
not published is not served. Until a majority first answers, a router serves its file
as version 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson

from cluster import wire
from cluster.model.errors import FieldError, ValidationError
from router.control.cluster_view import ClusterView
from router.errors import NodeUnavailable, RulesConflict, RulesUnavailable, WouldDelete
from router.rules.book import Rule, RuleBook, parse_rules_document, rules_document

log = logging.getLogger("shardlimit.rules")

# A rules change: the cluster's current rules in, the rules to store out.
RulesChange = Callable[[dict[str, Rule]], dict[str, Rule]]
VersionHolds = Callable[[int], bool]  # the cluster's rules version -> the write may go on

LEASE_TTL_MS = 10_000
LEASE_PATIENCE_S = 5.0  # how long a write waits for another router's write to finish
LEASE_RETRY_S = 0.05  # retry cadence (with jitter) while another write holds the lease
NODE_TIMEOUT_S = 2.0
# Every node keeps the whole document and every router reads it on each new version;
# half a node's body limit (node/app.py).
MAX_RULES_BYTES = 8 * 1024 * 1024


def parse_document(doc: Any) -> dict[str, Rule]:
    """Raises ValidationError."""
    return parse_rules_document({"rules": doc})


def majority(members: int) -> int:
    return members // 2 + 1


@dataclass(frozen=True)
class ClusterRead:
    """What a majority read found: the newest version and document, and the version
    each answering node holds."""

    version: int
    doc: dict[str, Any]
    held: dict[str, int]


class ClusterRules:
    def __init__(self, view: ClusterView, book: RuleBook) -> None:
        self.view = view
        self.book = book
        self.token = secrets.token_hex(16)
        # The lease is per router (one token): it keeps writes through different routers
        # apart, this keeps apart the writes through this one.
        self._publishing = asyncio.Lock()
        # A file's rules not yet published because no majority answered.
        self.pending: dict[str, Rule] | None = None
        self.synced = False  # a majority's rules were read (or seeded) at least once
        self._writes = 0  # versions this router published: a slower read cannot undo one
        self._tasks: set[asyncio.Task[Any]] = set()
        self._busy: set[str] = set()  # nodes whose stats started a read that is running
        view.on_stats(self._saw_stats)

    async def start(self) -> None:
        """Serve the cluster's rules, or seed a cluster holding none with this router's
        file; with no majority answering, serve the file and do this once one answers."""
        read = await self._read()
        if read is None:
            log.warning("no majority of nodes answered for the rules: serving the rules file")
            return
        self.synced = True
        if read.version > 0:
            self._adopt(read.version, read.doc)
        elif self.book.path is not None:
            await self.offer(self.book.file_rules)

    async def offer(self, rules: dict[str, Rule]) -> None:
        """Publish a rules file's rules as the next version, unless they would delete
        rules the cluster holds; retried once a majority answers if none does now."""

        def replace(current: dict[str, Rule]) -> dict[str, Rule]:
            deleted = sorted(set(current) - set(rules))
            if deleted:
                raise WouldDelete(deleted)
            return rules

        try:
            await self.publish(replace, None)
        except WouldDelete as exc:
            self.book.reject(
                f"{self.book.path}: not published: it would delete {exc}; "
                "`shardlimit rules apply -f FILE --prune` deletes rules"
            )
            self.pending = None
        except ValidationError as exc:  # too large for the cluster to keep
            self.book.reject(f"{self.book.path}: not published: {exc}")
            self.pending = None
        except RulesUnavailable as exc:
            log.warning("rules file not published yet (will retry): %s", exc)
            self.pending = dict(rules)
        else:
            self.pending = None
            self.book.accepted()

    async def publish(self, change: RulesChange, holds: VersionHolds | None) -> int:
        """Apply `change` to the cluster's current rules, under the rules lease, and store
        the result as the next version on a majority: that version (the current one
        when nothing changed). `change` sees the newest rules a majority holds, never a
        local copy, so writes through different routers do not lose each other. `holds`:
        whether the writer's condition on the version read holds (If-Match). Raises
        RulesConflict, RulesUnavailable, and whatever `change` raises."""
        async with self._publishing:
            return await self._publish(change, holds)

    async def _publish(self, change: RulesChange, holds: VersionHolds | None) -> int:
        await self._acquire()
        try:
            read = await self._read()
            if read is None:
                raise RulesUnavailable("no majority of the nodes answered")
            current = read.version
            if holds is not None and not holds(current):
                raise RulesConflict(current)
            try:
                current_rules = parse_document(read.doc)
            except ValidationError as exc:
                raise RulesUnavailable(f"the cluster's rules are not valid here: {exc}") from exc
            rules = change(current_rules)
            doc = rules_document(rules)
            size = len(orjson.dumps(doc))
            if size > MAX_RULES_BYTES and size > len(orjson.dumps(read.doc)):
                message = (
                    f"the rules would take {size} bytes of JSON; a cluster keeps at most "
                    f"{MAX_RULES_BYTES} (every node holds them all)"
                )
                raise ValidationError([FieldError("rules", message)])
            if current > 0 and read.doc == doc:
                self._adopt(current, doc)
                return current
            version = current + 1
            members = self.view.member_ids()
            stored = await asyncio.gather(*(self._store(n, version, doc) for n in members))
            if sum(stored) < majority(len(members)):
                raise RulesUnavailable(
                    f"version {version} stored on {sum(stored)} of {len(members)} nodes, "
                    f"not a majority"
                )
            self._writes += 1
            self.book.set_all(rules, version)
            log.info("rules version %d published (%d rules)", version, len(rules))
            return version
        finally:
            await self._release()

    async def _lease(self, node_id: str, action: str) -> bool:
        payload = {"name": "rules", "action": action, "token": self.token, "ttl_ms": LEASE_TTL_MS}
        try:
            answer = await self.view.clients[node_id].post(
                wire.LEASE_PATH, payload, timeout_s=NODE_TIMEOUT_S
            )
        except NodeUnavailable:
            return False
        return bool(answer.get("held")) if isinstance(answer, dict) else False

    async def _acquire(self) -> None:
        """The rules lease on a majority of the members (fenced per node, expiring)."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + LEASE_PATIENCE_S
        while True:
            members = self.view.member_ids()
            held = await asyncio.gather(*(self._lease(n, "acquire") for n in members))
            if sum(held) >= majority(len(members)):
                return
            await self._release()
            if loop.time() > give_up_at:
                raise RulesUnavailable(
                    f"the rules lease is held on {sum(held)} of {len(members)} nodes, "
                    "not a majority (nodes down, or another rules change took too long)"
                )
            # Jitter: two writers that each got a minority do not meet again in step.
            await asyncio.sleep(LEASE_RETRY_S * (1 + random.random()))  # retry cadence

    async def _release(self) -> None:
        await asyncio.gather(*(self._lease(n, "release") for n in self.view.member_ids()))

    async def _read(self) -> ClusterRead | None:
        """The newest (version, document) a majority of the members shows; None when
        fewer answered."""

        async def one(node_id: str) -> tuple[str, int, dict[str, Any]] | None:
            try:
                data = await self.view.clients[node_id].get(
                    wire.RULES_PATH, timeout_s=NODE_TIMEOUT_S
                )
                return node_id, int(data["version"]), dict(data["rules"])
            except (NodeUnavailable, KeyError, TypeError, ValueError):
                return None

        members = self.view.member_ids()
        found = [r for r in await asyncio.gather(*map(one, members)) if r is not None]
        if len(found) < majority(len(members)):
            return None
        _node, version, doc = max(found, key=lambda r: r[1])
        return ClusterRead(version, doc, {node: held for node, held, _doc in found})

    async def _store(self, node_id: str, version: int, doc: dict[str, Any]) -> bool:
        try:
            answer = await self.view.clients[node_id].post(
                wire.RULES_PATH,
                {"version": version, "rules": doc},
                method="PUT",
                timeout_s=NODE_TIMEOUT_S,
            )
        except NodeUnavailable as exc:
            log.warning("rules version %d not stored on %s yet: %s", version, node_id, exc)
            return False
        return int(answer.get("version", 0)) >= version

    def _adopt(self, version: int, doc: dict[str, Any]) -> None:
        """Serve the cluster's `version`: a newer one, or an older one when the cluster
        no longer holds this router's (its nodes were wiped and it began again)."""
        if version == self.book.version and doc == rules_document(self.book.rules):
            return
        try:
            rules = parse_document(doc)
        except ValidationError as exc:
            log.error("the cluster's rules version %d are not valid here: %s", version, exc)
            return
        if version < self.book.version:
            log.warning(
                "the cluster holds rules version %d, not %d: its nodes began again; "
                "serving the cluster's",
                version,
                self.book.version,
            )
        elif self.book.version == 0 and self.book.path and rules != self.book.file_rules:
            log.warning(
                "the cluster's rules (version %d) differ from %s: serving the "
                "cluster's; `shardlimit rules apply -f FILE` publishes a file",
                version,
                self.book.path,
            )
        self.book.set_all(rules, version)
        log.info("rules version %d adopted (%d rules)", version, len(rules))

    def _saw_stats(self, node_id: str, stats: dict[str, Any]) -> None:
        version = stats.get("rules_version")
        if not isinstance(version, int) or node_id in self._busy:
            return
        if not self.synced:
            self._spawn(node_id, self.start())
        elif version != self.book.version:
            self._spawn(node_id, self._follow())
        elif self.pending is not None:
            self._spawn(node_id, self.offer(self.pending))

    def _spawn(self, node_id: str, work: Coroutine[Any, Any, None]) -> None:
        self._busy.add(node_id)
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)

        def done(finished: asyncio.Task[Any]) -> None:
            self._tasks.discard(finished)
            self._busy.discard(node_id)

        task.add_done_callback(done)

    async def _follow(self) -> None:
        """A node showed another version: serve what a majority holds, and give the
        majority's document to the nodes behind it."""
        writes = self._writes
        read = await self._read()
        if read is None:
            return
        if read.version == 0 and self.book.path is not None:
            await self.offer(self.book.file_rules)  # the cluster began again, empty: seed it
            return
        if read.version > self.book.version or (
            read.version < self.book.version and writes == self._writes
        ):
            self._adopt(read.version, read.doc)
        behind = [node for node, held in read.held.items() if held < read.version]
        if behind and read.version > 0:
            await asyncio.gather(*(self._store(n, read.version, read.doc) for n in behind))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
