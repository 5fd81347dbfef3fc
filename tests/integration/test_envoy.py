"""Envoy's rate-limit service over gRPC (router/envoy/servicer.py): a real grpcio client against
a router's gRPC listener in front of real nodes and Redis."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc  # type: ignore[import-untyped]
import pytest
import yaml
from envoy.extensions.common.ratelimit.v3 import (  # type: ignore[import-untyped]
    ratelimit_pb2,
)
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]

from cluster.local.redis_proc import RedisProcess, free_port
from cluster.model.errors import ValidationError
from cluster.model.nodes import NodeSpec
from node.app import create_app as create_node_app
from node.config import NodeConfig
from router.app import ENVOY, ROUTER
from router.app import create_app as create_router_app
from router.config import RouterConfig, parse_config
from router.envoy.descriptors import limit_key, parse_text, scope_name
from router.front.server import front_for
from tests.conftest import ADMIN, CLUSTER, PINNED_MS, RULES, Cluster, _start, eventually
from tests.system.test_cli_up import consecutive_free_ports

pytestmark = pytest.mark.timeout(60)

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
UNIT = rls_pb2.RateLimitResponse.RateLimit
MAX_UINT32 = 2**32 - 1
DAY_LEFT_MS = 86_400_000 - 10 * 3_600_000 - 10 * 60_000  # PINNED_MS is 10:10:00 UTC
MINUTE_MS = 60_000

# envoyproxy/ratelimit README, example 2, verbatim.
MESSAGING = """
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"""

# envoyproxy/ratelimit examples/ratelimit/config/example.yaml (domain rl), verbatim.
RL = """
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces:
        - name: bkthomps
        - name: fake_name
      unit: minute
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit:
          replaces:
            - name: bkthomps
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: minute
          requests_per_unit: 1
      - key: destination_cluster
        value: override
        rate_limit:
          replaces:
            - name: banned_limit
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: fake
        rate_limit:
          name: fake_name
          unit: minute
          requests_per_unit: 2
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 2
    descriptors:
      - key: bar
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: bar
        value: bkthomps
        rate_limit:
          name: bkthomps
          unit: minute
          requests_per_unit: 1
      - key: bar
        value: banned
        rate_limit:
          name: banned_limit
          unit: minute
          requests_per_unit: 0
      - key: baz
        rate_limit:
          unit: second
          requests_per_unit: 1
      - key: baz
        value: not-so-shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: baz
        value: shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
        shadow_mode: true
      - key: bay
        rate_limit:
          unlimited: true
  - key: unspec
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: qux
    rate_limit:
      unlimited: true
"""

# shardlimit's additions: any limits, a cluster rule by name, on_failure.
EXTRA = """
domain: shop
descriptors:
  - key: user
    limits:
      - {algorithm: sliding_window, limit: 10, window: 1m}
      - {algorithm: fixed_window, limit: 2, window: 1h}
  - key: login_user
    rule: login
  - key: quota_user
    on_failure: deny
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: plain_user
    rate_limit: {unit: hour, requests_per_unit: 50}
