"""The served OpenAPI document is valid OpenAPI 3.1 and says exactly what the server
accepts: every pattern it states is compared, input by input, with the parser that
reads the same field. Patterns are judged by jsonschema_rs, the validator schemathesis
uses (ECMA 262 regexes: `$` is the end, `\\s` and `\\d` are not Python's)."""

from __future__ import annotations

import itertools
import zoneinfo
from collections.abc import Iterable, Iterator
from typing import Any

import jsonschema_rs
import pytest
from multidict import CIMultiDict
from openapi_spec_validator import validate

from cluster.model.calendar import load_timezone
from cluster.model.errors import Problems
from cluster.model.limits import (
    ALGORITHMS,
    MAX_BUCKET_PERIOD_MS,
    MAX_BUCKET_SIZE,
    MAX_COUNT,
    MAX_DURATION_MS,
    parse_decimal,
    parse_duration,
    parse_limit,
    parse_limits,
    parse_timestamp,
)
from cluster.web.problem import Problem
from router.api.authz_query import parse_authz
from router.api.if_match import IF_MATCH
from router.api.node_body import new_node
from router.api.openapi import openapi_document
from router.rules.book import RuleBook, make_rule
from tests.conftest import ADMIN, Cluster

DOCUMENT = openapi_document()
SCHEMAS = DOCUMENT["components"]["schemas"]
ODD = ["\u00a0", "\x1c", "\ufeff", "\u0663", "\u00b2", "x", "\n"]  # NBSP, FS, BOM, ٣, ²


