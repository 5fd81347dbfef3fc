"""Router / cluster configuration (YAML), validated with field paths."""

from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster.model.algorithms import DEFAULT_QUOTA_TTL_MS
from cluster.model.errors import Problems
from cluster.model.keys import RULE_NAME_TEXT
from cluster.model.limits import parse_duration
from cluster.model.nodes import NodeSpec
from cluster.model.partition import DEFAULT_VNODES
from cluster.web.tls import TlsFiles
from cluster.wire.control import COPY_BUSY_PCT

DEFAULT_PORT = 8080
log = logging.getLogger("shardlimit.config")
CLUSTER_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}\Z")


@dataclass
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    data_dir: Path = Path("data/router")
    rules_file: Path | None = None
    # Every batch to a node carries a deadline this far ahead; the router waits for it
    # until the deadline plus the margin (see cluster/wire/__init__.py and the README).
    node_deadline_ms: int = 1000
    deadline_margin_ms: int = 250
    node_inflight: int = 2  # batch requests in flight per node
    node_queue_max: int = 20_000  # checks waiting per node before `overloaded`
    coalesce_wait_us: int = 0
    coalesce_max: int = 1000
    idempotency_ttl_ms: int = 86_400_000
    # A `quota` counter without expires_at lives this long after its last change.
    quota_ttl_ms: int = DEFAULT_QUOTA_TTL_MS
    rules_poll_ms: int = 1000
    reshard_step_keys: int = 20_000  # keys a source examines per copy step
    reshard_rate: int = 0  # keys/s each source may move (0: no fixed rate)
    reshard_busy_pct: int = COPY_BUSY_PCT  # most of a source Redis' time the copy may take
    reshard_lease_ttl_ms: int = 15_000
    reshard_parallel: int = 1
    aon_hold_ms: int = 10_000  # all-or-nothing holds are given back after this
    partitioner: str = "ring"
    vnodes: int = DEFAULT_VNODES
    nodes: list[NodeSpec] = field(default_factory=list)
    # The cluster's id for a router starting on an empty data dir (default: derived from
    # the layout above, so routers sharing a config agree). A node refuses topologies of
    # another cluster id.
    cluster_id: str | None = None
    # TLS (cluster/web/tls.py): the listener's certificate, presented to nodes too when
    # `tls_mutual`; the CA node certificates must chain to.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    tls_mutual: bool = False
    # Envoy's rate-limit gRPC service (router/envoy/servicer.py): off while grpc_port is None;
    # descriptors in envoyproxy/ratelimit's YAML format, reloaded like the rules file.
    grpc_port: int | None = None
    envoy_config: Path | None = None

    @property
    def tls(self) -> TlsFiles:
        return TlsFiles(self.tls_cert, self.tls_key, self.tls_ca, self.tls_mutual)


# Duration settings of the router section, stored as `<name>_ms`.
_ROUTER_DURATIONS = (
    "node_deadline",
    "deadline_margin",
    "idempotency_ttl",
    "quota_ttl",
    "rules_poll",
    "reshard_lease_ttl",
    "aon_hold",
)
# Integer settings of the router section: (name, lowest, highest).
_ROUTER_INTS = (
    ("node_inflight", 1, 64),
    ("node_queue_max", 1, 1_000_000),
    ("coalesce_wait_us", 0, 100_000),
    ("coalesce_max", 1, 10_000),
    ("reshard_parallel", 1, 64),
    ("reshard_step_keys", 10, 100_000),
    ("reshard_rate", 0, 10_000_000),
    ("reshard_busy_pct", 1, 100),
)


# Settings of the node timeout that deadlines replaced: a 50 ms timeout measured
# queueing, not failure, so it is not carried over as a deadline.
_RETIRED = frozenset({"node_timeout", "node_timeout_per_op_us"})


# Every setting a section may hold: a typo is refused rather than silently ignored.
_ROUTER_PATHS = ("data_dir", "rules_file", "envoy_config", "tls_cert", "tls_key", "tls_ca")
_ROUTER_KEYS = (
    frozenset({"host", "port", "grpc_port", "tls_mutual", *_ROUTER_PATHS, *_ROUTER_DURATIONS})
    | frozenset(name for name, _, _ in _ROUTER_INTS)
    | _RETIRED
)
_CLUSTER_KEYS = frozenset({"id", "partitioner", "vnodes", "nodes"})
_NODE_KEYS = frozenset({"id", "url", "urls", "weight"})
_TOP_KEYS = frozenset({"router", "cluster"})


def _refuse_unknown(
    section: str, found: dict[Any, Any], known: frozenset[str], problems: Problems
) -> None:
    """One problem per unknown key, naming the nearest known one when there is one."""
    for key in found:
        if key in known:
            continue
        path = f"{section}.{key}" if section else str(key)
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
        hint = (
            f"did you mean '{close[0]}'?"
            if close
            else f"known: {', '.join(sorted(known - _RETIRED))}"
        )
        problems.add(path, f"unknown setting; {hint}")


def _resolve(base: Path, value: Any) -> Path:
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else (base / path)