"""

# envoyproxy/ratelimit README, example 11 (wildcards, share_threshold), verbatim.
FILES = """
domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
"""

ENVOY_YAML = "\n---\n".join([MESSAGING, RL, EXTRA, FILES])

Entries = list[tuple[str, str]]


class Envoy:
    """A cluster whose router serves gRPC, and a grpcio client of it."""

    def __init__(self, cluster: Cluster, port: int, config: Path) -> None:
        self.cluster = cluster
        self.config = config
        self.port = port
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)

    async def call(
        self,
        domain: str,
        *descriptors: Entries | ratelimit_pb2.RateLimitDescriptor,
        hits_addend: int = 0,
    ) -> Any:
        built = [
            d if isinstance(d, ratelimit_pb2.RateLimitDescriptor) else descriptor(d)
            for d in descriptors
        ]
        request = rls_pb2.RateLimitRequest(
            domain=domain, descriptors=built, hits_addend=hits_addend
        )
        return await self.stub.ShouldRateLimit(request, timeout=10)

    async def codes(self, domain: str, *descriptors: Entries, hits_addend: int = 0) -> Any:
        response = await self.call(domain, *descriptors, hits_addend=hits_addend)
        return response.overall_code, [s.code for s in response.statuses]


def descriptor(
    entries: Entries, *, hits: int | None = None, limit: tuple[int, int] | None = None
) -> Any:
    out = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        out.hits_addend.value = hits
    if limit is not None:
        out.limit.requests_per_unit, out.limit.unit = limit
    return out


async def start_envoy(
    redis_servers: list[RedisProcess], tmp_path: Path, envoy_yaml: str, node_deadline_ms: int
) -> Envoy:
    """tests/conftest.py's start_cluster, with the router's grpc_port and envoy_config."""
    runners = []
    specs = []
    for i in range(3):
        app = create_node_app(
            NodeConfig(f"n{i + 1}", redis_servers[i].url, CLUSTER, test_mode=True)
        )
        runner, port = await _start(app)
        runners.append(runner)
        specs.append(NodeSpec(f"n{i + 1}", f"http://127.0.0.1:{port}"))
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(RULES)
    envoy_file = tmp_path / "ratelimit.yaml"
    envoy_file.write_text(envoy_yaml)
    config = RouterConfig(
        data_dir=tmp_path / "router",
        rules_file=rules_file,
        node_deadline_ms=node_deadline_ms,
        nodes=specs,
        rules_poll_ms=50,
        grpc_port=free_port(),
        envoy_config=envoy_file,
    )
    router_app = create_router_app(config, ADMIN, CLUSTER)
    runner, port = await _start(router_app, front_for(router_app))
    runners.append(runner)
    cluster = Cluster(
        router_url=f"http://127.0.0.1:{port}",
        router=router_app[ROUTER],
        http=aiohttp.ClientSession(),
        redis=redis_servers,
        node_urls={s.id: s.url for s in specs},
        runners=runners,
        rules_file=rules_file,
    )
    await cluster.set_time(PINNED_MS)
    return Envoy(cluster, router_app[ENVOY].port, envoy_file)


async def stop_envoy(envoy: Envoy) -> None:
    await envoy.channel.close()
    await envoy.cluster.http.close()
    for runner in reversed(envoy.cluster.runners):
        await runner.cleanup()


@pytest.fixture
async def envoy(redis_servers: list[RedisProcess], tmp_path: Path) -> AsyncIterator[Envoy]:
    started = await start_envoy(redis_servers, tmp_path, ENVOY_YAML, 2000)
    try:
        yield started
    finally:
        await stop_envoy(started)


def window_left(ms: int) -> Callable[[Any], bool]:
    """duration_until_reset is at most `ms` and less than 5 s short of it."""

    def check(status: Any) -> bool:
        left = status.duration_until_reset.ToMilliseconds()
        return bool(ms - 5000 < left <= ms)

    return check


async def test_messaging_readme_example(envoy: Envoy) -> None:
    """README example 2: 5 marketing messages a day per number, 100 messages a day per
    number; both descriptors in one request, as the README's pseudo-IDL shows."""
    marketing = [("message_type", "marketing"), ("to_number", "2061111111")]
    number = [("to_number", "2061111111")]
    seen = []
    for _ in range(6):
        response = await envoy.call("messaging", marketing, number)
        seen.append(
            (
                response.overall_code,
                [(s.code, s.limit_remaining) for s in response.statuses],
            )
        )
    assert seen == [
        (OK, [(OK, 4), (OK, 99)]),
        (OK, [(OK, 3), (OK, 98)]),
        (OK, [(OK, 2), (OK, 97)]),
        (OK, [(OK, 1), (OK, 96)]),
        (OK, [(OK, 0), (OK, 95)]),
        (OVER, [(OVER, 0), (OK, 94)]),
    ]
    status = response.statuses[0]
    assert (status.current_limit.requests_per_unit, status.current_limit.unit) == (5, UNIT.DAY)
    assert window_left(DAY_LEFT_MS)(status)
    # Another number has limits of its own; a message type not in the config matches nothing.
    other = [("message_type", "marketing"), ("to_number", "2062222222")]
    assert await envoy.codes("messaging", other, [("to_number", "2062222222")]) == (OK, [OK, OK])
    alert = await envoy.call("messaging", [("message_type", "alert"), ("to_number", "1")])
    assert alert.overall_code == OK
    assert not alert.statuses[0].HasField("current_limit")
    assert alert.statuses[0].limit_remaining == 0
    # The counters are shardlimit counters: key = domain + entries, scope = config path.
    key = limit_key("messaging", number)
    assert key == "messaging|to_number=2061111111"
    scope = scope_name("messaging", [("to_number", None)])
    assert re.fullmatch(r"envoy\.messaging\.[0-9a-f]{12}", scope)


