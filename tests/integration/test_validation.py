"""Bad input gets a 4xx problem+json naming the field; never a 5xx, nothing consumed."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from yarl import URL

from tests.conftest import ADMIN, Cluster, eventually

FW = {"algorithm": "fixed_window", "limit": 5, "window": "1m"}

BAD_CHECKS: list[tuple[str, Any, int, str | None]] = [
    ("non-object body", [1, 2], 400, "body"),
    ("string body", "check", 400, "body"),
    ("missing key", {"rule": "basic"}, 400, "key"),
    ("empty key", {"key": "", "rule": "basic"}, 400, "key"),
    ("numeric key", {"key": 7, "rule": "basic"}, 400, "key"),
    ("negative cost", {"key": "k", "rule": "basic", "cost": -1}, 400, "cost"),
    ("string cost", {"key": "k", "rule": "basic", "cost": "1"}, 400, "cost"),
    ("float cost", {"key": "k", "rule": "basic", "cost": 1.5}, 400, "cost"),
    ("bool cost", {"key": "k", "rule": "basic", "cost": True}, 400, "cost"),
    ("huge cost", {"key": "k", "rule": "basic", "cost": 10**30}, 400, "cost"),
    ("unknown rule", {"key": "k", "rule": "nope"}, 400, "rule"),
    ("no rule", {"key": "k"}, 400, "rule"),
    ("rule and limits", {"key": "k", "rule": "basic", "limits": [FW]}, 400, ""),
    (
        "unknown algorithm",
        {"key": "k", "limits": [{"algorithm": "magic"}]},
        400,
        "limits[0].algorithm",
    ),
    ("empty limits", {"key": "k", "limits": []}, 400, "limits"),
    ("limits not a list", {"key": "k", "limits": FW}, 400, "limits"),
    ("zero window", {"key": "k", "limits": [{**FW, "window": 0}]}, 400, "limits[0].window"),
    ("zero window str", {"key": "k", "limits": [{**FW, "window": "0s"}]}, 400, "limits[0].window"),
    ("bad window", {"key": "k", "limits": [{**FW, "window": "soon"}]}, 400, "limits[0].window"),
    ("zero limit", {"key": "k", "limits": [{**FW, "limit": 0}]}, 400, "limits[0].limit"),
    ("extra limit field", {"key": "k", "limits": [{**FW, "burst": 3}]}, 400, "limits[0].burst"),
    (
        "sliding_log over 10000",
        {"key": "k", "limits": [{"algorithm": "sliding_log", "limit": 10001, "window": "1m"}]},
        400,
        "limits[0].limit",
    ),
    (
        "bad period",
        {"key": "k", "limits": [{"algorithm": "calendar", "period": "fortnight", "max_count": 1}]},
        400,
        "limits[0].period",
    ),
    (
        "bad timezone",
        {
            "key": "k",
            "limits": [
                {"algorithm": "calendar", "period": "day", "timezone": "Mars/Base", "max_count": 1}
            ],
        },
        400,
        "limits[0].timezone",
    ),
    (
        "path timezone",
        {
            "key": "k",
            "limits": [
                {
                    "algorithm": "calendar",
                    "period": "day",
                    "timezone": "../../etc/passwd",
                    "max_count": 1,
                }
            ],
        },
        400,
        "limits[0].timezone",
    ),
    (
        "calendar without maximum",
        {"key": "k", "limits": [{"algorithm": "calendar", "period": "day"}]},
        400,
        "limits[0]",
    ),
    ("absurd amount", {"key": "k", "rule": "payments", "amount": "1e30"}, 400, "amount"),
    ("negative amount", {"key": "k", "rule": "payments", "amount": -5}, 400, "amount"),
    ("amount too precise", {"key": "k", "rule": "payments", "amount": "0.001"}, 400, "amount"),
    ("nan amount", {"key": "k", "rule": "payments", "amount": "NaN"}, 400, "amount"),
    ("text amount", {"key": "k", "rule": "payments", "amount": "ten"}, 400, "amount"),
    ("key over 512 bytes", {"key": "é" * 257, "rule": "basic"}, 400, "key"),
    ("bad request_id", {"key": "k", "rule": "basic", "request_id": "a|b"}, 400, "request_id"),
    ("non-bool dry_run", {"key": "k", "rule": "basic", "dry_run": "yes"}, 400, "dry_run"),
    ("unknown field", {"key": "k", "rule": "basic", "costs": 2}, 400, "costs"),
    (
        "duplicate shapes",
        {"key": "k", "limits": [FW, {**FW, "limit": 9}]},
        400,
        "limits[1]",
    ),
    (
        "object on_failure",
        {"key": "k", "limits": [FW], "on_failure": {"": None}},
        400,
        "on_failure",
    ),
    ("list on_failure", {"key": "k", "limits": [FW], "on_failure": ["allow"]}, 400, "on_failure"),
    # A named rule has its own: one given beside it, valid or not, would be ignored.
    (
        "on_failure with a rule",
        {"key": "k", "rule": "basic", "on_failure": "allow"},
        400,
        "on_failure",
    ),
    (
        "bad on_failure with a rule",
        {"key": "k", "rule": "basic", "on_failure": 7},
        400,
        "on_failure",
    ),
    (
        "durability with a rule",
        {"key": "k", "rule": "basic", "durability": "replica"},
        400,
        "durability",
    ),
    (
        "bucket overflow",
        {"key": "k", "limits": [{"algorithm": "token_bucket", "rate": 10**12, "period": "3660d"}]},
        400,
        "limits[0].rate",
    ),
]


def assert_problem(status: int, body: Any, expected_status: int, field: str | None) -> None:
    assert status == expected_status, body
    assert isinstance(body, dict)
    assert body["status"] == expected_status
    assert {"type", "title", "status", "detail"} <= set(body)
    if field is not None:
        assert field in [e["field"] for e in body.get("errors", [])], body


@pytest.mark.parametrize(
    ("name", "payload", "status", "field"), BAD_CHECKS, ids=[c[0] for c in BAD_CHECKS]
)
async def test_bad_check_is_a_problem(
    cluster: Cluster, name: str, payload: Any, status: int, field: str | None
) -> None:
    got_status, body = await cluster.post("/v1/check", payload)
    assert_problem(got_status, body, status, field)


async def test_a_bad_on_failure_in_a_batch_is_a_problem(cluster: Cluster) -> None:
    for on_failure in ({"": None}, ["allow"], 1):
        check = {"key": "k", "limits": [FW], "on_failure": on_failure}
        for checks in ([check], [{"key": "k", "rule": "basic"}, check]):
            status, body = await cluster.post("/v1/check/batch", {"checks": checks})
            assert_problem(status, body, 400, f"checks[{len(checks) - 1}].on_failure")


async def test_a_rule_given_with_on_failure_consumes_nothing(cluster: Cluster) -> None:
    checks = [
        {"key": "named-own", "rule": "basic"},
        {"key": "named-own", "rule": "basic", "durability": "primary"},
    ]
    status, body = await cluster.post("/v1/check/batch", {"checks": checks})
    assert_problem(status, body, 400, "checks[1].durability")
    assert body["errors"] == [
        {
            "field": "checks[1].durability",
            "message": "a named rule has its own durability (set it in the rule); give it "
            "only with inline 'limits'",
        }
    ]
    usage = await cluster.usage("named-own", "basic")
    assert usage["limits"][0]["remaining"] == usage["limits"][0]["limit"]
    status, body = await cluster.post(
        "/v1/check", {"key": "named-own", "rule": "basic", "on_failure": None, "durability": None}
    )
    assert status == 200 and body["limits"][0]["remaining"] == body["limits"][0]["limit"] - 1


DEEP = b"[" * 1500 + b"]" * 1500


@pytest.mark.parametrize(
    ("path", "body"),
    [
        # strings that are not UTF-8
        ("/v1/check", b'{"key":"k\xff","rule":"basic"}'),
        ("/v1/check", b'{"key":"k","limits":"5/minute","request_id":"\xc3"}'),
        ("/v1/check/batch", b'{"checks":[{"key":"\xff","rule":"basic"}]}'),
        ("/v1/lease/renew", b'{"key":"k\xff","rule":"leases","lease_id":"1.ab"}'),
        ("/v1/refund", b'{"key":"k\xff","rule":"basic","request_id":"r"}'),
        # JSON nested too deep
        ("/v1/check", b'{"key":"k","limits":' + DEEP + b"}"),
        ("/v1/check", DEEP),
        ("/v1/check/batch", b'{"checks":[{"key":"k","limits":' + DEEP + b"}]}"),
        ("/v1/lease/release", b'{"key":"k","rule":"leases","lease_id":' + DEEP + b"}"),
        ("/v1/refund", b'{"key":"k","rule":"basic","request_id":' + DEEP + b"}"),
    ],
)
async def test_a_body_json_cannot_read_is_malformed_json(
    cluster: Cluster, path: str, body: bytes
) -> None:
    status, content_type, problem = await raw_post(cluster, path, body)
    assert (status, content_type) == (400, "application/problem+json"), problem
    assert problem["type"].endswith("/malformed-json"), problem


@pytest.mark.parametrize("coding", ["x-foo", "br", "gzip, gzip", "compress"])
async def test_a_body_in_a_coding_not_served_is_a_415(cluster: Cluster, coding: str) -> None:
    """Read as is, such a body would be taken for what it is not (x-foo was counted)."""
    body = orjson.dumps({"key": f"coded:{coding}", "rule": "basic"})
    async with cluster.http.post(
        cluster.router_url + "/v1/check", data=body, headers={"Content-Encoding": coding}
    ) as resp:
        problem = await resp.json(content_type=None)
        assert resp.status == 415 and resp.headers["Accept-Encoding"] == "gzip, deflate"
    assert problem["type"].endswith("/unsupported-content-encoding"), problem
    usage = await cluster.usage(f"coded:{coding}", "basic")
    assert usage["limits"][0]["remaining"] == usage["limits"][0]["limit"]


async def test_a_token_that_is_not_utf8_is_refused_not_a_crash(cluster: Cluster) -> None:
    port = int(cluster.router_url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"limits":[{"algorithm":"fixed_window","limit":5,"window":"1m"}]}'
    writer.write(
        b"PUT /v1/rules/zz HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer s3cret\xff\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    answer = await reader.read()
    writer.close()
    head, problem = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 401 "), answer
    assert orjson.loads(problem)["status"] == 401


async def test_a_key_header_that_is_not_utf8_is_a_problem(cluster: Cluster) -> None:
    """Forward auth takes the key from a header, whose bytes a client chose freely."""
    port = int(cluster.router_url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"GET /v1/authz?rule=basic&key_header=X-Api-Key HTTP/1.1\r\nHost: r\r\n"
        b"X-Api-Key: k\xff\xfe\r\nConnection: close\r\n\r\n"
    )
    answer = await reader.read()
    writer.close()
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert_problem(400, orjson.loads(body), 400, "key")


@pytest.mark.parametrize(
    "path",
    ["/v1/usage?rule=basic&key=u%FF", "/v1/authz?rule=basic&key=u%FE", "/v1/locate?key=%C3"],
)
async def test_a_query_escape_that_is_not_utf8_is_a_problem(cluster: Cluster, path: str) -> None:
    """Read as U+FFFD, `%FF` and `%FE` would be one key: refused instead."""
    async with cluster.http.get(cluster.router_url + path) as resp:
        assert_problem(resp.status, await resp.json(content_type=None), 400, "query")
    async with cluster.http.get(cluster.router_url + "/v1/locate?key=%E2%82%AC") as resp:
        assert resp.status == 200 and (await resp.json())["key"] == "\u20ac"


async def test_bad_input_consumes_nothing(cluster: Cluster) -> None:
    await cluster.post("/v1/check", {"key": "keep", "rule": "basic", "cost": 2, "dry_run": "x"})
    usage = await cluster.usage("keep", "basic")
    assert usage["limits"][0]["remaining"] == 5


async def raw_post(cluster: Cluster, path: str, data: bytes) -> tuple[int, str, Any]:
    async with cluster.http.post(cluster.router_url + path, data=data) as resp:
        return resp.status, resp.content_type, await resp.json(content_type=None)


async def test_malformed_json(cluster: Cluster) -> None:
    for path in ("/v1/check", "/v1/check/batch", "/v1/refund"):
        for data in (b"{", b"", b"\xff\xfe", b'{"key": "k",}', b"nul"):
            status, ctype, body = await raw_post(cluster, path, data)
            assert status == 400 and ctype == "application/problem+json"
            assert body["type"].endswith("malformed-json")


async def test_body_over_1_mib_is_refused(cluster: Cluster) -> None:
    data = b'{"key": "' + b"a" * (1024 * 1024 + 10) + b'"}'
    status, ctype, body = await raw_post(cluster, "/v1/check", data)
    assert status == 413 and ctype == "application/problem+json" and body["status"] == 413


@pytest.mark.parametrize(
    ("where", "method", "path", "limit"),
    [
        ("router", "POST", "/v1/check", "1 MiB"),
        ("router", "PUT", "/v1/rules", "1 MiB"),
        ("n1", "POST", "/node/v1/batch", "16 MiB"),
    ],
)
async def test_a_body_declared_too_large_is_refused_before_it_is_sent(
    cluster: Cluster, where: str, method: str, path: str, limit: str
) -> None:
    """413 at once, without waiting for a body that would be refused (the connection is
    then closed: aiohttp first reads what comes of the body for a while, so that the
    client sees the answer rather than a reset)."""
    base = URL(cluster.router_url if where == "router" else cluster.node_urls[where])
    assert base.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", base.port)
    declared = 64 * 1024 * 1024
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n".encode())
    writer.write(b"Content-Type: application/json\r\n\r\n{}")
    async with asyncio.timeout(5):  # the body would take 75 s to be given up on
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        body = await reader.readexactly(length)
    writer.close()
    assert head.startswith(b"HTTP/1.1 413 ") and b"connection: close" in head.lower(), head
    problem = orjson.loads(body)
    assert problem["type"].endswith("/body-too-large"), problem
    assert problem["detail"] == f"request body exceeds {limit}", problem


async def test_batch_limits(cluster: Cluster) -> None:
    check = {"key": "b", "rule": "basic", "cost": 0}
    status, body = await cluster.post("/v1/check/batch", {"checks": [check] * 1001})
    assert_problem(status, body, 400, "checks")
    status, body = await cluster.post("/v1/check/batch", {"checks": [check] * 1000})
    assert status == 200 and len(body["results"]) == 1000
    status, body = await cluster.post("/v1/check/batch", {"checks": []})
    assert_problem(status, body, 400, "checks")
    status, body = await cluster.post(
        "/v1/check/batch", {"checks": [check, {"key": "b", "cost": -1, "rule": "basic"}]}
    )
    assert_problem(status, body, 400, "checks[1].cost")
    status, body = await cluster.post("/v1/check/batch", {"checks": [check], "all_or_nothing": 1})
    assert_problem(status, body, 400, "all_or_nothing")


async def test_other_endpoints_reject_bad_input(cluster: Cluster) -> None:
    status, body = await cluster.post("/v1/refund", {"key": "k", "rule": "basic"})
    assert_problem(status, body, 400, "request_id")
    status, body = await cluster.get("/v1/usage?key=k")
    assert_problem(status, body, 400, "rule")
    status, body = await cluster.get("/v1/locate")
    assert_problem(status, body, 400, "key")
    status, body = await cluster.get("/v1/rules/" + "x" * 65)
    assert_problem(status, body, 400, None)
    status, body = await cluster.get("/v1/nothing-here")
    assert_problem(status, body, 404, None)
    async with cluster.http.get(cluster.router_url + "/v1/check") as resp:
        assert resp.status == 405 and resp.content_type == "application/problem+json"
    headers = {"Authorization": "Bearer test-admin-token"}
    async with cluster.http.put(
        cluster.router_url + "/v1/rules/r1", json={"limits": [{"algorithm": "x"}]}, headers=headers
    ) as resp:
        body = await resp.json(content_type=None)
        assert_problem(resp.status, body, 400, "body.limits[0].algorithm")


async def test_a_node_removal_whose_dry_run_is_not_a_flag_is_refused_and_changes_nothing(
    cluster: Cluster,
) -> None:
    """`dry_run=yes` must not read as false and start the real removal."""
    headers = {"Authorization": "Bearer test-admin-token"}
    before = (await cluster.get("/v1/cluster"))[1]
    for value in ("yes", "True", ""):
        async with cluster.http.delete(
            cluster.router_url + f"/v1/cluster/nodes/n2?dry_run={value}", headers=headers
        ) as resp:
            body = await resp.json(content_type=None)
        assert_problem(resp.status, body, 400, "dry_run")
    async with cluster.http.delete(
        cluster.router_url + "/v1/cluster/nodes/n2?dry_run=true", headers=headers
    ) as resp:
        planned = await resp.json(content_type=None)
    assert resp.status == 200 and {m["source"] for m in planned["moves"]} == {"n2"}
    after = (await cluster.get("/v1/cluster"))[1]
    assert after["epoch"] == before["epoch"]
    assert [n["id"] for n in after["nodes"]] == [n["id"] for n in before["nodes"]]
    assert after["migration"] is None


async def test_an_unknown_rule_is_answered_with_the_nearest_names(cluster: Cluster) -> None:
    """A typo in a rule name names the rules it is near ("did you mean"), wherever the
    name is given; a name near none names none."""
    status, body = await cluster.check({"key": "k", "rule": "basc"})
    assert status == 400, body
    assert body["errors"] == [
        {"field": "rule", "message": "unknown rule 'basc'; did you mean 'basic'?"}
    ]
    assert body["detail"] == "rule: unknown rule 'basc'; did you mean 'basic'?"
    status, body = await cluster.post("/v1/check/batch", {"checks": [{"key": "k", "rule": "logn"}]})
    assert status == 400, body
    assert body["errors"] == [
        {"field": "checks[0].rule", "message": "unknown rule 'logn'; did you mean 'login'?"}
    ]
    status, body = await cluster.check({"key": "k", "rule": "zzz"})
    assert body["errors"] == [{"field": "rule", "message": "unknown rule 'zzz'"}]
    status, body = await cluster.get("/v1/rules/paymnts")
    assert (status, body["type"], body["detail"]) == (
        404,
        "https://shardlimit.dev/problems/unknown-rule",
        "no rule named 'paymnts'; did you mean 'payments'?",
    )
    async with cluster.http.delete(
        cluster.router_url + "/v1/rules/stok", headers={"Authorization": f"Bearer {ADMIN}"}
    ) as resp:
        deleted = await resp.json(content_type=None)
    assert (resp.status, deleted["detail"]) == (404, "no rule named 'stok'; did you mean 'stock'?")
    status, body = await cluster.get("/v1/rules/zzz")
    assert (status, body["detail"]) == (404, "no rule named 'zzz'")
    status, body = await cluster.post(
        "/v1/quota/adjust", {"key": "k", "rule": "stocks", "delta": 1, "request_id": "r1"}, ADMIN
    )
    assert status == 400, body
    assert body["errors"] == [
        {"field": "rule", "message": "unknown rule 'stocks'; did you mean 'stock'?"}
    ]


async def test_inline_durability_is_primary_or_replica(cluster: Cluster) -> None:
    """Inline limits take `durability` as a rule does; anything else is named."""
    limits = [{"algorithm": "fixed_window", "limit": 5, "window": "1m"}]
    for durability in ("primary", "replica", None):
        body = {"key": f"dur:{durability}", "limits": limits, "durability": durability}
        status, answer = await cluster.check(body)
        assert status == 200 and answer["allowed"] is True, answer
    status, answer = await cluster.check({"key": "dur:x", "limits": limits, "durability": "disk"})
    assert status == 400, answer
    assert answer["errors"] == [
        {"field": "durability", "message": "must be 'primary' or 'replica'"}
    ]
    batch = {"checks": [{"key": "dur:y", "limits": limits, "durability": 1}]}
    status, answer = await cluster.post("/v1/check/batch", batch)
    assert status == 400, answer
    assert answer["errors"] == [
        {"field": "checks[0].durability", "message": "must be 'primary' or 'replica'"}
    ]


async def test_a_client_gone_mid_body_is_counted_499_not_an_error(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Half a body, then the connection closed: no 500, no error logged."""
    host, port = cluster.router_url.removeprefix("http://").split(":")
    metrics = cluster.router.metrics
    gone = metrics.count("shardlimit_error_responses_total", status="499")
    _reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b'POST /v1/refund HTTP/1.1\r\nHost: r\r\nContent-Length: 100\r\n\r\n{"key":')
    await writer.drain()
    writer.close()
    await writer.wait_closed()

    async def counted() -> bool:
        return metrics.count("shardlimit_error_responses_total", status="499") == gone + 1

    await eventually(counted)
    assert metrics.count("shardlimit_error_responses_total", status="500") == 0
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


