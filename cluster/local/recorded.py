"""The cluster a data dir records: which nodes `up` must bring back, and where their
Redis data lives (`<data dir>/redis-<node id>`, for nodes added live too), and the
ports of every Redis and Sentinel (`RecordedPorts`)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from cluster.local.up_options import DOWN_AFTER_MS
from cluster.model import topology as topo
from cluster.model.nodes import NodeSpec
from cluster.model.partition import partitioner_from_dict

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
PORTS_FILE = "processes.json"


@dataclass
class RecordedPorts:
    """How the Redis side of a local cluster was started: replicas per node, the
    Sentinels' down-after, and the ports to start them on again. With replicas those
    must not change: each Sentinel rewrites its own config file naming the primaries',
    replicas' and other Sentinels' ports, and a replica follows its primary's port."""

    replicas: int = 0
    down_after_ms: int = DOWN_AFTER_MS
    sentinels: list[int] = field(default_factory=list)
    redis: dict[str, list[int]] = field(default_factory=dict)  # id -> primary, replicas

    def ports(self) -> set[int]:
        """The ports that must be the same again: with replicas, every Redis' and
        Sentinel's. Without, a Redis comes back on its port only if it is free."""
        if not self.replicas:
            return set()
        return {*self.sentinels, *(p for ports in self.redis.values() for p in ports)}


def load_ports(data_dir: Path) -> RecordedPorts | None:
    path = data_dir / PORTS_FILE
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
        return RecordedPorts(
            replicas=int(raw["replicas"]),
            down_after_ms=int(raw["down_after_ms"]),
            sentinels=[int(p) for p in raw["sentinels"]],
            redis={str(k): [int(p) for p in v] for k, v in raw["redis"].items()},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RuntimeError(f"{path} is not a record of a local cluster ({exc})") from exc


def save_ports(data_dir: Path, ports: RecordedPorts) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / PORTS_FILE
    spare = path.with_suffix(".tmp")
    spare.write_text(json.dumps(asdict(ports), indent=1) + "\n")
    spare.replace(path)


def redis_dir(data_dir: Path, node_id: str) -> Path:
    return data_dir / f"redis-{node_id}"


def node_port(spec: NodeSpec) -> int:
    """The port of the shard's first endpoint."""
    return endpoint_ports(spec)[0]


def endpoint_ports(spec: NodeSpec) -> list[int]:
    """The port of each endpoint of the shard, the first one first."""
    ports = []
    for url in spec.urls:
        port = urlsplit(url).port
        if port is None:
            raise RuntimeError(f"node {spec.id} has no port in its URL {url}")
        ports.append(port)
    return ports


def holds_redis_data(directory: Path) -> bool:
    """Whether a Redis ran with its data here: an AOF (a directory since Redis 7, a file
    before) or an RDB file."""
    if (directory / "appendonlydir").is_dir() or (directory / "appendonly.aof").is_file():
        return True
    return any(directory.glob("*.rdb"))


def redis_version(binary: str) -> tuple[int, ...]:
    """(major, minor) of a redis-server binary; () if it cannot tell."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        number = done.stdout.split("v=", 1)[1].split()[0]
        return tuple(int(part) for part in number.split(".")[:2])
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return ()


def too_old_for(directory: Path, binary: str) -> str | None:
    """Why `binary` would start empty on the data in `directory`: Redis 7 keeps its AOF
    in appendonlydir/, which an older Redis does not read (it starts with no keys)."""
    if not (directory / "appendonlydir").is_dir():
        return None
    version = redis_version(binary)
    if version and version < (7, 0):
        shown = ".".join(map(str, version))
        return (
            f"{directory} holds Redis 7 data, but the redis-server found first ({binary}, "
            f"{shown}) would start without it: put a Redis 7 first on PATH"
        )
    return None


def recorded_members(
    data_dir: Path, host: str, binary: str | None = None
) -> tuple[list[NodeSpec], str] | None:
    """(the nodes to bring back, the partitioner) of the cluster recorded in `data_dir`,
    None if it records none; `binary`: the redis-server that will run them. Raises
    RuntimeError naming every node whose Redis data is missing, or that `up` cannot run
    here: an empty node must never stand in for one that held counters."""
    topology = topo.load(data_dir / "router" / "topology.json")
    if topology is None:
        return None
    members = list(topology.nodes)
    migration = topology.migration or {}
    if isinstance(migration.get("from"), dict):
        ids = {m.id for m in members}
        members += [n for n in partitioner_from_dict(migration["from"]).nodes if n.id not in ids]
    problems = []
    for spec in members:
        where = urlsplit(spec.url).hostname
        directory = redis_dir(data_dir, spec.id)
        if where not in (host, *LOCAL_HOSTS):
            problems.append(
                f"node {spec.id} runs at {spec.url}, not on this host: up cannot bring it back"
            )
        elif not holds_redis_data(directory):
            problems.append(
                f"node {spec.id} ({spec.url}) has no Redis data in {directory}: put that "
                f"node's Redis data directory there (a node added live keeps its Redis in "
                f"{redis_dir(data_dir, '<id>')})"
            )
        elif binary is not None and (why := too_old_for(directory, binary)) is not None:
            problems.append(f"node {spec.id}: {why}")
    if problems:
        raise RuntimeError(
            f"{data_dir} records a cluster of nodes {', '.join(m.id for m in members)}, "
            f"but {'; '.join(problems)}. Nothing was started (or use another --data-dir)"
        )
    return members, topology.partitioner.kind
