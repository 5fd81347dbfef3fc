"""The control messages of the router↔node protocol (part of `cluster.wire`, which
re-exports every name here): the JSON bodies of the node's control-plane endpoints
(topology, migration, rules, the change lease, decisions, holds), decoded once at the
node's boundary (node/edge/internal.py `internal`): a body that does not fit its Struct is a 400
naming the field. This module imports nothing of this project."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

__all__ = [
    "MAX_EXPORT_KEYS",
    "ClockOffset",
    "Control",
    "Decision",
    "DecisionsHandover",
    "Entries",
    "ExportKeys",
    "Holds",
    "ImportKeys",
    "Lease",
    "MigrateStep",
    "MigrationCleanup",
    "RulesDocument",
]

MAX_EXPORT_KEYS: Final = 10_000
_Id = Annotated[str, msgspec.Meta(min_length=1)]
_BatchId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.:@~+=/-]{1,128}$")]


class Control(msgspec.Struct, kw_only=True):
    """Base of the control messages: JSON objects, unknown fields ignored."""


class ExportKeys(Control):
    """A node importing moving keys asks their old owner for them, with its topology
    (the owner takes it first when it is newer). LANDED_PATH takes `keys` alone."""

    keys: Annotated[list[str], msgspec.Meta(max_length=MAX_EXPORT_KEYS)]
    topology: dict[str, Any] | None = None


class Entries(Control):
    entries: Any  # checked by the receiving module, which knows their shape


class ImportKeys(Entries):  # entries: node/migration/migrator.py decode_entries
    migration: _Id


# The share of a source Redis' time a copy takes by default (the router's reshard_busy_pct).
COPY_BUSY_PCT = 80
# How long one copy step runs at most before it answers where it got: under a keys/s rate
# a step of reshard_step_keys names could otherwise outlast the router's wait for it, and
# the router's progress and status are only as fresh as the last step's answer.
COPY_STEP_MAX_S = 5.0


class MigrateStep(Control):
    """One background-copy step on a source node (router/control/resharding.py drives them)."""

    migration: _Id
    cursor: int = 0
    count: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1000
    rate: Annotated[int, msgspec.Meta(ge=0)] = 0  # keys/s (0: no fixed rate)
    busy_pct: Annotated[int, msgspec.Meta(ge=1, le=100)] = 100


class MigrationCleanup(Control):
    migration: Annotated[str, msgspec.Meta(pattern="^[A-Za-z0-9]+$")]


class RulesDocument(Control):
    """The cluster's rules as a node stores them (validated by the router)."""

    version: Annotated[int, msgspec.Meta(ge=1)]
    rules: dict[str, Any]


class Lease(Control):
    action: Literal["acquire", "renew", "release"]
    token: _Id
    ttl_ms: Annotated[int, msgspec.Meta(ge=100, le=600_000)] = 10_000
    name: str = "topology"


class Decision(Control):
    """Record an all-or-nothing batch's decision (`decision`, with the batch's `holds`),
    or report holds `settled`."""

    batch: _BatchId
    decision: Literal["commit", "abort"] | None = None
    holds: list[_Id] = msgspec.field(default_factory=list)
    settled: list[_Id] | None = None


class DecisionsHandover(Control):
    heir: _Id
    url: Annotated[str, msgspec.Meta(pattern="^https?://")]


class Holds(Control):
    holds: Any  # checked by node/holds/keeper.py, which knows their shape


class ClockOffset(Control):
    offset_ms: int