async def test_rl_example_replaces_shadow_unlimited_banned(envoy: Envoy) -> None:
    """envoyproxy/ratelimit's examples/ratelimit/config/example.yaml, domain rl."""
    await envoy.cluster.set_time(PINNED_MS + 5 * MINUTE_MS)  # a fresh minute
    foo = ("foo", "f1")
    # (foo): 2 a minute; (foo, bar): 3 a minute, each counted on its own.
    assert [await envoy.codes("rl", [foo]) for _ in range(3)] == [
        (OK, [OK]),
        (OK, [OK]),
        (OVER, [OVER]),
    ]
    assert [(await envoy.codes("rl", [foo, ("bar", "b")]))[0] for _ in range(4)] == [
        OK,
        OK,
        OK,
        OVER,
    ]
    # Shadow mode: the 4th shady request is over its 3 a minute but answered OK.
    shady = [foo, ("baz", "shady")]
    responses = [await envoy.call("rl", shady) for _ in range(4)]
    assert [(r.overall_code, r.statuses[0].limit_remaining) for r in responses] == [
        (OK, 2),
        (OK, 1),
        (OK, 0),
        (OK, 0),
    ]
    decided = envoy.cluster.router.metrics.count
    assert decided("shardlimit_decisions_total", outcome="denied") == 3  # foo, foo/bar, shady
    assert decided("shardlimit_shadow_decisions_total") == 1  # shady
    assert envoy.cluster.runners[-1].app[ENVOY].service.shadow_overrides == 1
    # Unlimited: OK, LimitRemaining = MaxUint32, nothing counted.
    for _ in range(3):
        response = await envoy.call("rl", [foo, ("bay", "x")], [("qux", "y")])
        assert response.overall_code == OK
        assert [s.limit_remaining for s in response.statuses] == [MAX_UINT32, MAX_UINT32]
        assert not response.statuses[0].HasField("current_limit")
    # requests_per_unit 0 (banned_limit): always over, unless replaced.
    banned = [foo, ("bar", "banned")]
    assert await envoy.codes("rl", banned) == (OVER, [OVER])
    override = [("source_cluster", "proxy"), ("destination_cluster", "override")]
    assert await envoy.codes("rl", banned, override) == (OK, [OK, OK])
    # bkthomps (1 a minute) is replaced by the destination_cluster=bkthomps limit (2).
    bk = [foo, ("bar", "bkthomps")]
    replacer = [("source_cluster", "proxy"), ("destination_cluster", "bkthomps")]
    assert [await envoy.codes("rl", bk, replacer) for _ in range(3)] == [
        (OK, [OK, OK]),
        (OK, [OK, OK]),
        (OVER, [OK, OVER]),
    ]
    # ... and was not counted meanwhile: alone, it has its 1 a minute left.
    assert [await envoy.codes("rl", bk) for _ in range(2)] == [(OK, [OK]), (OVER, [OVER])]
    # Depth must match: (foo, bar, extra) has no limit at depth 3.
    assert await envoy.codes("rl", [foo, ("bar", "b"), ("extra", "e")]) == (OK, [OK])


