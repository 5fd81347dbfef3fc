"""Rules as cluster state: one versioned document, held by every node, served by every
router.

Every node keeps the newest rules document it was given (`sl|rules`, node/lua/rules.lua:
a version only ever grows). A write goes through any router: it takes the "rules"
lease on the lock node (the same fencing as topology changes), reads the newest
version the nodes hold, refuses with RulesConflict when the writer's If-Match names
another version, and stores version + 1 on every node. Routers learn of a new version
from the node stats their epoch poll reads (one node every EPOCH_POLL_S, so within
about a second) and fetch the document; a node found behind (it missed a write, or it
is new) is given the newest one.

A router's rules file stays the declarative source: when the cluster holds no rules
yet, the first router to start publishes its file as version 1; later edits of the file
(or SIGHUP) are published as new versions. A router that cannot reach the cluster
serves its file and publishes it once it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Coroutine
from typing import Any

from cluster import wire
from cluster.model.errors import ValidationError
from router.cluster_view import ClusterView
from router.dispatch import NodeUnavailable
from router.rules import Rule, RuleBook, parse_rules_document, rules_document

log = logging.getLogger("shardlimit.rules")

# A rules change: the cluster's current rules in, the rules to store out.
Change = Callable[[dict[str, Rule]], dict[str, Rule]]

LEASE_TTL_MS = 10_000
LEASE_PATIENCE_S = 5.0  # how long a write waits for another router's write to finish
LEASE_RETRY_S = 0.05  # retry cadence while another write holds the lease


class RulesConflict(Exception):
    """The cluster's rules are at another version than the writer expected."""

    def __init__(self, current: int) -> None:
        super().__init__(f"the cluster's rules are at version {current}")
        self.current = current


class UnknownRule(LookupError):
    """A change named a rule the cluster does not hold."""


class RulesUnavailable(Exception):
    """The rules could not be read or stored (the lock node or every node is down)."""


def parse_document(doc: Any) -> dict[str, Rule]:
    """Raises ValidationError."""
    return parse_rules_document({"rules": doc})