async def test_a_fault_two_limits_find_in_one_field_is_named_once(cluster: Cluster) -> None:
    money = {"algorithm": "calendar", "period": "day", "max_amount": "100.00"}
    status, problem = await cluster.post(
        "/v1/check", {"key": "k", "limits": [money, {**money, "period": "week"}], "amount": "0.001"}
    )
    assert status == 400, problem
    assert problem["detail"] == "amount: has more than 2 decimal places"
    assert [e["field"] for e in problem["errors"]] == ["amount"]


async def test_a_rule_named_dot_or_dot_dot_is_refused(cluster: Cluster) -> None:
    """A client that normalises URL paths could never reach /v1/rules/. or /v1/rules/..."""
    body = {"limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1m"}]}
    for name in ("%2e", "%2e%2e"):
        async with cluster.http.put(
            URL(cluster.router_url + f"/v1/rules/{name}", encoded=True),
            json=body,
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as resp:
            problem = await resp.json(content_type=None)
        assert resp.status == 400, problem
        assert "(not . or ..)" in problem["detail"], problem


async def test_a_batch_whose_log_entries_add_up_past_one_checks_is_refused(
    cluster: Cluster,
) -> None:
    """A sliding_log limit keeps an entry per unit admitted: a batch may add as many as one
    check may (10,000), so that one request cannot hold every node's Redis for seconds."""
    log = [{"algorithm": "sliding_log", "limit": 10_000, "window": "1h"}]
    window = [{"algorithm": "fixed_window", "limit": 10_000, "window": "1h"}]

    def batch(cost: int, limits: list[dict[str, Any]]) -> dict[str, Any]:
        return {"checks": [{"key": f"units:{i}", "limits": limits, "cost": cost} for i in range(2)]}

    status, body = await cluster.post("/v1/check/batch", batch(5_001, log))
    assert_problem(status, body, 400, "checks")
    assert "add up to a cost of 10002" in body["detail"], body
    # Nothing was consumed: the same keys then take 5,000 each.
    status, body = await cluster.post("/v1/check/batch", batch(5_000, log))
    assert status == 200 and [r["allowed"] for r in body["results"]] == [True, True], body
    assert [r["limits"][0]["remaining"] for r in body["results"]] == [5_000, 5_000]
    # Costs on counters that keep no log are not bound by it.
    status, body = await cluster.post("/v1/check/batch", batch(9_000, window))
    assert status == 200 and body["allowed"] is True, body
