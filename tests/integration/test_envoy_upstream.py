"""envoyproxy/ratelimit's own cases against shardlimit's Envoy service (router/envoy/servicer.py):
the whole-second reset (its CalculateReset), counted over-limit hits and hits_addend
arithmetic (test/redis/fixed_cache_impl_test.go), quota_mode and the token-quota pattern
(integration-test/scripts/quota.sh, token-quota.sh), response headers and overrides
(test/service/ratelimit_test.go, test/config/config_test.go), per-descriptor stats,
its environment settings, TLS and gRPC health."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
import trustme
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from cluster.local.redis_proc import RedisProcess, free_port
from cluster.model.nodes import NodeSpec
from router.app import ENVOY
from router.app import create_app as create_router_app
from router.config import RouterConfig
from router.envoy.descriptors import match
from router.envoy.server import GrpcServer
from router.envoy.settings import EnvoySettings
from router.errors import SettingsError
from tests.conftest import ADMIN, CLUSTER, PINNED_MS, eventually
from tests.integration.test_envoy import (
    MESSAGING,
    OK,
    OVER,
    UNIT,
    Envoy,
    descriptor,
    start_envoy,
    stop_envoy,
)

pytestmark = pytest.mark.timeout(60)

# envoyproxy/ratelimit's examples/ratelimit/config/example.yaml, its quota_mode entries
# (verbatim), and limits for the arithmetic cases.
UPSTREAM = """
domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      service_with_quota:
        name: "service_2"
  - key: hourly
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: minutely
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: shady
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: banned
    rate_limit:
      unit: minute
      requests_per_unit: 0