async def test_hits_addend_request_and_descriptor(envoy: Envoy) -> None:
    """Upstream's arithmetic (test/redis/fixed_cache_impl_test.go): every hit is
    counted, an over-limit answer shows 0 remaining, hits_addend 0 only reads."""
    number = [("to_number", "555")]
    first = await envoy.call("messaging", number, hits_addend=98)
    assert (first.overall_code, first.statuses[0].limit_remaining) == (OK, 2)
    # Per-descriptor hits_addend wins over the request's; 0 only reads.
    peek = await envoy.call("messaging", descriptor(number, hits=0), hits_addend=50)
    assert (peek.overall_code, peek.statuses[0].limit_remaining) == (OK, 2)
    two = await envoy.call("messaging", descriptor(number, hits=2), hits_addend=50)
    assert (two.overall_code, two.statuses[0].limit_remaining) == (OK, 0)
    # At the limit a read is still OK (100 > 100 is false) ...
    at_limit = await envoy.call("messaging", descriptor(number, hits=0))
    assert (at_limit.overall_code, at_limit.statuses[0].limit_remaining) == (OK, 0)
    # ... the next hit is over and counted (hits_addend 0 means 1), so a read is over too.
    last = await envoy.call("messaging", number)
    assert (last.overall_code, last.statuses[0].limit_remaining) == (OVER, 0)
    empty = await envoy.call("messaging", descriptor(number, hits=0))
    assert (empty.overall_code, empty.statuses[0].limit_remaining) == (OVER, 0)
    # A hits_addend beyond any limit is over it.
    other = [("to_number", "556")]
    huge = await envoy.call(
        "messaging", other, descriptor(other, hits=2**60), hits_addend=2**32 - 1
    )
    assert [(s.code, s.limit_remaining) for s in huge.statuses] == [(OVER, 0), (OVER, 0)]