def _parse_tls(router: dict[str, Any], base: Path, cfg: RouterConfig, problems: Problems) -> None:
    for name in ("tls_cert", "tls_key", "tls_ca"):
        value = router.get(name)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            problems.add(f"router.{name}", "must be a file path")
        else:
            setattr(cfg, name, _resolve(base, value))
    mutual = router.get("tls_mutual", False)
    if not isinstance(mutual, bool):
        problems.add("router.tls_mutual", "must be true or false")
    else:
        cfg.tls_mutual = mutual
    for setting, message in cfg.tls.problems(lambda part: f"router.tls_{part}"):
        problems.add(setting, message)
    if cfg.tls_ca is not None:
        for index, spec in enumerate(cfg.nodes):
            if not all(url.startswith("https://") for url in spec.urls):
                problems.add(f"cluster.nodes[{index}].url", "must be https:// with router.tls_ca")


def _parse_envoy(router: dict[str, Any], base: Path, cfg: RouterConfig, problems: Problems) -> None:
    port = router.get("grpc_port")
    if port is not None:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            problems.add("router.grpc_port", "must be a TCP port number")
        else:
            cfg.grpc_port = port
    envoy_config = router.get("envoy_config")
    if envoy_config is not None and envoy_config != "":
        if not isinstance(envoy_config, str):
            problems.add("router.envoy_config", "must be a file path")
        else:
            cfg.envoy_config = _resolve(base, envoy_config)


def parse_config(doc: Any, base: Path) -> RouterConfig:
    """A cluster.yaml document -> RouterConfig; relative paths resolve against `base`."""
    problems = Problems()
    if not isinstance(doc, dict):
        problems.add("config", "must be a mapping with 'router' and 'cluster'")
        problems.raise_if_any()
    router = doc.get("router") or {}
    cluster = doc.get("cluster") or {}
    cfg = RouterConfig()
    if not isinstance(router, dict) or not isinstance(cluster, dict):
        problems.add("config", "'router' and 'cluster' must be mappings")
        problems.raise_if_any()
    _refuse_unknown("", doc, _TOP_KEYS, problems)
    _refuse_unknown("router", router, _ROUTER_KEYS, problems)
    _refuse_unknown("cluster", cluster, _CLUSTER_KEYS, problems)
    cfg.host = str(router.get("host", cfg.host))
    port = router.get("port", cfg.port)
    if not isinstance(port, int) or not 0 <= port <= 65535:
        problems.add("router.port", "must be a TCP port number")
    else:
        cfg.port = port
    cfg.data_dir = _resolve(base, router.get("data_dir", "data/router"))
    if router.get("rules_file"):
        cfg.rules_file = _resolve(base, router["rules_file"])
    for old in _RETIRED & set(router):
        log.warning("router.%s is retired and ignored: see node_deadline, deadline_margin", old)
    for name in _ROUTER_DURATIONS:
        if name in router:
            setattr(cfg, f"{name}_ms", parse_duration(router[name], f"router.{name}", problems))
    if cfg.node_deadline_ms < 10 or cfg.deadline_margin_ms < 10:
        problems.add("router.node_deadline", "node_deadline and deadline_margin must be >= 10ms")
    for name, low, high in _ROUTER_INTS:
        value = router.get(name, getattr(cfg, name))
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            problems.add(f"router.{name}", f"must be an integer from {low} to {high}")
        else:
            setattr(cfg, name, value)
    if 0 < cfg.coalesce_wait_us < 1000:
        # Event-loop timers fire in whole milliseconds (uvloop rounds a delay to the
        # nearest one, under half of one to none): such a wait would not be kept.
        problems.add(
            "router.coalesce_wait_us", "must be 0 (no wait) or from 1000: timers fire in whole ms"
        )
    cluster_id = cluster.get("id")
    if cluster_id is not None:
        if not isinstance(cluster_id, str) or not CLUSTER_ID.match(cluster_id):
            problems.add("cluster.id", f"must be {RULE_NAME_TEXT}")
        else:
            cfg.cluster_id = cluster_id
    kind = cluster.get("partitioner", "ring")
    if kind not in ("ring", "slots"):
        problems.add("cluster.partitioner", "must be 'ring' or 'slots'")
    else:
        cfg.partitioner = kind
    vnodes = cluster.get("vnodes", DEFAULT_VNODES)
    if not isinstance(vnodes, int) or not 1 <= vnodes <= 10_000:
        problems.add("cluster.vnodes", "must be 1..10000")
    else:
        cfg.vnodes = vnodes
    nodes = cluster.get("nodes") or []
    if not isinstance(nodes, list):
        problems.add("cluster.nodes", "must be a list")
        nodes = []
    for index, raw in enumerate(nodes):
        if isinstance(raw, dict):
            _refuse_unknown(f"cluster.nodes[{index}]", raw, _NODE_KEYS, problems)
        try:
            cfg.nodes.append(NodeSpec.from_dict(raw))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.add(f"cluster.nodes[{index}]", f"bad node: {exc}")
    _parse_tls(router, base, cfg, problems)
    _parse_envoy(router, base, cfg, problems)
    problems.raise_if_any()
    return cfg


def load_config(path: Path) -> RouterConfig:
    return parse_config(yaml.safe_load(path.read_text()), path.parent)
