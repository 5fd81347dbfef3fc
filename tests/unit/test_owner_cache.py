"""ClusterView remembers key owners only under the partitioner they were looked up in."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cluster.model.nodes import NodeSpec
from cluster.model.partition import new_partitioner
from router.config import RouterConfig
from router.control import cluster_view as cluster_view
from router.control.cluster_view import ClusterView


def _nodes(*ids: str) -> list[NodeSpec]:
    return [NodeSpec(id=i, url=f"http://127.0.0.1:{9000 + n}") for n, i in enumerate(ids)]


def test_owners_follow_the_partitioner_and_stay_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_view, "OWNER_CACHE_MAX", 50)
    view = ClusterView(RouterConfig(data_dir=tmp_path, nodes=_nodes("a", "b")), None)
    keys = [f"user:{i}" for i in range(200)]
    first = view.topology.partitioner
    assert [view.owner(k) for k in keys] == [first.owner(k) for k in keys]
    assert len(view._owners) <= 50
    grown = new_partitioner("ring", _nodes("a", "b", "c"))
    view.topology = dataclasses.replace(view.topology, partitioner=grown, epoch=2)
    assert [view.owner(k) for k in keys] == [grown.owner(k) for k in keys]
    assert any(first.owner(k) != grown.owner(k) for k in keys)
    assert len(view._owners) <= 50
