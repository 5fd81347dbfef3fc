"""The cluster.yaml a local cluster writes for each of its routers: the user's --config
with the ports, data dir, rules and Envoy files of this cluster, and its nodes. Without
a rules file in --config, the routers share `<data dir>/rules.yaml`, written as
`rules: {}` (no rules) when it is not there."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import yaml

from cluster.local.up_options import UpOptions
from cluster.model.nodes import NodeSpec

# A cluster without a rules file of its own keeps one here, `rules: {}` until edited.
OWN_RULES = "rules.yaml"
NO_RULES = "rules: {}\n"


def _base(options: UpOptions) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """(--config's document, its router section with `router_settings` over it, the
    directory its relative paths start from)."""
    base: dict[str, Any] = {}
    config_dir = Path.cwd()
    if options.config is not None:
        base = yaml.safe_load(options.config.read_text()) or {}
        config_dir = options.config.resolve().parent
    router = dict(base.get("router") or {})
    router.update(options.router_settings)
    return base, router, config_dir


def configured_rules_file(options: UpOptions) -> Path | None:
    """The rules file --config (or `router_settings`) names, resolved; None when it
    names none and the cluster keeps its own under the data dir."""
    _, router, config_dir = _base(options)
    rules_file = router.get("rules_file")
    return (config_dir / rules_file).resolve() if rules_file else None


def tls_settings(config: Path) -> list[str]:
    """The TLS settings `config` (--config) gives its router: a local cluster's nodes
    serve plain HTTP, which a router with TLS settings refuses to talk to."""
    try:
        router = (yaml.safe_load(config.read_text()) or {}).get("router") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return []  # what is wrong with the file is said as `serve router` says it
    if not isinstance(router, dict):
        return []
    return [name for name in ("tls_cert", "tls_key", "tls_ca", "tls_mutual") if router.get(name)]


def envoy_descriptors(options: UpOptions, data_dir: Path) -> Path | None:
    """The descriptors file the first router's Envoy listener reads (None: no listener)."""
    _, router, config_dir = _base(options)
    _envoy_settings(options, data_dir, router, 0, config_dir)
    if router.get("grpc_port") is None or not router.get("envoy_config"):
        return None
    return Path(router["envoy_config"])


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
    base, router, config_dir = _base(options)
    rules_file = configured_rules_file(options)
    if rules_file is None:
        rules_file = data_dir / OWN_RULES
        if not rules_file.exists():
            rules_file.write_text(NO_RULES)
    router["rules_file"] = str(rules_file)
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
