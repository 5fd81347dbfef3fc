"""The epoch'd topology: which nodes exist and how keys are partitioned over them."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.model.nodes import NodeSpec
from cluster.model.partition import Partitioner, partitioner_from_dict


@dataclass(frozen=True)
class Topology:
    """`cluster_id` names the cluster for its whole life (a node refuses a topology of
    another cluster); `successors` maps a node that left to the node now holding the
    all-or-nothing decision records it coordinated; `last_migration` is the summary of the
    last migration that finished, so that every router tells it, also after a restart."""

    epoch: int
    partitioner: Partitioner
    migration: dict[str, Any] | None = field(default=None)
    cluster_id: str | None = None
    successors: Mapping[str, str] = field(default_factory=dict)
    last_migration: dict[str, Any] | None = None

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return self.partitioner.nodes

    def node(self, node_id: str) -> NodeSpec | None:
        for spec in self.partitioner.nodes:
            if spec.id == node_id:
                return spec
        return None

    def coordinator(self, node_id: str) -> str | None:
        """Where the decision records of coordinator `node_id` live now (None: unknown)."""
        if self.node(node_id) is not None:
            return node_id
        return self.successors.get(node_id)

    @functools.cached_property
    def layout_id(self) -> int:
        """A fingerprint of the partitioner (1 to 2**63 - 1): two topologies with the same
        layout_id place every key on the same node, whatever their epochs."""
        canonical = json.dumps(self.partitioner.to_dict(), sort_keys=True, separators=(",", ":"))
        digest = hashlib.blake2b(canonical.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 1 or 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "partitioner": self.partitioner.to_dict(),
            "migration": self.migration,
            "cluster_id": self.cluster_id,
            "successors": dict(self.successors),
            "last_migration": self.last_migration,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Topology:
        epoch = data.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError("topology epoch must be a non-negative integer")
        part = data.get("partitioner")
        if not isinstance(part, Mapping):
            raise ValueError("topology partitioner must be an object")
        migration = data.get("migration")
        if migration is not None and not isinstance(migration, dict):
            raise ValueError("topology migration must be an object or null")
        cluster_id = data.get("cluster_id")
        if cluster_id is not None and not (isinstance(cluster_id, str) and cluster_id):
            raise ValueError("topology cluster_id must be a non-empty string or null")
        successors = data.get("successors") or {}
        if not isinstance(successors, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in successors.items()
        ):
            raise ValueError("topology successors must map node ids to node ids")
        last_migration = data.get("last_migration")
        if last_migration is not None and not isinstance(last_migration, dict):
            raise ValueError("topology last_migration must be an object or null")
        return cls(
            epoch, partitioner_from_dict(part), migration, cluster_id, successors, last_migration
        )


def save_atomic(path: Path, topology: Topology) -> None:
    """Write via a temp file + fsync + rename, so a crash leaves old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".topology.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(topology.to_dict(), handle, indent=2, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def load(path: Path) -> Topology | None:
    if not path.exists():
        return None
    return Topology.from_dict(json.loads(path.read_text()))
