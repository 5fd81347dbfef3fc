"""The cluster.yaml a local cluster writes for each of its routers: the user's --config
with the ports, data dir, rules and Envoy files of this cluster, and its nodes."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import yaml

from cluster.local.up_options import UpOptions
from cluster.model.nodes import NodeSpec


def write_router_config(
    options: UpOptions,
    data_dir: Path,
    index: int,
    *,
    name: str,
    partitioner: str,
    members: list[NodeSpec],
) -> Path:
    """The config of router `index` (called `name`), written under `data_dir`."""
    base: dict[str, Any] = {}
    config_dir = Path.cwd()
    if options.config is not None:
        base = yaml.safe_load(options.config.read_text()) or {}
        config_dir = options.config.resolve().parent
    router = dict(base.get("router") or {})
    router.update(options.router_settings)
    rules_file = router.get("rules_file")
    if rules_file:
        router["rules_file"] = str((config_dir / rules_file).resolve())
    else:
        router["rules_file"] = str(data_dir / "rules.yaml")
    router.update(host=options.host, port=options.port + index, data_dir=str(data_dir / name))
    _envoy_settings(options, data_dir, router, index, config_dir)
    cluster = dict(base.get("cluster") or {})
    cluster["partitioner"] = partitioner
    cluster["id"] = cluster_id(data_dir)
    cluster["nodes"] = [spec.to_dict() for spec in members]
    path = data_dir / ("cluster.yaml" if index == 0 else f"cluster-{index + 1}.yaml")
    path.write_text(yaml.safe_dump({"router": router, "cluster": cluster}, sort_keys=False))
    return path


def _envoy_settings(
    options: UpOptions, data_dir: Path, router: dict[str, Any], index: int, config_dir: Path
) -> None:
    """gRPC for Envoy on the first router only (one port); the descriptors file."""
    if options.grpc_port is not None:
        router["grpc_port"] = options.grpc_port
    if index > 0:
        router.pop("grpc_port", None)
    if options.envoy_config is not None:
        router["envoy_config"] = str(options.envoy_config.resolve())
    elif router.get("envoy_config"):
        router["envoy_config"] = str((config_dir / router["envoy_config"]).resolve())
    elif "grpc_port" in router:
        router["envoy_config"] = str(data_dir / "ratelimit.yaml")


def cluster_id(data_dir: Path) -> str:
    """This data dir's cluster id (made once, kept in <data dir>/cluster-id): the
    routers it starts share it, and another cluster's nodes refuse them."""
    path = data_dir / "cluster-id"
    if not path.exists():
        path.write_text(secrets.token_hex(8) + "\n")
    return path.read_text().strip()
