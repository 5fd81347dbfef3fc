"""`shardlimit up`: a whole local cluster (Redis processes, nodes, router) as children."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from cluster import topology as topo
from cluster.auth import ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ENV
from cluster.procs import child_preexec, wait_http_ok
from cluster.redis_proc import RedisProcess, free_port


@dataclass
class UpOptions:
    nodes: int = 3
    partitioner: str = "ring"
    port: int = 8080
    base_port: int = 7001
    host: str = "127.0.0.1"
    data_dir: Path = Path("data")
    config: Path | None = None
    appendfsync: str = "everysec"
    test_clock: bool = False
    routers: int = 1  # on consecutive ports from `port`, sharing nodes, rules and topology
    grpc_port: int | None = None  # Envoy's rate-limit service on the first router
    envoy_config: Path | None = None  # its descriptors (default: <data dir>/ratelimit.yaml)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class LocalCluster:
    options: UpOptions
    admin_token: str
    cluster_token: str
    redis: list[RedisProcess] = field(default_factory=list)
    children: list[Child] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    @property
    def router_url(self) -> str:
        return self.router_urls[0]

    @property
    def router_urls(self) -> list[str]:
        return [f"http://{self.options.host}:{self.options.port + i}"
                for i in range(self.options.routers)]  # fmt: skip

    def router_name(self, index: int) -> str:
        """router, router-2, router-3, ...: its log and data dir are named alike."""
        return "router" if index == 0 else f"router-{index + 1}"

    @property
    def data_dir(self) -> Path:
        return self.options.data_dir.resolve()

    def node_url(self, index: int) -> str:
        return f"http://{self.options.host}:{self.options.base_port + index}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[ADMIN_TOKEN_ENV] = self.admin_token
        env[CLUSTER_TOKEN_ENV] = self.cluster_token
        return env

    def _spawn(self, name: str, args: list[str]) -> Child:
        log_dir = self.data_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        handle = log_path.open("ab")
        self._logs.append(handle)
        proc = subprocess.Popen(
            [sys.executable, "-m", "cluster.cli", *args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=self._env(),
            preexec_fn=child_preexec,
        )
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    def write_router_config(self, index: int = 0) -> Path:
        base: dict[str, Any] = {}
        config_dir = Path.cwd()
        if self.options.config is not None:
            base = yaml.safe_load(self.options.config.read_text()) or {}
            config_dir = self.options.config.resolve().parent
        router = dict(base.get("router") or {})
        rules_file = router.get("rules_file")
        if rules_file:
            router["rules_file"] = str((config_dir / rules_file).resolve())
        else:
            router["rules_file"] = str(self.data_dir / "rules.yaml")
        router.update(
            host=self.options.host,
            port=self.options.port + index,
            data_dir=str(self.data_dir / self.router_name(index)),
        )
        self._envoy_settings(router, index, config_dir)
        cluster = dict(base.get("cluster") or {})
        cluster["partitioner"] = self.options.partitioner
        cluster["nodes"] = [
            {"id": f"n{i + 1}", "url": self.node_url(i), "weight": 1}
            for i in range(self.options.nodes)
        ]
        path = self.data_dir / ("cluster.yaml" if index == 0 else f"cluster-{index + 1}.yaml")
        path.write_text(yaml.safe_dump({"router": router, "cluster": cluster}, sort_keys=False))
        return path

    def _envoy_settings(self, router: dict[str, Any], index: int, config_dir: Path) -> None:
        """gRPC for Envoy on the first router only (one port); the descriptors file."""
        if self.options.grpc_port is not None:
            router["grpc_port"] = self.options.grpc_port
        if index > 0:
            router.pop("grpc_port", None)
        if self.options.envoy_config is not None:
            router["envoy_config"] = str(self.options.envoy_config.resolve())
        elif router.get("envoy_config"):
            router["envoy_config"] = str((config_dir / router["envoy_config"]).resolve())
        elif "grpc_port" in router:
            router["envoy_config"] = str(self.data_dir / "ratelimit.yaml")

    def check_stored_topology(self) -> None:
        stored = topo.load(self.data_dir / "router" / "topology.json")
        if stored is None:
            return
        wanted = {(f"n{i + 1}", self.node_url(i)) for i in range(self.options.nodes)}
        have = {(n.id, n.url) for n in stored.nodes}
        if wanted != have or stored.partitioner.kind != self.options.partitioner:
            raise SystemExit(
                f"{self.data_dir} holds a cluster with nodes {sorted(have)} "
                f"({stored.partitioner.kind}); start with the same --nodes/--base-port/"
                "--partitioner or use another --data-dir"
            )

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.check_stored_topology()
        # The nodes' and routers' ports are promised already: Redis must not take one.
        promised = {self.options.base_port + i for i in range(self.options.nodes)}
        promised |= {self.options.port + i for i in range(self.options.routers)}
        if self.options.grpc_port is not None:
            promised.add(self.options.grpc_port)
        for i in range(self.options.nodes):
            redis = RedisProcess(
                port=free_port(avoid=promised),
                data_dir=self.data_dir / f"redis-n{i + 1}",
                appendfsync=self.options.appendfsync,
            )
            redis.start()
            self.redis.append(redis)
        for i, redis in enumerate(self.redis):
            args = ["serve", "node", "--id", f"n{i + 1}", "--host", self.options.host,
                    "--port", str(self.options.base_port + i), "--redis", redis.url]  # fmt: skip
            if self.options.test_clock:
                args.append("--test-clock")
            self._spawn(f"node-n{i + 1}", args)
        for i in range(self.options.nodes):
            self.wait_http(self.node_url(i) + "/healthz", f"node-n{i + 1}")
        # The first router seeds the cluster's rules from the rules file; the others
        # start once it is ready and serve the cluster's.
        for index, url in enumerate(self.router_urls):
            config = self.write_router_config(index)
            name = self.router_name(index)
            self._spawn(name, ["serve", "router", "--config", str(config)])
            self.wait_http(url + "/readyz", name)

    def wait_http(self, url: str, name: str, timeout: float = 30.0) -> None:
        child = next((c for c in self.children if c.name == name), None)

        def log_tail() -> str:
            assert child is not None
            return f" ({name}):\n" + child.log_path.read_text(errors="replace")[-3000:]

        wait_http_ok(url, timeout, child.proc if child else None, log_tail)

    def summary(self) -> dict[str, Any]:
        return {
            "router": self.router_url,
            "routers": self.router_urls,
            "admin_token": self.admin_token,
            "data_dir": str(self.data_dir),
            "logs": str(self.data_dir / "logs"),
            "nodes": [
                {
                    "id": f"n{i + 1}",
                    "url": self.node_url(i),
                    "redis": r.url,
                    "redis_dir": str(r.data_dir),
                }
                for i, r in enumerate(self.redis)
            ],
            "partitioner": self.options.partitioner,
        }

    def stop(self) -> None:
        """Router first, then nodes, then Redis (SIGTERM: Redis fsyncs its AOF)."""
        for child in reversed(self.children):
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in reversed(self.children):
            try:
                child.proc.wait(10)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
        for redis in self.redis:
            redis.stop()
        for handle in self._logs:
            handle.close()


def run_up(options: UpOptions, as_json: bool) -> int:
    admin = os.environ.get(ADMIN_TOKEN_ENV) or secrets.token_urlsafe(24)
    cluster_token = os.environ.get(CLUSTER_TOKEN_ENV) or secrets.token_urlsafe(24)
    local = LocalCluster(options, admin, cluster_token)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        local.start()
        info = local.summary()
        if as_json:
            print(json.dumps(info), flush=True)
        else:
            print_summary(info)
        while not stop.is_set():
            stop.wait(0.5)
            for child in local.children:
                if child.proc.poll() is not None and not stop.is_set():
                    print(
                        f"{child.name} exited with {child.proc.returncode}; see {child.log_path}",
                        file=sys.stderr,
                        flush=True,
                    )
                    stop.set()
    except (RuntimeError, OSError) as exc:
        print(f"shardlimit up failed: {exc}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            local.stop()
    if not as_json:
        print("stopped: router, nodes and Redis processes are down", flush=True)
    return 0


def print_summary(info: dict[str, Any]) -> None:
    routers = info.get("routers") or [info["router"]]
    print(f"shardlimit is up: router {', '.join(routers)} ({info['partitioner']} partitioner)")
    for node in info["nodes"]:
        print(f"  node {node['id']:<4} {node['url']:<24} redis {node['redis']}  "
              f"data {node['redis_dir']}")  # fmt: skip
    print(f"data dir:     {info['data_dir']}")
    print(f"logs:         {info['logs']}")
    print(f"admin token:  {info['admin_token']}")
    print(f"try:          curl -s -XPOST {info['router']}/v1/check "
          "-d '{\"key\":\"user:1\",\"limits\":[{\"algorithm\":\"fixed_window\","
          "\"limit\":10,\"window\":\"1m\"}]}'")  # fmt: skip
    print("Ctrl-C stops everything.", flush=True)
