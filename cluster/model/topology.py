"""The epoch'd topology: which nodes exist and how keys are partitioned over them."""

from __future__ import annotations

import contextlib
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
    epoch: int
    partitioner: Partitioner
    migration: dict[str, Any] | None = field(default=None)

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return self.partitioner.nodes

    def node(self, node_id: str) -> NodeSpec | None:
        for spec in self.partitioner.nodes:
            if spec.id == node_id:
                return spec
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "partitioner": self.partitioner.to_dict(),
            "migration": self.migration,
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
        return cls(epoch, partitioner_from_dict(part), migration)


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
