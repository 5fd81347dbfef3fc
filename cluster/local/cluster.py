"""The launcher of a whole local cluster: Redis processes, nodes and routers as children.

One launcher for `shardlimit up` (cluster/cli/up.py), the benchmarks and the chaos tests:

    with scratch_cluster(nodes=3) as local:      # free ports, a temporary data dir
        local.router_url                          # "http://127.0.0.1:P"
        local.nodes[0].pause(); local.nodes[0].resume()     # SIGSTOP / SIGCONT
        local.redis[1].kill(); await local.redis[1].start_async()   # crash, AOF replay

Nodes are `shardlimit serve node`, routers `shardlimit serve router` from a config
written under the data dir; `stop()` takes routers, then nodes, then Redis down.
`supervise()` (which `shardlimit up` does) restarts any child that exits; without it a
killed child stays down, as chaos tests want.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.local.ports import free_port_run, listening
from cluster.local.procs import ChildProcess, Started, python_module
from cluster.local.recorded import RecordedPorts, endpoint_ports, recorded_members
from cluster.local.redis_proc import RedisProcess, redis_server_binary
from cluster.local.router_config import write_router_config
from cluster.local.sentinel_proc import Replication
from cluster.local.shards import Shards, build_shards, follow_recorded
from cluster.local.supervisor import Restart, Supervisor, Watched, log_restart
from cluster.local.up_options import UpOptions
from cluster.model.nodes import NodeSpec
from cluster.web.auth import ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ENV


def node_process(
    node_id: str,
    port: int,
    redis_url: str,
    *,
    host: str = "127.0.0.1",
    log: Path | None = None,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> ChildProcess:
    """`shardlimit serve node`, ready once /healthz answers."""
    args = python_module(
        "cluster.cli",
        "serve",
        "node",
        "--id",
        node_id,
        "--host",
        host,
        "--port",
        str(port),
        "--redis",
        redis_url,
        *extra,
    )
    return ChildProcess(
        f"node-{node_id}", args, log=log, env=env, ready_url=f"http://{host}:{port}/healthz"
    )


def router_process(
    name: str,
    config: Path,
    url: str,
    *,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> ChildProcess:
    """`shardlimit serve router --config FILE`, ready once `url`/readyz answers."""
    args = python_module("cluster.cli", "serve", "router", "--config", str(config), *extra)
    return ChildProcess(name, args, log=log, env=env, ready_url=url + "/readyz")


def fresh_members(options: UpOptions) -> list[NodeSpec]:
    """The shards of a new cluster: n1..nN, their first endpoints on consecutive ports
    from --base-port, then each further round of endpoints on the next N ports."""
    count, host, base = options.nodes, options.host, options.base_port
    return [
        NodeSpec(
            f"n{i + 1}",
            f"http://{host}:{base + i}",
            more_urls=tuple(
                f"http://{host}:{base + count * j + i}" for j in range(1, options.endpoints)
            ),
        )
        for i in range(count)
    ]


@dataclass
class LocalCluster(Started):
    options: UpOptions
    admin_token: str
    cluster_token: str
    redis: list[RedisProcess] = field(default_factory=list)
    nodes: list[ChildProcess] = field(default_factory=list)  # each shard's first endpoint
    # Every node process of each shard (its endpoints), the first one first, by member.
    endpoints: list[list[ChildProcess]] = field(default_factory=list)
    routers: list[ChildProcess] = field(default_factory=list)
    # The nodes started here: --nodes fresh ones, or those of the cluster recorded in the
    # data dir (cluster/local/recorded.py), live-added ones included.
    members: list[NodeSpec] = field(default_factory=list)
    partitioner: str = ""
    notes: list[str] = field(default_factory=list)  # what `up` tells the user it decided
    replication: Replication | None = None  # replicas and Sentinels (options.replicas > 0)
    recorded_ports: RecordedPorts | None = None  # how the data dir was started before
    supervisor: Supervisor | None = None
    shards: Shards | None = None  # the Redis side, once built

    def __post_init__(self) -> None:
        self.partitioner = self.options.partitioner
        self.members = fresh_members(self.options)

    @property
    def router_url(self) -> str:
        return self.router_urls[0]

    @property
    def router_urls(self) -> list[str]:
        return [
            f"http://{self.options.host}:{self.options.port + i}"
            for i in range(self.options.routers)
        ]

    @property
    def node_processes(self) -> list[ChildProcess]:
        """Every node process: each shard's every endpoint."""
        return [node for shard in self.endpoints for node in shard]

    @property
    def children(self) -> list[ChildProcess]:
        """Nodes and routers (not Redis), in start order."""
        return [*self.node_processes, *self.routers]

    def router_name(self, index: int) -> str:
        """router, router-2, router-3, ...: its log and data dir are named alike."""
        return "router" if index == 0 else f"router-{index + 1}"

    @property
    def data_dir(self) -> Path:
        return self.options.data_dir.resolve()

    def node_id(self, index: int) -> str:
        return self.members[index].id

    def node_url(self, index: int) -> str:
        return self.members[index].url

    def node_specs(self) -> list[NodeSpec]:
        return list(self.members)

    def env(self) -> dict[str, str]:
        """The children's environment: tokens travel here, never on a command line."""
        env = dict(os.environ)
        env[ADMIN_TOKEN_ENV] = self.admin_token
        env[CLUSTER_TOKEN_ENV] = self.cluster_token
        if self.options.log_level is not None:
            env["SHARDLIMIT_LOG_LEVEL"] = self.options.log_level
        return env

    def _log(self, name: str) -> Path:
        return self.data_dir / "logs" / f"{name}.log"

    def take_recorded_cluster(self) -> None:
        """On a data dir that holds a cluster: bring back exactly its nodes, each on its
        own Redis data, or refuse naming what is missing (cluster/local/recorded.py);
        with the replicas and Sentinels it was started with."""
        self.recorded_ports, note = follow_recorded(self.options, self.data_dir)
        self.notes += [note] if note else []
        recorded = recorded_members(self.data_dir, self.options.host, redis_server_binary())
        if recorded is None:
            return
        members, partitioner = recorded
        if self.members != members or self.options.partitioner != partitioner:
            self.notes.append(
                f"{self.data_dir} holds a {partitioner} cluster of nodes "
                f"{', '.join(m.id for m in members)}: bringing it back as recorded "
                "(--nodes and --partitioner apply to a new data dir)"
            )
        self.members, self.partitioner = members, partitioner

    def _promised_ports(self) -> set[int]:
        """The nodes' and routers' ports: a Redis must not take one before they bind."""
        promised = {port for spec in self.members for port in endpoint_ports(spec)}
        promised |= {self.options.port + i for i in range(self.options.routers)}
        if self.options.grpc_port is not None:
            promised.add(self.options.grpc_port)
        return promised

    def _ports_taken(self) -> None:
        """Refuse to start while another process listens on a port we would use: our
        router would otherwise talk to whatever answers there."""
        owners = {port: f"node {spec.id}" for spec in self.members for port in endpoint_ports(spec)}
        owners.update(
            {self.options.port + i: self.router_name(i) for i in range(self.options.routers)}
        )
        if self.options.grpc_port is not None:
            owners[self.options.grpc_port] = "the gRPC listener"
        for port in self.recorded_ports.ports() if self.recorded_ports else ():
            owners[port] = "a recorded Redis or Sentinel"  # only replicated ones record ports
        taken = [
            f"{port} ({who})"
            for port, who in sorted(owners.items())
            if listening(port, self.options.host)
        ]
        if taken:
            raise RuntimeError(
                f"port {', '.join(taken)} on {self.options.host} is in use by another "
                "process; nothing was started (stop it, or choose --port/--base-port)"
            )

    def _build(self) -> None:
        """Every child, not started yet."""
        env = self.env()
        extra = ("--json",) if self.options.json_logs else ()
        self.shards = build_shards(
            self.options,
            self.data_dir,
            [spec.id for spec in self.members],
            self._promised_ports(),
            self.recorded_ports,
        )
        self.redis, self.replication = self.shards.redis, self.shards.replication
        clock = ("--test-clock",) if self.options.test_clock else ()
        for spec, url in zip(self.members, self.shards.urls, strict=True):
            shard = [
                node_process(
                    spec.id,
                    port,
                    url,
                    host=self.options.host,
                    log=self._log(f"node-{spec.id}" + (f"-{index + 1}" if index else "")),
                    env=env,
                    extra=(*clock, *extra),
                )
                for index, port in enumerate(endpoint_ports(spec))
            ]
            self.endpoints.append(shard)
            self.nodes.append(shard[0])
        for index, url in enumerate(self.router_urls):
            name = self.router_name(index)
            config = write_router_config(
                self.options,
                self.data_dir,
                index,
                name=name,
                partitioner=self.partitioner,
                members=self.members,
            )
            self.routers.append(
                router_process(name, config, url, log=self._log(name), env=env, extra=extra)
            )

    def start(self, within: float = 30.0) -> None:
        """Redis, then the nodes (started together), then the routers one by one: the
        first seeds the cluster's rules from the rules file, the others serve the
        cluster's. On failure, whatever was started is stopped again."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.take_recorded_cluster()
        self._ports_taken()
        try:
            self._build()
            for redis in self.redis:
                redis.start()
            if self.replication is not None:
                self.replication.start()
            for node in self.node_processes:
                node.spawn()
            for node in self.node_processes:
                node.wait_ready(within)
            self._all_alive(self.node_processes)  # before a router talks to whatever answered
            for router in self.routers:
                router.start(within)
            self._all_alive(self.children)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _all_alive(children: list[ChildProcess]) -> None:
        """A probe may have been answered by another process on the child's port."""
        for child in children:
            if not child.alive:
                raise RuntimeError(f"{child.name} exited with {child.returncode}; see {child.log}")

    def supervise(
        self, report: Callable[[Restart], None] = log_restart, *, in_thread: bool = True
    ) -> Supervisor:
        """Restart every child (router, node, Redis, Sentinel) that exits from now on
        until `stop()`, reporting each restart. `in_thread`: from a thread of its own,
        else the caller calls `tick()` (as `shardlimit up` does from its main loop)."""
        assert self.shards is not None, "supervise() a started cluster"
        watched = [Watched(child) for child in self.children] + self.shards.watched()
        self.supervisor = Supervisor(watched, report)
        if in_thread:
            self.supervisor.run_in_thread()
        return self.supervisor

    def summary(self) -> dict[str, Any]:
        assert self.shards is not None, "the summary of a started cluster"
        return {
            "router": self.router_url,
            "routers": self.router_urls,
            "admin_token": self.admin_token,
            "data_dir": str(self.data_dir),
            "logs": str(self.data_dir / "logs"),
            "nodes": [
                {
                    "id": self.node_id(i),
                    "url": self.node_url(i),
                    **({"urls": list(self.members[i].urls)} if self.options.endpoints > 1 else {}),
                    **self.shards.summary(i),
                }
                for i in range(len(self.redis))
            ],
            "partitioner": self.partitioner,
            "notes": self.notes,
        }

    def stop(self, grace: float = 10.0) -> None:
        """Routers, then nodes (SIGTERM together, then awaited), then Redis (SIGTERM:
        Redis fsyncs its AOF). Every child, also when one of them misbehaves; none is
        restarted meanwhile."""
        if self.supervisor is not None:
            self.supervisor.halt()
        for tier in (self.routers, self.node_processes):
            for child in tier:
                child.terminate()
            for child in tier:
                child.wait_stopped(grace)
        if self.replication is not None:
            self.replication.stop_sentinels(grace)
        for redis in self.redis:
            redis.stop(grace)
        if self.replication is not None:
            self.replication.stop_replicas(grace)
        if self.supervisor is not None:
            self.supervisor.close()  # after the stops: its thread spawned some children


def scratch_options(nodes: int = 3, routers: int = 1, **settings: Any) -> UpOptions:
    """UpOptions on free ports, for a throwaway cluster (data_dir still to be set)."""
    node_ports = nodes * int(settings.get("endpoints", 1))
    base_port = free_port_run(node_ports)
    port = free_port_run(routers, avoid=range(base_port, base_port + node_ports))
    return UpOptions(nodes=nodes, routers=routers, port=port, base_port=base_port, **settings)


@contextlib.contextmanager
def scratch_cluster(
    nodes: int = 3,
    *,
    admin_token: str | None = None,
    cluster_token: str | None = None,
    data_dir: Path | None = None,
    **settings: Any,
) -> Iterator[LocalCluster]:
    """A started LocalCluster on free ports; stopped after, and its data dir removed
    unless one was given; tokens made up unless given. `settings` are further UpOptions
    fields."""
    own_dir = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="sl-cluster-")) if data_dir is None else data_dir
    try:
        options = scratch_options(nodes, data_dir=root, **settings)
        admin = admin_token or secrets.token_urlsafe(24)
        with LocalCluster(options, admin, cluster_token or secrets.token_urlsafe(24)) as local:
            yield local
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