class ClusterRules:
    def __init__(self, view: ClusterView, book: RuleBook) -> None:
        self.view = view
        self.book = book
        self.token = secrets.token_hex(16)
        # A file's rules not yet published (no node answered), with its `version:`.
        self.pending: tuple[dict[str, Rule], int | None] | None = None
        self.synced = False  # the cluster's rules were read (or seeded) at least once
        self._tasks: set[asyncio.Task[Any]] = set()
        self._busy: set[str] = set()  # nodes being fetched from or repaired
        view.on_stats(self._saw_stats)

    async def start(self) -> None:
        """Serve the cluster's rules, or seed an empty cluster with this router's file;
        with no node answering, serve the file and do this once one answers."""
        newest = await self._newest()
        if newest is None:
            log.warning("no node answered for the rules: serving the rules file for now")
            return
        self.synced = True
        version, doc = newest
        if version > 0:
            self._adopt(version, doc)
        elif self.book.path is not None:
            await self.offer(self.book.rules, None)

    async def offer(self, rules: dict[str, Rule], based_on: int | None) -> None:
        """Publish a rules file's rules: unconditionally, or (`based_on`, the `version:`
        a router wrote into the file) only while the cluster is still at that version,
        so a file rewritten by one router cannot undo a later write through another."""
        try:
            await self.publish(lambda _current: rules, based_on)
        except RulesConflict as exc:
            log.warning("rules file not published: it was written from version %s, and %s",
                        based_on, exc)  # fmt: skip
            self.pending = None
        except RulesUnavailable as exc:
            log.warning("rules file not published yet (will retry): %s", exc)
            self.pending = (dict(rules), based_on)
        else:
            self.pending = None

    async def publish(self, change: Change, expected: int | None) -> int:
        """Apply `change` to the cluster's current rules, under the rules lease, and store
        the result as the next version: that version (the current one when nothing
        changed). `change` sees the newest rules any node holds, never a stale local
        copy, so writes through different routers do not lose each other. Raises
        RulesConflict, RulesUnavailable, and whatever `change` raises."""
        await self._acquire()
        try:
            newest = await self._newest()
            if newest is None:
                raise RulesUnavailable("no node answered")
            current, current_doc = newest
            if expected is not None and expected != current:
                raise RulesConflict(current)
            try:
                current_rules = parse_document(current_doc)
            except ValidationError as exc:
                raise RulesUnavailable(f"the cluster's rules are not valid here: {exc}") from exc
            rules = change(current_rules)
            doc = rules_document(rules)
            if current > 0 and current_doc == doc:
                self._adopt(current, doc)
                return current
            version = current + 1
            stored = await asyncio.gather(
                *(self._store(node_id, version, doc) for node_id in self.view.member_ids())
            )
            if not any(stored):
                raise RulesUnavailable("no node stored the new rules")
            self.book.set_all(rules, version)
            log.info("rules version %d published (%d rules)", version, len(rules))
            return version
        finally:
            with contextlib.suppress(NodeUnavailable):
                await self.view.lease("rules", "release", self.token, LEASE_TTL_MS)

    async def _acquire(self) -> None:
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + LEASE_PATIENCE_S
        while True:
            try:
                if await self.view.lease("rules", "acquire", self.token, LEASE_TTL_MS):
                    return
            except NodeUnavailable as exc:
                raise RulesUnavailable(f"the rules lease's node is unavailable: {exc}") from exc
            if loop.time() > give_up_at:
                raise RulesUnavailable("another rules change held the lease for too long")
            await asyncio.sleep(LEASE_RETRY_S)  # retry cadence while another write finishes

    async def _newest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest (version, document) the member nodes hold; None if none answered."""

        async def one(node_id: str) -> tuple[int, dict[str, Any]] | None:
            try:
                data = await self.view.channels[node_id].get(wire.RULES_PATH, timeout_s=2.0)
                return int(data["version"]), dict(data["rules"])
            except (NodeUnavailable, KeyError, TypeError, ValueError):
                return None

        found = [r for r in await asyncio.gather(*map(one, self.view.member_ids())) if r]
        return max(found, key=lambda r: r[0]) if found else None

    async def _store(self, node_id: str, version: int, doc: dict[str, Any]) -> bool:
        try:
            answer = await self.view.channels[node_id].post(
                wire.RULES_PATH, {"version": version, "rules": doc}, method="PUT", timeout_s=2.0
            )
        except NodeUnavailable as exc:
            log.warning("rules version %d not stored on %s yet: %s", version, node_id, exc)
            return False
        return int(answer.get("version", 0)) >= version

    def _adopt(self, version: int, doc: dict[str, Any]) -> None:
        if version <= self.book.version:
            return
        try:
            rules = parse_document(doc)
        except ValidationError as exc:
            log.error("the cluster's rules version %d are not valid here: %s", version, exc)
            return
        if self.book.path is not None and self.book.version == 0 and rules != self.book.rules:
            log.warning(
                "the cluster's rules (version %d) differ from %s: serving the cluster's; "
                "`shardlimit rules apply -f FILE` publishes a file",
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
        elif version > self.book.version:
            self._spawn(node_id, self._fetch_from(node_id))
        elif version < self.book.version:
            self._spawn(node_id, self._repair(node_id))
        elif self.pending is not None:
            self._spawn(node_id, self.offer(*self.pending))

    def _spawn(self, node_id: str, work: Coroutine[Any, Any, None]) -> None:
        self._busy.add(node_id)
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)

        def done(finished: asyncio.Task[Any]) -> None:
            self._tasks.discard(finished)
            self._busy.discard(node_id)

        task.add_done_callback(done)

    async def _fetch_from(self, node_id: str) -> None:
        try:
            data = await self.view.channels[node_id].get(wire.RULES_PATH, timeout_s=2.0)
            self._adopt(int(data["version"]), dict(data["rules"]))
        except (NodeUnavailable, KeyError, TypeError, ValueError) as exc:
            log.warning("could not fetch the rules from %s: %s", node_id, exc)

    async def _repair(self, node_id: str) -> None:
        """A node behind (it missed a write, or it is new) gets the newest rules."""
        await self._store(node_id, self.book.version, rules_document(self.book.rules))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