"""
CONFIG = "\n---\n".join([MESSAGING, UPSTREAM])
HOUR_MS = 3_600_000


async def pin_clock(envoy: Envoy, instant_ms: int) -> int:
    """Every node's clock at `instant_ms`; the offset from Redis' clock."""
    offset = instant_ms - await envoy.cluster.redis_now_ms()
    for url in envoy.cluster.node_urls.values():
        async with envoy.cluster.http.post(
            url + "/node/v1/test/clock",
            json={"offset_ms": offset},
            headers={"Authorization": f"Bearer {CLUSTER}"},
        ) as resp:
            assert resp.status == 200
    return offset


def upstream_reset(window_s: int, first_ms: int, last_ms: int) -> set[int]:
    """CalculateReset (`unit - now % unit`, Unix seconds) for any instant in between."""
    return {window_s - s % window_s for s in range(first_ms // 1000, last_ms // 1000 + 1)}


@pytest.fixture
async def upstream(
    redis_servers: list[RedisProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Envoy]:
    monkeypatch.setenv("LIMIT_RESPONSE_HEADERS_ENABLED", "true")
    started = await start_envoy(redis_servers, tmp_path, CONFIG, 2000)
    try:
        yield started
    finally:
        await stop_envoy(started)


async def read(envoy: Envoy, entries: list[tuple[str, str]], hits: int) -> Any:
    return (await envoy.call("rl", descriptor(entries, hits=hits))).statuses[0]


async def test_reset_in_whole_seconds_even_for_an_unused_counter(upstream: Envoy) -> None:
    """Differences 1 and 2: duration_until_reset is CalculateReset's whole seconds to
    the window's end, also for hits_addend 0 on a fresh key and for a first hit larger
    than the limit (11 against 10 an hour)."""
    offset = await pin_clock(upstream, PINNED_MS + 400)  # 10:10:00.400
    cases = [([("hourly", "fresh")], 0), ([("hourly", "big")], 11), ([("hourly", "one")], 1)]
    for entries, hits in cases:
        first = await upstream.cluster.redis_now_ms() + offset
        status = await read(upstream, entries, hits)
        last = await upstream.cluster.redis_now_ms() + offset
        assert status.duration_until_reset.nanos == 0
        assert status.duration_until_reset.seconds in upstream_reset(3600, first, last)
    big = await read(upstream, [("hourly", "big")], 0)
    assert (big.code, big.limit_remaining) == (OVER, 0)  # the 11 were counted


async def test_over_limit_hits_are_counted(upstream: Envoy) -> None:
    """Difference 4 (fixed_cache_impl_test.go TestNearLimit): 12 hits on 10 a minute;
    the over-limit ones count, so a read afterwards is over, with 0 remaining."""
    await pin_clock(upstream, PINNED_MS + 3 * 60_000)
    user = [("minutely", "u1")]
    answers = [await read(upstream, user, 1) for _ in range(12)]
    assert [(s.code, s.limit_remaining) for s in answers] == [
        *[(OK, left) for left in range(9, -1, -1)],
        (OVER, 0),
        (OVER, 0),
    ]
    assert (await read(upstream, user, 0)).code == OVER
    # By default the request's other descriptors count even when one is over.
    banned = await upstream.call("rl", descriptor([("minutely", "u3")], hits=4), [("banned", "b")])
    assert [(s.code, s.limit_remaining) for s in banned.statuses] == [(OK, 6), (OVER, 0)]
    assert banned.overall_code == OVER
    # Several hits at once: 7 on 3 used of 10 is over by 0 (OK, 0 left) ...
    other = [("minutely", "u2")]
    assert (await read(upstream, other, 3)).limit_remaining == 7
    assert [(s.code, s.limit_remaining) for s in [await read(upstream, other, 7)]] == [(OK, 0)]
    # ... and 1 more is over; the stats count as upstream's (near: hits past 80%).
    assert (await read(upstream, other, 1)).code == OVER
    count = upstream.cluster.router.metrics.count

    def stat(name: str) -> float:
        return count(f"ratelimit_service_rate_limit_{name}_total", domain="rl", key="minutely")

    assert [stat(n) for n in ("total_hits", "within_limit", "near_limit", "over_limit")] == [
        12 + 0 + 4 + 3 + 7 + 1,
        10 + 0 + 4 + 3 + 7,
        2 + 2,
        2 + 1,
    ]


async def test_token_quota_pattern(upstream: Envoy) -> None:
    """Difference 4, integration-test/scripts/token-quota.sh: check with hits_addend 0,
    debit 1 when the stream ends; service_2 has 2 a minute, so the 4th request is the
    first rejected (the third debit goes over the limit and is counted)."""
    await pin_clock(upstream, PINNED_MS + 4 * 60_000)
    service = [("service", "service_2")]
    codes = []
    for _ in range(5):
        check = await upstream.call("rl", descriptor(service, hits=0))
        codes.append(check.overall_code)
        if check.overall_code == OK:
            await upstream.call("rl", descriptor(service, hits=1))
    assert codes == [OK, OK, OK, OVER, OVER]


async def test_quota_mode(upstream: Envoy) -> None:
    """Difference 5, integration-test/scripts/quota.sh: (service_1: 1/min), (service_2:
    2/min), both quota_mode: OVER_LIMIT only once every quota descriptor is over."""
    await pin_clock(upstream, PINNED_MS + 5 * 60_000)
    both = ([("service", "service_1")], [("service", "service_2")])
    answers = [await upstream.call("rl", *both) for _ in range(3)]
    assert [(r.overall_code, [s.code for s in r.statuses]) for r in answers] == [
        (OK, [OK, OK]),
        (OK, [OVER, OK]),
        (OVER, [OVER, OVER]),
    ]
    # A plain descriptor over its limit makes the answer OVER_LIMIT whatever the quotas.
    mixed = await upstream.call("rl", [("service", "service_2")], [("minutely", "m")])
    assert mixed.overall_code == OVER  # service_2 over (quota), and it is the only quota


async def test_response_headers(upstream: Envoy) -> None:
    """Difference 6 (LIMIT_RESPONSE_HEADERS_ENABLED): the descriptor closest to its
    limit, or the over-limit one, in RateLimit-Limit/-Remaining/-Reset."""
    marketing = [("message_type", "marketing"), ("to_number", "206")]
    number = [("to_number", "206")]
    first = await upstream.call("messaging", marketing, number)
    headers = [(h.key, h.value) for h in first.response_headers_to_add]
    reset = first.statuses[0].duration_until_reset.seconds
    assert headers == [
        ("RateLimit-Limit", "5"),
        ("RateLimit-Remaining", "4"),
        ("RateLimit-Reset", str(reset)),
    ]
    for _ in range(5):
        last = await upstream.call("messaging", number, marketing)
    assert [s.code for s in last.statuses] == [OK, OVER]
    assert [(h.key, h.value) for h in last.response_headers_to_add][:2] == [
        ("RateLimit-Limit", "5"),
        ("RateLimit-Remaining", "0"),
    ]
    # No limit matched: no headers.
    none = await upstream.call("messaging", [("nothing", "x")])
    assert list(none.response_headers_to_add) == []


async def test_header_names_and_other_settings(
    redis_servers: list[RedisProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LIMIT_*_HEADER rename the headers; SHADOW_MODE answers OK; QUOTA_MODE makes every
    descriptor a quota; NEAR_LIMIT_RATIO moves near_limit."""
    monkeypatch.setenv("LIMIT_RESPONSE_HEADERS_ENABLED", "1")
    monkeypatch.setenv("LIMIT_LIMIT_HEADER", "X-Limit")
    monkeypatch.setenv("LIMIT_REMAINING_HEADER", "X-Left")
    monkeypatch.setenv("LIMIT_RESET_HEADER", "X-Reset")
    monkeypatch.setenv("SHADOW_MODE", "true")
    monkeypatch.setenv("NEAR_LIMIT_RATIO", "0.5")
    envoy = await start_envoy(redis_servers, tmp_path, CONFIG, 2000)
    try:
        await pin_clock(envoy, PINNED_MS + 6 * 60_000)
        answers = [await envoy.call("rl", [("minutely", "g")]) for _ in range(11)]
        assert [r.overall_code for r in answers] == [OK] * 11  # the 11th over, shadowed
        assert answers[-1].statuses[0].code == OVER
        assert [h.key for h in answers[0].response_headers_to_add] == [
            "X-Limit",
            "X-Left",
            "X-Reset",
        ]
        metrics = envoy.cluster.router.metrics
        assert metrics.count("ratelimit_service_global_shadow_mode_total") == 1
        near = "ratelimit_service_rate_limit_near_limit_total"
        assert metrics.count(near, domain="rl", key="minutely") == 5  # hits 6..10 of 10
    finally:
        await stop_envoy(envoy)