def validator(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    """A validator for `schema`, which may refer to the document's components."""
    return jsonschema_rs.Draft202012Validator({**schema, "components": DOCUMENT["components"]})


def strings(alphabet: Iterable[str], longest: int) -> Iterator[str]:
    letters = list(alphabet)
    for length in range(longest + 1):
        for letters_ in itertools.product(letters, repeat=length):
            yield "".join(letters_)


def disagreements(
    schema: dict[str, Any], server_accepts: Any, values: Iterable[Any]
) -> list[tuple[Any, bool]]:
    """Values the schema and the server judge differently, with the schema's verdict."""
    check = validator(schema)
    return [(v, check.is_valid(v)) for v in values if check.is_valid(v) != server_accepts(v)]


async def test_served_document_is_valid_openapi(cluster: Cluster) -> None:
    status, document = await cluster.get("/openapi.json")
    assert status == 200
    spec: Any = document
    validate(spec)
    assert document == DOCUMENT


def test_every_route_of_the_router_is_in_the_document(cluster: Cluster) -> None:
    """What the router serves and the document names are the same (the /ui page's own
    files and the trailing-slash twin of /ui aside): a route left out is neither
    documented nor fuzzed."""
    app = cluster.runners[-1].app
    served = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    documented = {
        (method, path)
        for path, item in DOCUMENT["paths"].items()
        for method in item
        if method != "parameters"
    }
    skipped = {("get", "/ui/"), ("get", "/ui/{name}")}
    assert served - skipped == documented


def test_every_algorithm_has_its_limit_schema() -> None:
    mapping = SCHEMAS["Limit"]["discriminator"]["mapping"]
    assert list(mapping) == list(ALGORITHMS)
    for name in ALGORITHMS:
        assert SCHEMAS[name]["properties"]["algorithm"]["const"] == name


@pytest.mark.parametrize(
    ("schema", "maximum"),
    [
        (SCHEMAS["fixed_window"]["properties"]["window"], MAX_DURATION_MS),
        (SCHEMAS["token_bucket"]["properties"]["period"], MAX_BUCKET_PERIOD_MS),
    ],
    ids=["window", "bucket-period"],
)
def test_durations(schema: dict[str, Any], maximum: int) -> None:
    def accepts(value: Any) -> bool:
        problems = Problems()
        parse_duration(value, "d", problems, maximum)
        return not problems.errors

    edges = [
        *(
            f"{maximum // ms + extra}{unit}"
            for unit, ms in (
                ("ms", 1),
                ("s", 1000),
                ("m", 60_000),
                ("h", 3_600_000),
                ("d", 86_400_000),
            )
            for extra in (0, 1)
        ),
        maximum,
        maximum + 1,
        0,
        -1,
        1.0,
        True,
        None,
        "0" * 40 + "1s",
        "1" * 40 + "s",
        " 1 s ",
        "1S",
        "1 ms\n",
        "1ms\n\n",
        "1 d",
    ]
    values = [*strings(["0", "1", "9", " ", "m", "s", "h", "d", *ODD], 3), *edges]
    # JSON Schema's integers include 1.0, which the server reads as a float and refuses
    # (tests/integration/test_fuzz.py sends 5.0 as 5)
    assert disagreements(schema, accepts, values) == [(1.0, True)]


def test_decimals() -> None:
    def accepts(value: Any) -> bool:
        number = parse_decimal(value, "amount", Problems())
        return number is not None and number >= 0

    edges = [
        "1e99999999999999999",
        "1e999999999999999999",
        "-0.00e5",
        "-.0",
        "1_000",
        "1__0",
        "Infinity",
        "NaN",
        "-1",
        " 12.30 ",
        "\t1e-5\n",
        0,
        0.5,
        -0.0,
        -1,
        10**30,
        True,
    ]
    values = [*strings(["0", "1", ".", "e", "+", "-", "_", " ", *ODD], 4), *edges]
    assert disagreements(SCHEMAS["Check"]["properties"]["amount"], accepts, values) == []


def test_rate_strings() -> None:
    def accepts(text: Any) -> bool:
        problems = Problems()
        parse_limits(text, "limits", problems)
        return not problems.errors

    counts = ["1", "0", "007", str(MAX_COUNT), str(MAX_COUNT + 1), "\u0663"]
    windows = ["second", "SECONDS", "7 days", "0 day", "3660 days", "3661 days", "mo", "month"]
    separators = ["/", " per ", "per", " PER\t", "/\u00a0"]
    values = [
        f"{prefix}{count}{separator}{window}{suffix}"
        for prefix in ("", "sliding_window:", " fixed_window :", "Sliding_window:")
        for count in counts
        for separator in separators
        for window in windows
        for suffix in ("", " ", ";2/hour", ",2/hour\n", ";", "\u00a0")
    ]
    schema = {"type": "string", "pattern": SCHEMAS["Limits"]["anyOf"][1]["pattern"]}
    assert disagreements(schema, accepts, values) == []


@pytest.mark.parametrize("algorithm", ["token_bucket", "leaky_bucket"])
def test_bucket_bounds(algorithm: str) -> None:
    size = "burst" if algorithm == "token_bucket" else "capacity"

    def accepts(limit: Any) -> bool:
        problems = Problems()
        return parse_limit(limit, "limit", problems) is not None

    values = [
        {"algorithm": algorithm, "rate": rate, "period": period, **sizes}
        for rate in (1, MAX_BUCKET_SIZE, MAX_BUCKET_SIZE + 1)
        for period in ("1d", "24h", "1441m", "86400001ms", "2d", 86_400_000, 86_400_001)
        for sizes in ({}, {size: MAX_BUCKET_SIZE}, {size: MAX_BUCKET_SIZE + 1})
    ]
    assert disagreements(SCHEMAS[algorithm], accepts, values) == []


def test_timestamps() -> None:
    """The pattern is the server's, fields in range; the schema cannot tell a real date
    (no 30 February) and the server says so."""
    schema = SCHEMAS["quota"]["properties"]["expires_at"]
    values = [
        "2030-01-01T00:00:00Z",
        "2030-01-01t00:00:00.123456789z",
        "2030-12-31T23:59:59+23:59",
        "2030-01-01T00:00:00-00:00",
        "2030-01-01T00:00:00",
        "2030-01-01 00:00:00Z",
        "2030-13-01T00:00:00Z",
        "2030-01-32T00:00:00Z",
        "2030-01-01T24:00:00Z",
        "2030-01-01T00:60:00Z",
        "2030-01-01T00:00:60Z",
        "2030-01-01T00:00:00+24:00",
        "2030-01-01T00:00:00Z\n",
        "\u0662030-01-01T00:00:00Z",
        "2030-01-01T00:00:00.Z",
        "2030-02-30T00:00:00Z",
        "0000-01-01T00:00:00Z",
    ]

    def accepts(value: Any) -> bool:
        return value is None or parse_timestamp(value, "t", Problems()) is not None

    assert disagreements(schema, accepts, values) == [("2030-02-30T00:00:00Z", True)]


def _query_schema(path: str, name: str) -> dict[str, Any]:
    parameters = DOCUMENT["paths"][path]["get"]["parameters"]
    schema: dict[str, Any] = next(p["schema"] for p in parameters if p["name"] == name)
    return schema


def test_authz_cost_and_deny_status() -> None:
    book = RuleBook(None)
    book.rules = {"basic": make_rule("basic", parse_limits("5/hour", "limits", Problems()))}

    def accepts(name: str) -> Any:
        def parse(value: str) -> bool:
            query = {"rule": "basic", "key": "k", name: value}
            return parse_authz(query, CIMultiDict(), book, Problems()) is not None

        return parse

    digits = ["0", "1", "9", *ODD]
    costs = [*strings(digits, 3), str(MAX_COUNT), str(MAX_COUNT + 1), "0" * 30 + "1", "9" * 13]
    cost = _query_schema("/v1/authz", "cost")
    assert disagreements(cost, accepts("cost"), costs) == []
    statuses = ["429", "403", "401", "0429", "400", "\u0664\u0662\u0669", "429\n", ""]
    deny = _query_schema("/v1/authz", "deny_status")
    assert disagreements(deny, accepts("deny_status"), statuses) == []


def test_if_match() -> None:
    parameters = DOCUMENT["paths"]["/v1/rules"]["put"]["parameters"]
    schema = next(p["schema"] for p in parameters if p["name"] == "If-Match")
    values = [*strings(['"', "W", "/", "3", " ", "\u00b2"], 4), '"' + "9" * 18 + '"', "9" * 19]

    def accepts(value: str) -> bool:
        return IF_MATCH.fullmatch(value) is not None

    assert disagreements(schema, accepts, values) == []


def _node_body_accepted(body: Any) -> bool:
    try:
        new_node(body, {"n1"})
    except Problem:
        return False
    return True


NEW_NODE_SCHEMA = DOCUMENT["paths"]["/v1/cluster/nodes"]["post"]["requestBody"]["content"][
    "application/json"
]["schema"]


def test_new_node_urls_are_what_the_server_accepts() -> None:
    """`"url": "http://"` was valid by the schema and refused by the server."""
    hosts = ["", "h", "127.0.0.1", "[::1]", "shardlimit-node-3", "h h", "h\u00a0", "user@h"]
    ports = ["", ":", ":0", ":1", ":7001", ":65535", ":65536", ":07001", ":\u0663"]
    tails = ["", "/", "/x", "?x", "#x", "\n"]
    urls = [
        f"{scheme}{host}{port}{tail}"
        for scheme in ("http://", "https://", "ftp://", "HTTP://", "http:/")
        for host in hosts
        for port in ports
        for tail in tails
    ]
    schema = NEW_NODE_SCHEMA["properties"]["url"]
    assert disagreements(schema, lambda url: _node_body_accepted({"url": url}), urls) == []
    assert not validator(schema).is_valid("http://")
    assert validator(schema).is_valid("http://127.0.0.1:7001")


def test_new_node_bodies_are_decoded_strictly() -> None:
    """`"dry_run": "yes"` and `[null, null]` were taken as true; the schema says boolean."""
    url = "http://127.0.0.1:7004"
    odd: list[Any] = [True, False, "yes", "true", [None, None], [], 1, 0, None, {}]
    bodies = [{"url": url, "dry_run": value} for value in odd]
    bodies += [{"url": url, "weight": w} for w in (1, 1000, 0, 1001, True, 2.0, "2")]
    bodies += [{"url": url, "id": "n4", "extra": 1}, {"url": url, "id": "n4"}, {"id": "n4"}]
    assert disagreements(NEW_NODE_SCHEMA, _node_body_accepted, bodies) == []
    assert new_node({"url": url, "dry_run": True}, set())[1] is True
    with pytest.raises(Problem) as refused:
        new_node({"url": url, "dry_run": "yes"}, set())
    assert [(e.path, e.message) for e in refused.value.errors or []] == [
        ("dry_run", "must be true or false")
    ]


async def test_a_node_add_with_a_dry_run_that_is_no_boolean_is_refused(cluster: Cluster) -> None:
    for dry_run in ("yes", [None, None]):
        body = {"url": "http://127.0.0.1:9", "id": "n9", "dry_run": dry_run}
        status, problem = await cluster.post("/v1/cluster/nodes", body, ADMIN)
        assert status == 400, problem
        assert problem["errors"] == [{"field": "dry_run", "message": "must be true or false"}]
    status, view = await cluster.get("/v1/cluster")
    assert status == 200 and "n9" not in [node["id"] for node in view["nodes"]]


async def test_odd_digits_and_final_newlines_are_400s_not_500s(cluster: Cluster) -> None:
    """Found comparing the document with the server: str.isdigit() takes "²", which
    int() refuses (a 500), and a regex's $ takes a final newline."""
    for query in ("cost=%C2%B2", "deny_status=%C2%B2", "cost=" + "0" * 40 + "1"):
        async with cluster.http.get(
            f"{cluster.router_url}/v1/authz?rule=basic&key=k&{query}"
        ) as resp:
            assert resp.status == (204 if query.startswith("cost=00") else 400), query
    async with cluster.http.delete(
        f"{cluster.router_url}/v1/rules/none",
        headers={"Authorization": f"Bearer {ADMIN}", "If-Match": "\u00b2"},
    ) as resp:
        assert resp.status == 400
    status, body = await cluster.check({"key": "k", "rule": "basic", "request_id": "r1\n"})
    assert (status, [e["field"] for e in body["errors"]]) == (400, ["request_id"])
    async with cluster.http.put(
        f"{cluster.router_url}/v1/rules/basic%0A",
        json={"limits": "1/second"},
        headers={"Authorization": f"Bearer {ADMIN}"},
    ) as resp:
        body = await resp.json()
        assert (resp.status, [e["field"] for e in body["errors"]]) == (400, ["name"])


async def test_a_bucket_at_its_bounds_counts_exactly(cluster: Cluster) -> None:
    """rate x period and burst x period at their largest (10**8 x 1 day, below 2**53 in
    Lua); a day is the longest period."""
    largest = MAX_BUCKET_SIZE
    for key, rate in (("fast", largest), ("slow", 1)):
        bucket = {"algorithm": "token_bucket", "rate": rate, "period": "1d", "burst": largest}
        status, body = await cluster.check({"key": key, "limits": [bucket], "cost": largest})
        assert (status, body["limits"][0]["remaining"]) == (200, 0)
    status, body = await cluster.check({"key": "slow", "limits": [bucket], "cost": 1})
    assert (status, body["limits"][0]["remaining"]) == (429, 0)
    status, body = await cluster.check({"key": "k", "limits": [{**bucket, "period": "2d"}]})
    assert (status, [e["field"] for e in body["errors"]]) == (400, ["limits[0].period"])


def test_timezones() -> None:
    def accepts(name: str) -> bool:
        try:
            load_timezone(name)
        except ValueError:
            return False
        return True

    names = sorted(zoneinfo.available_timezones())
    values = [*names, *(f"{n}\n" for n in names[:50]), "Europe/paris", "Etc/GMT+1x", "", "/"]
    schema = SCHEMAS["calendar"]["properties"]["timezone"]
    assert disagreements(schema, accepts, values) == []