async def test_limit_override(envoy: Envoy) -> None:
    await envoy.cluster.set_time(PINNED_MS + 7 * MINUTE_MS)
    number = [("to_number", "777")]
    overridden = descriptor(number, limit=(2, UNIT.MINUTE))
    responses = [await envoy.call("messaging", overridden) for _ in range(3)]
    assert [(r.overall_code, r.statuses[0].limit_remaining) for r in responses] == [
        (OK, 1),
        (OK, 0),
        (OVER, 0),
    ]
    limit = responses[0].statuses[0].current_limit
    assert (limit.requests_per_unit, limit.unit) == (2, UNIT.MINUTE)
    assert window_left(MINUTE_MS)(responses[0].statuses[0])
    # The configured limit keeps a counter of its own.
    plain = await envoy.call("messaging", number)
    assert (plain.overall_code, plain.statuses[0].limit_remaining) == (OK, 99)
    # An override without a unit is refused.
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await envoy.call("messaging", descriptor(number, limit=(2, UNIT.UNKNOWN)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_unknown_descriptor_and_domain_and_empty_domain(envoy: Envoy) -> None:
    for domain, entries in (("messaging", [("nope", "1")]), ("no-such-domain", [("a", "b")])):
        response = await envoy.call(domain, entries)
        assert response.overall_code == OK
        assert len(response.statuses) == 1
        assert response.statuses[0].code == OK
        assert not response.statuses[0].HasField("current_limit")
    # envoyproxy/ratelimit answers these with a Go error: gRPC UNKNOWN, its message.
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await envoy.call("", [("to_number", "1")])
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == "rate limit domain must not be empty"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await envoy.call("messaging")
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == "rate limit descriptor list must not be empty"


async def test_shardlimit_limits_and_named_rule(envoy: Envoy) -> None:
    # Two limits in one descriptor: the hourly 2 denies the third.
    user = [("user", "u1")]
    responses = [await envoy.call("shop", user) for _ in range(3)]
    assert [(r.overall_code, r.statuses[0].limit_remaining) for r in responses] == [
        (OK, 1),
        (OK, 0),
        (OVER, 0),
    ]
    limit = responses[2].statuses[0].current_limit
    assert (limit.requests_per_unit, limit.unit) == (2, UNIT.HOUR)
    assert window_left(50 * MINUTE_MS)(responses[2].statuses[0])
    # `rule: login` (sliding_log, 3 an hour) under the descriptor's own scope.
    login = [("login_user", "alice")]
    codes = [(await envoy.codes("shop", login))[0] for _ in range(4)]
    assert codes == [OK, OK, OK, OVER]
    usage = await envoy.cluster.usage(limit_key("shop", login), "login")
    assert usage["limits"][0]["remaining"] == 3  # the HTTP rule's own counter is untouched


async def test_config_hot_reload_and_bad_file_kept(envoy: Envoy) -> None:
    number = [("to_number", "42")]
    assert (await envoy.call("messaging", number)).statuses[0].limit_remaining == 99
    envoy.config.write_text(MESSAGING.replace("requests_per_unit: 100", "requests_per_unit: 7"))

    async def reloaded() -> bool:
        response = await envoy.call("messaging", descriptor(number, hits=0))
        return bool(response.statuses[0].current_limit.requests_per_unit == 7)

    await eventually(reloaded)
    # Counter identity is the window, not the count: the one hit is still there.
    assert (await envoy.call("messaging", number)).statuses[0].limit_remaining == 5
    listener = envoy.cluster.runners[-1].app[ENVOY]
    errors = listener.config.reload_errors
    envoy.config.write_text("domain: messaging\ndescriptors:\n  - value: no-key\n")

    async def rejected() -> bool:
        return bool(listener.config.reload_errors == errors + 1)

    await eventually(rejected)
    response = await envoy.call("messaging", number)
    assert (
        response.statuses[0].current_limit.requests_per_unit,
        response.statuses[0].limit_remaining,
    ) == (7, 4)
    # Bytes that are not UTF-8 are one more rejected file, and reloads go on after it.
    envoy.config.write_bytes(b"domain: messaging\ndescriptors:\n  - key: \xe9\n")

    async def rejected_again() -> bool:
        return bool(listener.config.reload_errors == errors + 2)

    await eventually(rejected_again)
    envoy.config.write_text(MESSAGING.replace("requests_per_unit: 100", "requests_per_unit: 9"))

    async def reloaded_again() -> bool:
        response = await envoy.call("messaging", descriptor(number, hits=0))
        return bool(response.statuses[0].current_limit.requests_per_unit == 9)

    await eventually(reloaded_again)


async def test_wildcards_and_share_threshold_readme_example(envoy: Envoy) -> None:
    """README example 11: 5 files/a.pdf + 5 files/b.csv exhaust the shared 10, so
    files/c.txt is over; files_no_share/* values each have their own 10."""
    shared = [(await envoy.codes("example11", [("files", "files/a.pdf")]))[0] for _ in range(5)]
    shared += [(await envoy.codes("example11", [("files", "files/b.csv")]))[0] for _ in range(5)]
    assert shared == [OK] * 10
    assert await envoy.codes("example11", [("files", "files/c.txt")]) == (OVER, [OVER])
    alone = [("files_no_share", "files_no_share/a.pdf")]
    assert [(await envoy.codes("example11", alone))[0] for _ in range(11)] == [OK] * 10 + [OVER]
    other = [("files_no_share", "files_no_share/b.csv")]
    assert await envoy.codes("example11", other) == (OK, [OK])
    # No wildcard match: the key alone is not in the config.
    assert (await envoy.call("example11", [("files", "docs/a.pdf")])).statuses[0].HasField(
        "current_limit"
    ) is False


def test_parse_errors_name_their_paths() -> None:
    bad = """
domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 5}
  - key: b
    value: x
  - key: b
    value: x
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1}
    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]
  - key: e
    bogus: 1
"""
    with pytest.raises(ValidationError) as caught:
        parse_text(bad)
    assert [(e.path, e.message) for e in caught.value.errors] == [
        ("documents[0].descriptors[4].bogus", "config error, unknown key 'bogus'"),
    ]
    with pytest.raises(ValidationError) as caught:
        parse_text(bad.replace("    bogus: 1\n", ""))
    assert [(e.path, e.message) for e in caught.value.errors] == [
        ("d.descriptors[0].rate_limit.unit", "invalid rate limit unit 'fortnight'"),
        ("d.descriptors[2]", "duplicate descriptor composite key 'd.b_x'"),
        ("d.descriptors[3]", "give one of rate_limit, limits or rule"),
    ]
    shipped = parse_text(
        (Path(__file__).resolve().parents[2] / "configs/ratelimit.yaml").read_text()
    )
    assert sorted(shipped) == ["api", "messaging", "mongo_cps"]


def test_router_config_settings(tmp_path: Path) -> None:
    doc = {"router": {"grpc_port": 8081, "envoy_config": "ratelimit.yaml"}, "cluster": {}}
    config = parse_config(doc, tmp_path)
    assert (config.grpc_port, config.envoy_config) == (8081, tmp_path / "ratelimit.yaml")
    assert parse_config({"router": {}, "cluster": {}}, tmp_path).grpc_port is None
    with pytest.raises(ValidationError) as caught:
        parse_config({"router": {"grpc_port": "x"}, "cluster": {}}, tmp_path)
    assert str(caught.value) == "router.grpc_port: must be a TCP port number"


@pytest.fixture
async def fast_envoy(redis_servers: list[RedisProcess], tmp_path: Path) -> AsyncIterator[Envoy]:
    started = await start_envoy(redis_servers, tmp_path, ENVOY_YAML, 1000)
    try:
        yield started
    finally:
        await stop_envoy(started)


def owned_by(envoy: Envoy, node: str, make: Callable[[int], Entries]) -> Entries:
    for i in range(10_000):
        entries = make(i)
        if envoy.cluster.router.view.owner(limit_key("shop", entries)) == node:
            return entries
    raise AssertionError(f"no key on {node}")


async def test_node_down_applies_on_failure(fast_envoy: Envoy) -> None:
    envoy = fast_envoy
    metrics = envoy.cluster.router.metrics
    allow = owned_by(envoy, "n2", lambda i: [("plain_user", f"p{i}")])
    deny = owned_by(envoy, "n2", lambda i: [("quota_user", f"q{i}")])
    healthy = owned_by(envoy, "n1", lambda i: [("quota_user", f"h{i}")])
    await envoy.cluster.runners[1].cleanup()  # node n2's HTTP server
    decisions = "shardlimit_decisions_total"
    before = [metrics.count(decisions, outcome=o) for o in ("degraded_allowed", "degraded_denied")]
    response = await envoy.call("shop", allow, deny, healthy)
    assert response.overall_code == OVER
    assert [s.code for s in response.statuses] == [OK, OVER, OK]
    assert [s.limit_remaining for s in response.statuses] == [0, 0, 49]
    assert not response.statuses[0].HasField("duration_until_reset")
    after = [metrics.count(decisions, outcome=o) for o in ("degraded_allowed", "degraded_denied")]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]
    assert metrics.count("shardlimit_degraded_decisions_total") == 2


def test_up_grpc_port_on_first_router(tmp_path: Path) -> None:
    """`shardlimit up --grpc-port` (real processes): the first router serves gRPC from
    --envoy-config; a second router does not take the port."""
    data_dir = tmp_path / "up"
    envoy_file = tmp_path / "ratelimit.yaml"
    envoy_file.write_text(MESSAGING)
    port, grpc_port = free_port(), free_port()
    base = consecutive_free_ports(2)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            "up",
            "--json",
            "--nodes",
            "2",
            "--routers",
            "2",
            "--port",
            str(port),
            "--base-port",
            str(base),
            "--data-dir",
            str(data_dir),
            "--grpc-port",
            str(grpc_port),
            "--envoy-config",
            str(envoy_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read().decode() if proc.stderr else ""
        assert len(json.loads(line)["routers"]) == 2
        request = rls_pb2.RateLimitRequest(
            domain="messaging", descriptors=[descriptor([("to_number", "1")])], hits_addend=99
        )
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            first = stub.ShouldRateLimit(request, timeout=10)
            second = stub.ShouldRateLimit(request, timeout=10)
        assert [(r.overall_code, r.statuses[0].limit_remaining) for r in (first, second)] == [
            (OK, 1),
            (OVER, 0),  # counted, as upstream: 198 of 100
        ]
        first_config = yaml.safe_load((data_dir / "cluster.yaml").read_text())["router"]
        second_config = yaml.safe_load((data_dir / "cluster-2.yaml").read_text())["router"]
        assert (first_config["grpc_port"], first_config["envoy_config"]) == (
            grpc_port,
            str(envoy_file),
        )
        assert "grpc_port" not in second_config
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", grpc_port)) != 0