async def test_limit_override_keeps_the_descriptor_counter(upstream: Envoy) -> None:
    """Difference 7: an override with the configured unit counts on the same counter:
    3 hits on 10 a minute, then a 20/MINUTE override leaves 16."""
    await pin_clock(upstream, PINNED_MS + 7 * 60_000)
    user = [("minutely", "o1")]
    assert [(await read(upstream, user, 1)).limit_remaining for _ in range(3)] == [9, 8, 7]
    override = await upstream.call("rl", descriptor(user, limit=(20, UNIT.MINUTE)))
    status = override.statuses[0]
    assert (status.code, status.limit_remaining) == (OK, 16)
    assert (status.current_limit.requests_per_unit, status.current_limit.unit) == (
        20,
        UNIT.MINUTE,
    )
    # An override for entries the config does not know counts too (the domain is known).
    unknown = [("nope", "n")]
    first = await upstream.call("rl", descriptor(unknown, limit=(1, UNIT.MINUTE)))
    again = await upstream.call("rl", descriptor(unknown, limit=(1, UNIT.MINUTE)))
    assert [first.overall_code, again.overall_code] == [OK, OVER]


async def test_shadow_mode_stats(upstream: Envoy) -> None:
    await pin_clock(upstream, PINNED_MS + 8 * 60_000)
    answers = [await upstream.call("rl", [("shady", "s")]) for _ in range(3)]
    assert [(r.overall_code, r.statuses[0].code) for r in answers] == [(OK, OK)] * 3
    count = upstream.cluster.router.metrics.count
    assert count("ratelimit_service_rate_limit_shadow_mode_total", domain="rl", key="shady") == 2
    assert count("ratelimit_service_rate_limit_over_limit_total", domain="rl", key="shady") == 2
    text = upstream.cluster.router.metrics.render().decode()
    assert 'ratelimit_service_rate_limit_total_hits_total{domain="rl",key="shady"} 3.0' in text


