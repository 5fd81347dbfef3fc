"""Which keys this node serves under its topology, during and outside a migration."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from cluster.model.nodes import NodeSpec
from cluster.model.partition import Partitioner, partitioner_from_dict
from cluster.model.topology import Topology

_ROLES_MAX = 100_000  # keys whose role is kept (about 10 MB at most)


class Role(Enum):
    OWN = "own"  # serve it
    IMPORT = "import"  # serve it once its Redis keys are imported from the old owner
    MOVED = "moved"  # another node serves it


# Shared by every key of their role: the cache holds no tuple of its own for them.
_OWN: tuple[Role, str | None] = (Role.OWN, None)
_MOVED: tuple[Role, str | None] = (Role.MOVED, None)


@dataclass(frozen=True)
class Ownership:
    node_id: str
    topology: Topology
    previous: Partitioner | None  # the partitioner being migrated away from
    migration_id: str | None
    # The migration this one undoes (an abort): the keys it copied are handed back, and
    # a new owner's own copy of a moving key may be stale (see node/migration/migrator.py).
    reverts: str | None = None
    # role() per key, worked out once per topology (this object is rebuilt for every
    # new one): the partitioners hash each key (MD5 on a ring), keys repeat.
    _roles: dict[str, tuple[Role, str | None]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def build(cls, node_id: str, topology: Topology) -> Ownership:
        migration = topology.migration or {}
        previous = migration.get("from")
        return cls(
            node_id,
            topology,
            partitioner_from_dict(previous) if isinstance(previous, dict) else None,
            str(migration["id"]) if "id" in migration else None,
            str(migration["reverts"]) if migration.get("reverts") else None,
        )

    @property
    def epoch(self) -> int:
        return self.topology.epoch

    def role(self, key: str) -> tuple[Role, str | None]:
        """(role, node to import from)."""
        known = self._roles.get(key)
        if known is None:
            known = self._role(key)
            if len(self._roles) >= _ROLES_MAX:
                self._roles.clear()
            self._roles[key] = known
        return known

    def _role(self, key: str) -> tuple[Role, str | None]:
        if self.topology.partitioner.owner(key) != self.node_id:
            return _MOVED
        if self.previous is not None:
            source = self.previous.owner(key)
            if source != self.node_id:
                return Role.IMPORT, source
        return _OWN

    def moving_away(self, key: str) -> str | None:
        """The new owner if this node held `key` before the migration and no longer does."""
        if self.previous is None or self.previous.owner(key) != self.node_id:
            return None
        target = self.topology.partitioner.owner(key)
        return None if target == self.node_id else target

    def node_spec(self, node_id: str) -> NodeSpec | None:
        """A node of the current topology, or of the previous one (a node being removed)."""
        spec = self.topology.node(node_id)
        if spec is None and self.previous is not None:
            spec = next((n for n in self.previous.nodes if n.id == node_id), None)
        return spec