async def test_stop_cache_key_increment_when_overlimit(
    redis_servers: list[RedisProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true: shardlimit's exact fixed window, a
    denied hit consumes nothing and the true remaining is shown."""
    monkeypatch.setenv("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")
    envoy = await start_envoy(redis_servers, tmp_path, CONFIG, 2000)
    try:
        number = [("to_number", "555")]
        first = await envoy.call("messaging", number, hits_addend=98)
        assert (first.overall_code, first.statuses[0].limit_remaining) == (OK, 2)
        over = await envoy.call("messaging", number, hits_addend=3)
        assert (over.overall_code, over.statuses[0].limit_remaining) == (OVER, 2)
        two = await envoy.call("messaging", number, hits_addend=2)
        assert (two.overall_code, two.statuses[0].limit_remaining) == (OK, 0)
        # The duration is still whole seconds to the window's end.
        assert over.statuses[0].duration_until_reset.nanos == 0
        assert over.statuses[0].duration_until_reset.seconds > 0
        # As upstream's TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig: one
        # descriptor over keeps the request's others from being counted (they answer OK).
        await pin_clock(envoy, PINNED_MS + 9 * 60_000)
        minute, hour = [("minutely", "s1")], [("hourly", "s1")]
        both = await envoy.call("rl", descriptor(minute, hits=3), descriptor(hour, hits=11))
        assert [(s.code, s.limit_remaining) for s in both.statuses] == [(OK, 10), (OVER, 10)]
        assert both.overall_code == OVER
        assert (await read(envoy, minute, 0)).limit_remaining == 10
        banned = await envoy.call("rl", descriptor(minute, hits=4), [("banned", "b")])
        assert [(s.code, s.limit_remaining) for s in banned.statuses] == [(OK, 10), (OVER, 0)]
        assert (await read(envoy, minute, 0)).limit_remaining == 10
        fits = await envoy.call("rl", descriptor(minute, hits=4), descriptor(hour, hits=2))
        assert [(s.code, s.limit_remaining) for s in fits.statuses] == [(OK, 6), (OK, 8)]
    finally:
        await stop_envoy(envoy)


async def test_a_request_over_one_descriptor_holds_none_of_its_others(
    redis_servers: list[RedisProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true, two descriptors on two nodes, one of
    them over: 40 such requests at once with 15 of the other descriptor alone. The 40
    are read first and hold nothing, so the 15 are decided by their own limit alone:
    exactly 10 admitted, and the limit used by exactly them."""
    monkeypatch.setenv("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")
    envoy = await start_envoy(redis_servers, tmp_path, CONFIG, 2000)
    try:
        await pin_clock(envoy, PINNED_MS + 9 * 60_000)
        domains = envoy.cluster.runners[-1].app[ENVOY].config.domains
        owner = envoy.cluster.router.view.owner

        def node_of(entries: list[tuple[str, str]]) -> str:
            found = match(domains, "rl", entries)
            assert found is not None
            return owner(found.key)

        value = next(
            v
            for v in (f"apart{i}" for i in range(200))
            if node_of([("minutely", v)]) != node_of([("hourly", v)])
        )
        minute, hour = [("minutely", value)], [("hourly", value)]
        assert (await envoy.call("rl", descriptor(hour, hits=10))).overall_code == OK
        doomed = [
            envoy.call("rl", descriptor(minute, hits=1), descriptor(hour, hits=1))
            for _ in range(40)
        ]
        alone = [envoy.call("rl", descriptor(minute, hits=1)) for _ in range(15)]
        answers = await asyncio.gather(*doomed, *alone)
        assert [a.overall_code for a in answers[:40]] == [OVER] * 40
        assert sorted(a.overall_code for a in answers[40:]) == sorted([OK] * 10 + [OVER] * 5)
        assert (await read(envoy, minute, 0)).limit_remaining == 0
    finally:
        await stop_envoy(envoy)


def test_bad_setting_stops_the_router(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEAR_LIMIT_RATIO", "lots")
    node = NodeSpec("n1", "http://127.0.0.1:1")  # never called: the app is not started
    config = RouterConfig(data_dir=tmp_path, grpc_port=free_port(), nodes=[node])
    with pytest.raises(SettingsError) as caught:
        create_router_app(config, ADMIN, CLUSTER)
    assert str(caught.value) == (
        "envoy settings rejected: NEAR_LIMIT_RATIO: must be a number, not 'lots'"
    )
    monkeypatch.setenv("NEAR_LIMIT_RATIO", "0.5")
    monkeypatch.setenv("SHADOW_MODE", "maybe")
    with pytest.raises(SettingsError) as caught:
        create_router_app(config, ADMIN, CLUSTER)
    assert (
        str(caught.value)
        == "envoy settings rejected: SHADOW_MODE: must be true or false, not 'maybe'"
    )


async def test_refused_config_keeps_the_previous(upstream: Envoy) -> None:
    """Difference 3 at run time: a file upstream refuses (replaces naming its own
    descriptor, unlimited with a unit) is refused whole; the previous one serves. So is
    a file emptied or removed once it served descriptors (which lifted every limit)."""
    listener = upstream.cluster.runners[-1].app[ENVOY]
    for bad in (
        "",
        "# nothing here\n---\n",
        None,  # the file removed
        CONFIG.replace(
            "      requests_per_unit: 10\n",
            "      requests_per_unit: 10\n"
            "      name: self\n      replaces:\n        - name: self\n",
            1,
        ),
        CONFIG + "\n---\ndomain: other\ndescriptors:\n  - key: foo\n    rate_limit:\n"
        "      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
    ):
        errors = listener.config.reload_errors
        if bad is None:
            upstream.config.unlink()
        else:
            upstream.config.write_text(bad)

        async def rejected(errors: int = errors) -> bool:
            return bool(listener.config.reload_errors == errors + 1)

        await eventually(rejected)
        status = await read(upstream, [("hourly", "kept")], 0)
        assert status.current_limit.requests_per_unit == 10
        assert "other" not in listener.config.domains
    reloads = listener.config.reloads
    upstream.config.write_text(CONFIG.replace("requests_per_unit: 10\n", "requests_per_unit: 12\n"))

    async def reloaded() -> bool:
        return bool(listener.config.reloads == reloads + 1)

    await eventually(reloaded)
    assert (await read(upstream, [("hourly", "kept")], 0)).current_limit.requests_per_unit == 12
    text = upstream.cluster.router.metrics.render().decode()
    assert 'shardlimit_envoy_config_reloads_total{result="ok"} 2.0' in text  # start, last edit
    assert 'shardlimit_envoy_config_reloads_total{result="error"} 5.0' in text


async def test_health_and_tls(
    redis_servers: list[RedisProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gRPC over TLS with client certificates (GRPC_SERVER_TLS_CERT/KEY,
    GRPC_CLIENT_TLS_CACERT), and grpc.health.v1.Health on the same port."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("envoy-client")
    paths = {}
    for name, blob in (
        ("cert", server.cert_chain_pems[0].bytes()),
        ("key", server.private_key_pem.bytes()),
        ("ca", ca.cert_pem.bytes()),
    ):
        paths[name] = tmp_path / f"{name}.pem"
        paths[name].write_bytes(blob)
    monkeypatch.setenv("GRPC_SERVER_TLS_CERT", str(paths["cert"]))
    monkeypatch.setenv("GRPC_SERVER_TLS_KEY", str(paths["key"]))
    monkeypatch.setenv("GRPC_CLIENT_TLS_CACERT", str(paths["ca"]))
    envoy = await start_envoy(redis_servers, tmp_path, CONFIG, 2000)
    port = envoy.cluster.runners[-1].app[ENVOY].port
    request = rls_pb2.RateLimitRequest(domain="rl", descriptors=[descriptor([("hourly", "t")])])
    try:
        with_cert = grpc.ssl_channel_credentials(
            root_certificates=ca.cert_pem.bytes(),
            private_key=client.private_key_pem.bytes(),
            certificate_chain=client.cert_chain_pems[0].bytes(),
        )
        async with grpc.aio.secure_channel(f"localhost:{port}", with_cert) as channel:
            answer = await rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(
                request, timeout=10
            )
            assert (answer.overall_code, answer.statuses[0].limit_remaining) == (OK, 9)
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stranger = trustme.CA().issue_cert("envoy-client")  # another CA's certificate
        for refused in (
            grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes()),
            grpc.ssl_channel_credentials(
                root_certificates=ca.cert_pem.bytes(),
                private_key=stranger.private_key_pem.bytes(),
                certificate_chain=stranger.cert_chain_pems[0].bytes(),
            ),
        ):
            async with grpc.aio.secure_channel(f"localhost:{port}", refused) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(
                        request, timeout=10
                    )
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(
                    request, timeout=10
                )
    finally:
        await stop_envoy(envoy)


async def test_global_quota_mode_and_local_cache(
    redis_servers: list[RedisProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """QUOTA_MODE: every descriptor is a quota (OVER_LIMIT only when all are over);
    LOCAL_CACHE_SIZE_IN_BYTES > 0: an over-limit key is answered by the router (no
    node asked, nothing counted) until its window ends."""
    monkeypatch.setenv("QUOTA_MODE", "true")
    monkeypatch.setenv("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")
    envoy = await start_envoy(redis_servers, tmp_path, CONFIG, 2000)
    try:
        await pin_clock(envoy, PINNED_MS + 10 * 60_000)
        minute, hour = [("minutely", "q")], [("hourly", "q")]
        first = await envoy.call("rl", descriptor(minute, hits=11), hour)
        assert [s.code for s in first.statuses] == [OVER, OK]
        assert first.overall_code == OK  # one quota of two is over
        both = await envoy.call("rl", minute, descriptor(hour, hits=10))
        assert [s.code for s in both.statuses] == [OVER, OVER]
        assert both.overall_code == OVER
        metrics = envoy.cluster.router.metrics
        assert metrics.count("shardlimit_denial_cache_hits_total") == 0
        # Used up (11 of 10) at the second denial: the third is the router's.
        third = await envoy.call("rl", minute)
        assert (third.overall_code, third.statuses[0].limit_remaining) == (OVER, 0)
        assert metrics.count("shardlimit_denial_cache_hits_total") == 1
        hits = "ratelimit_service_rate_limit_total_hits_total"
        assert metrics.count(hits, domain="rl", key="minutely") == 13
    finally:
        await stop_envoy(envoy)


def test_tls_from_the_router_settings(tmp_path: Path) -> None:
    """The router's own tls_cert / tls_key turn TLS on for the gRPC port too; half a
    pair, or a client CA without a certificate, stops the router with one line."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(server.cert_chain_pems[0].bytes())
    key.write_bytes(server.private_key_pem.bytes())
    config = RouterConfig(data_dir=tmp_path, tls_cert=cert, tls_key=key)
    grpc_server = GrpcServer(config, EnvoySettings(), None)
    assert grpc_server.credentials() is not None
    assert grpc_server.describe() == " (TLS)"
    plain = GrpcServer(RouterConfig(data_dir=tmp_path), EnvoySettings(), None)
    assert (plain.credentials(), plain.describe()) == (None, " (plaintext)")
    half = GrpcServer(RouterConfig(data_dir=tmp_path, tls_cert=cert), EnvoySettings(), None)
    with pytest.raises(SettingsError) as caught:
        half.credentials()
    assert str(caught.value) == "envoy gRPC TLS: give both a certificate and its key"
    no_cert = GrpcServer(RouterConfig(data_dir=tmp_path), EnvoySettings(client_ca=cert), None)
    with pytest.raises(SettingsError) as caught:
        no_cert.credentials()
    assert str(caught.value) == "envoy gRPC TLS: GRPC_CLIENT_TLS_CACERT needs a certificate"


async def test_healthy_with_at_least_one_config_loaded(
    redis_servers: list[RedisProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: "ratelimit" is NOT_SERVING while the
    descriptors file holds no domain, SERVING once one is loaded; "" is SERVING."""
    monkeypatch.setenv("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")
    envoy = await start_envoy(redis_servers, tmp_path, "# no domain yet\n", 2000)
    health = health_pb2_grpc.HealthStub(envoy.channel)

    async def status(service: str) -> int:
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        return int(reply.status)

    try:
        serving, not_serving = (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        assert [await status(s) for s in ("", "ratelimit")] == [serving, not_serving]
        envoy.config.write_text(CONFIG)

        async def loaded() -> bool:
            return bool(await status("ratelimit") == serving)

        await eventually(loaded)
    finally:
        await stop_envoy(envoy)


# test/integration/runtime/current/ratelimit/config/{basic,another}.yaml, verbatim.
INTEGRATION = """
domain: basic
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50

  - key: key1_local
    rate_limit:
      unit: second
      requests_per_unit: 50

  - key: one_per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
---
domain: another
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20

  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 10

  - key: key2_local
    rate_limit:
      unit: minute
      requests_per_unit: 20

  - key: key3_local
    rate_limit:
      unit: hour
      requests_per_unit: 10

  - key: key4
    rate_limit:
      unit: day
      requests_per_unit: 20

  - key: key4_local
    rate_limit:
      unit: day
      requests_per_unit: 20
"""


@pytest.mark.parametrize("mode", ["default", "stop", "local_cache"])
async def test_integration_basic_base_config(
    mode: str, redis_servers: list[RedisProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """test/integration/integration_test.go testBasicBaseConfig, with its settings:
    plain, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, LOCAL_CACHE_SIZE_IN_BYTES (and its
    `_local` keys)."""
    if mode == "stop":
        monkeypatch.setenv("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")
    if mode == "local_cache":
        monkeypatch.setenv("LOCAL_CACHE_SIZE_IN_BYTES", "1000000")
    local = "_local" if mode == "local_cache" else ""
    envoy = await start_envoy(redis_servers, tmp_path, INTEGRATION, 2000)
    stats = envoy.cluster.router.metrics.count

    def stat(domain: str, key: str, name: str) -> int:
        return int(stats(f"ratelimit_service_rate_limit_{name}_total", domain=domain, key=key))

    def shown(status: Any) -> tuple[int, int, int, int]:
        limit = status.current_limit
        return status.code, limit.requests_per_unit, limit.unit, status.limit_remaining

    try:
        await pin_clock(envoy, PINNED_MS + 11 * 60_000)
        nothing = await envoy.call("foo", [(f"hello{local}", "world")])
        assert (nothing.overall_code, [s.code for s in nothing.statuses]) == (OK, [OK])
        assert not nothing.statuses[0].HasField("current_limit")
        first = await envoy.call("basic", [(f"key1{local}", "foo")])
        assert shown(first.statuses[0]) == (OK, 50, UNIT.SECOND, 49)
        assert stat("basic", f"key1{local}", "total_hits") == 1
        # Over a minute limit on one key: every hit counts in total_hits.
        for i in range(25):
            response = await envoy.call("another", [(f"key2{local}", "r1")])
            code, left = (OVER, 0) if i >= 20 else (OK, 20 - (i + 1))
            assert response.overall_code == code
            assert shown(response.statuses[0]) == (code, 20, UNIT.MINUTE, left)
            assert stat("another", f"key2{local}", "total_hits") == i + 1
            assert stat("another", f"key2{local}", "over_limit") == max(0, i - 19)
            cached = max(0, i - 20) if local else 0
            assert stat("another", f"key2{local}", "over_limit_with_local_cache") == cached
        # Two keys of a domain in one request; key3 (10 an hour) goes over at the 11th.
        for i in range(15):
            response = await envoy.call(
                "another", [(f"key2{local}", "r2")], [(f"key3{local}", "r2")]
            )
            code, left1, left2 = OK, 20 - (i + 1), 10 - (i + 1)
            if i >= 10:
                code, left2 = OVER, 0
                if mode == "stop":
                    left1 = 10  # key2 no longer counted while key3 is over
            assert response.overall_code == code
            assert [shown(s) for s in response.statuses] == [
                (OK, 20, UNIT.MINUTE, left1),
                (code, 10, UNIT.HOUR, left2),
            ]
            assert stat("another", f"key2{local}", "total_hits") == i + 26
            assert stat("another", f"key2{local}", "over_limit") == 5
            assert stat("another", f"key3{local}", "total_hits") == i + 1
            assert stat("another", f"key3{local}", "over_limit") == max(0, i - 9)
            cached = max(0, i - 10) if local else 0
            assert stat("another", f"key3{local}", "over_limit_with_local_cache") == cached
        if mode == "local_cache":
            # key2's 22nd..25th hits and key3's 12th..15th: answered by the router.
            assert int(stats("shardlimit_denial_cache_hits_total")) == 4 + 4
        # duration_until_reset ticks down: the same key 2 s later (the pinned clock runs
        # on from each pin: pinned again right before each reading).
        await pin_clock(envoy, PINNED_MS + 11 * 60_000 + 1000)
        first_reset = (await envoy.call("another", [(f"key4{local}", "durTest")])).statuses[0]
        await pin_clock(envoy, PINNED_MS + 11 * 60_000 + 3000)
        later = (await envoy.call("another", [(f"key4{local}", "durTest")])).statuses[0]
        assert later.duration_until_reset.seconds < first_reset.duration_until_reset.seconds
        assert later.limit_remaining == 18
    finally:
        await stop_envoy(envoy)


NEAR = """
domain: near
descriptors:
  - {key: k15, rate_limit: {unit: hour, requests_per_unit: 15}}
  - {key: k20, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: k8, rate_limit: {unit: minute, requests_per_unit: 8}}
  - {key: k10, rate_limit: {unit: minute, requests_per_unit: 10}}
"""
# test/redis/fixed_cache_impl_test.go TestNearLimit: (key, counter before, hits_addend)
# -> (code, limit_remaining, (over_limit, near_limit, within_limit) added by the hits).
# Its per-second limits are per-minute here (the same arithmetic, a steadier window).
NEAR_CASES = [
    ("k15", 10, 1, OK, 4, (0, 0, 1)),
    ("k15", 12, 1, OK, 2, (0, 1, 1)),
    ("k15", 15, 1, OVER, 0, (1, 0, 0)),
    ("k20", 2, 3, OK, 15, (0, 0, 3)),
    ("k8", 5, 2, OK, 1, (0, 1, 2)),
    ("k20", 16, 3, OK, 1, (0, 3, 3)),
    ("k20", 19, 3, OVER, 0, (2, 1, 0)),
    ("k20", 15, 7, OVER, 0, (2, 4, 0)),
    ("k10", 27, 3, OVER, 0, (3, 0, 0)),
]


@pytest.mark.parametrize(("key", "before", "hits", "code", "left", "added"), NEAR_CASES)
async def test_near_limit_arithmetic(
    key: str,
    before: int,
    hits: int,
    code: int,
    left: int,
    added: tuple[int, int, int],
    redis_servers: list[RedisProcess],
    tmp_path: Path,
) -> None:
    envoy = await start_envoy(redis_servers, tmp_path, NEAR, 2000)
    try:
        await pin_clock(envoy, PINNED_MS + 12 * 60_000)
        entries = [(key, "v")]
        if before:
            await envoy.call("near", descriptor(entries, hits=before))
        count = envoy.cluster.router.metrics.count
        names = ("over_limit", "near_limit", "within_limit")

        def stats() -> list[float]:
            return [
                count(f"ratelimit_service_rate_limit_{n}_total", domain="near", key=key)
                for n in names
            ]

        start = stats()
        status = (await envoy.call("near", descriptor(entries, hits=hits))).statuses[0]
        assert (status.code, status.limit_remaining) == (code, left)
        assert [b - a for a, b in zip(start, stats(), strict=True)] == list(added)
    finally:
        await stop_envoy(envoy)


async def test_dynamic_metadata_multiservice_token_quota(
    redis_servers: list[RedisProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESPONSE_DYNAMIC_METADATA, integration-test/scripts/multiservice-tokenquota.sh:
    check (service_1), (service_2) with hits_addend 0, route to the service named in
    the passed descriptors' metadata, debit 1 from it: requests 1-2 go to service_1,
    3-5 to service_2, the 6th is rejected."""
    monkeypatch.setenv("RESPONSE_DYNAMIC_METADATA", "true")
    envoy = await start_envoy(redis_servers, tmp_path, CONFIG, 2000)
    try:
        await pin_clock(envoy, PINNED_MS + 13 * 60_000)
        services = [[("service", "service_1")], [("service", "service_2")]]
        served = []
        for _ in range(6):
            check = await envoy.call("rl", *(descriptor(s, hits=0) for s in services))
            if check.overall_code == OVER:
                served.append("rejected")
                continue
            name = check.dynamic_metadata["metadata"]["service_with_quota"]["name"]
            served.append(name)
            await envoy.call("rl", descriptor([("service", name)], hits=1))
        assert served == ["service_1"] * 2 + ["service_2"] * 3 + ["rejected"]
        last = await envoy.call("rl", descriptor(services[1], hits=0), hits_addend=3)
        assert last.dynamic_metadata["domain"] == "rl"
        assert list(last.dynamic_metadata["descriptors"][0]["entries"]) == ["service=service_2"]
        assert last.dynamic_metadata["descriptors"][0]["hitsAddend"] == 0
        assert last.dynamic_metadata["hitsAddend"] == 3
        assert "metadata" not in last.dynamic_metadata  # service_2 is over: nothing passed
    finally:
        await stop_envoy(envoy)


def test_connection_age_settings(tmp_path: Path) -> None:
    """GRPC_MAX_CONNECTION_AGE(_GRACE): Go durations, upstream's defaults (24h, 1h),
    handed to grpcio as its max_connection_age channel arguments."""
    default = GrpcServer(RouterConfig(data_dir=tmp_path), EnvoySettings.from_env({}), None)
    assert default.options() == [
        ("grpc.so_reuseport", 0),
        ("grpc.max_connection_age_ms", 86_400_000),
        ("grpc.max_connection_age_grace_ms", 3_600_000),
    ]
    env = {"GRPC_MAX_CONNECTION_AGE": "1h30m", "GRPC_MAX_CONNECTION_AGE_GRACE": "1.5s"}
    settings = EnvoySettings.from_env(env)
    assert (settings.max_connection_age_ms, settings.max_connection_age_grace_ms) == (
        5_400_000,
        1_500,
    )
    with pytest.raises(SettingsError) as caught:
        EnvoySettings.from_env({"GRPC_MAX_CONNECTION_AGE": "1 day"})
    assert str(caught.value) == (
        "GRPC_MAX_CONNECTION_AGE: must be a duration such as 24h, 90m or 500ms, not '1 day'"
    )
