"""Schemathesis against /openapi.json with every check, `positive_data_acceptance`
included: no 5xx, problem+json errors, responses match the schema, schema-invalid
requests refused and schema-valid ones accepted.

This module is also schemathesis's hooks module (SCHEMATHESIS_HOOKS=tests.integration.test_fuzz).
The hooks make true, in every request of every phase (batches and stateful sequences
too), what the document says only in prose because JSON Schema cannot say it:

- a named rule exists: they name `basic`, a rule of the test cluster's that every rules
  write keeps (`stock`, a quota, for /v1/quota/adjust; `leases`, a concurrency limit,
  for /v1/lease/renew and /release);
- a key is at most 512 bytes of UTF-8 (the schema counts characters);
- `/v1/authz` takes `key` or `key_header`, and `key_header` names a header of the request;
- the rules across fields: no two limits of a list count the same counter, at most 16
  limits once rate strings expand, max_amount within what its amount_scale allows, a
  quota's expires_at a real date in the future, an amount within the inline limits'
  scales, and a batch's sliding_log entries within 10,000; and 5.0 sent as 5 (JSON
  Schema's integers include 5.0, the server's do not).

A schema-valid request may meet a precondition that does not hold (409 for a rules
version, 412 for `If-Match: *` on a rule that does not exist): schemathesis counts 409
as an answer to valid data, and is told (CONFIG) to count 412 too.

They ground every case, schema-valid or not: schemathesis classifies a case again after
the hook, so a case made valid here is checked as valid.

`SHARDLIMIT_FUZZ_SEED` picks another seed for a hold-out run. Node add/remove and the
migration endpoints are left out: they change the cluster's membership.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.model.errors import Problems
from cluster.model.keys import MAX_KEY_BYTES
from cluster.model.limits import (
    MAX_AMOUNT_SCALE,
    parse_decimal,
    parse_limits,
    parse_timestamp,
    to_minor_units,
)
from router.rules.book import parse_rule
from tests.conftest import ADMIN, RULES, Cluster, cluster_with_rules

ROOT = Path(__file__).resolve().parents[2]
BASIC = [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]
STOCK = [{"algorithm": "quota", "limit": 1_000_000, "max_amount": "1000000.00"}]
LEASES = [{"algorithm": "concurrency", "limit": 5, "lease": "30s"}]
KEEP = {"basic": {"limits": BASIC}, "stock": {"limits": STOCK}, "leases": {"limits": LEASES}}
FUTURE = "2999-01-01T00:00:00Z"
SEED = int(os.environ.get("SHARDLIMIT_FUZZ_SEED", "1"))
# schemathesis' answers to valid data, and 412 (a precondition that does not hold)
CONFIG = """[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "412", "429", "5xx"]
"""

cluster = cluster_with_rules(
    RULES + "  leases:\n    limits:\n      - {algorithm: concurrency, limit: 5, lease: 30s}\n"
)

# parse_limits' problems about a whole list, which no schema of one limit can state
LIST_RULES = ("counts the same counter", "must hold at most")


def _ground_limit(limit: dict[str, Any]) -> None:
    """One limit's rules across fields, made true in place."""
    scale = limit.get("amount_scale", 2)
    if limit.get("max_amount") is not None and scale in range(MAX_AMOUNT_SCALE + 1):
        problems = Problems()
        number = parse_decimal(limit["max_amount"], "max_amount", problems)
        minor = None if number is None else to_minor_units(number, scale, "", problems)
        if not minor:
            limit["max_amount"] = "1"
    if limit.get("expires_at") is not None:
        ms = parse_timestamp(limit["expires_at"], "expires_at", Problems())
        if ms is None or ms < (time.time() + 86_400) * 1000:
            limit["expires_at"] = FUTURE


def _ground_limits(body: dict[str, Any]) -> None:
    limits = body.get("limits")
    if limits is None:
        return
    for limit in limits if isinstance(limits, list) else []:
        if isinstance(limit, dict):
            _ground_limit(limit)
    problems = Problems()
    parse_limits(limits, "limits", problems)
    if any(rule in e.message for e in problems.errors for rule in LIST_RULES):
        body["limits"] = copy.deepcopy(BASIC)
    if "amount" in body:
        body["amount"] = "0"


def _ground_spread(rule: dict[str, Any]) -> None:
    """No more sub-counters than a limit of the rule has units to share; neither spread
    nor cache_denials with a concurrency limit."""
    problems = Problems()
    parse_rule("r", rule, "rule", problems)
    for option in ("spread", "cache_denials"):
        if any(e.path == f"rule.{option}" for e in problems.errors):
            del rule[option]


def _short_key(key: Any) -> Any:
    too_long = isinstance(key, str) and len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES
    return key[: MAX_KEY_BYTES // 4] if too_long else key


def _integral(value: Any) -> Any:
    """5.0 -> 5: JSON Schema's integers include 5.0, the server's do not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def _ground_body(path: str, method: str, body: dict[str, Any]) -> None:
    checks = [c for c in body.get("checks") or [] if isinstance(c, dict)]
    rules: list[dict[str, Any]] = []
    if path == "/v1/rules/{name}":
        rules = [body]
    elif path == "/v1/rules" and method == "PUT" and isinstance(body.get("rules"), dict):
        rules = [rule for rule in body["rules"].values() if isinstance(rule, dict)]
        body["rules"].update(copy.deepcopy(KEEP))
    for rule in rules:
        if "name" in rule:
            rule["name"] = None  # or its own name
    for item in {id(item): item for item in (body, *checks, *rules)}.values():
        if isinstance(item.get("rule"), str):
            item["rule"] = "basic"
        if "key" in item:
            item["key"] = _short_key(item["key"])
        _ground_limits(item)
    for rule in rules:
        _ground_spread(rule)
    if path == "/v1/quota/adjust" and isinstance(body.get("rule"), str):
        body["rule"] = "stock"  # a rule with a quota (count and amount) to adjust
        # amounts within its amount_scale and bounds
        for name, value in (("delta_amount", "-1.25"), ("set_amount", "2.50")):
            if name in body:
                body[name] = value
    if path.startswith("/v1/lease/") and isinstance(body.get("rule"), str):
        body["rule"] = "leases"  # a rule with a concurrency limit
    for check in checks:  # a batch's sliding_log entries: 10,000 at most
        limits = check.get("limits")
        logs = isinstance(limits, list) and any(
            isinstance(limit, dict) and limit.get("algorithm") == "sliding_log" for limit in limits
        )
        if logs and isinstance(check.get("cost"), int):
            check["cost"] = min(check["cost"], 1)


def _ground_query(path: str, query: dict[str, Any]) -> None:
    if isinstance(query.get("rule"), str):
        query["rule"] = "basic"
    if "key" in query:
        query["key"] = _short_key(query["key"])
    if path == "/v1/authz":
        # key_header names a header of the request: none here
        query.pop("key_header", None)
        query.setdefault("key", "k")


def _ground(case: Any) -> None:
    """Make a generated case meet what the document says only in prose."""
    path, method = case.operation.path, case.method.upper()
    if path == "/v1/rules/{name}" and case.path_parameters.get("name") in KEEP:
        case.path_parameters["name"] = "other"
    if isinstance(case.body, dict):
        case.body = _integral(case.body)
        _ground_body(path, method, case.body)
    if isinstance(case.query, dict):
        _ground_query(path, case.query)


if os.environ.get("SCHEMATHESIS_HOOKS") == __name__:
    import schemathesis

    @schemathesis.hook
    def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
        _ground(case)


async def run_schemathesis(
    cluster: Cluster, tmp_path: Path, seed: int, max_examples: int, *, hooks: bool = True
) -> tuple[int | None, str]:
    """Schemathesis against the cluster's document: its exit status and its output."""
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st is not None, "schemathesis is a dev dependency"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if hooks:
        env["SCHEMATHESIS_HOOKS"] = __name__
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    proc = await asyncio.create_subprocess_exec(
        st,
        "--config-file",
        str(config),
        "run",
        cluster.router_url + "/openapi.json",
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        "--header",
        f"Authorization: Bearer {ADMIN}",
        "--checks",
        "all",
        # Membership changes restructure the cluster under test and need real nodes at
        # the URLs they name: tests/system/test_resharding.py and the membership tests
        # cover them (their documents are still validated by test_openapi.py).
        "--exclude-path-regex",
        "^/v1/cluster/(nodes|migration)",
        "--generation-database",
        "none",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,
        env=env,
    )
    output, _ = await proc.communicate()
    return proc.returncode, output.decode(errors="replace")


@pytest.mark.timeout(240)
async def test_schemathesis_finds_nothing(cluster: Cluster, tmp_path: Path) -> None:
    returncode, text = await run_schemathesis(cluster, tmp_path, seed=SEED, max_examples=30)
    assert returncode == 0, text[-8000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", text)
    assert generated is not None, text[-3000:]
    assert int(generated.group(1)) >= 600
    assert generated.group(1) == generated.group(2)


# What the document states in prose because JSON Schema cannot: without the hooks above,
# schemathesis may send requests that break only these, and the server refuses them.
STATED_CROSS_FIELD = (
    re.compile(r"unknown rule"),  # "an existing rule's name"
    re.compile(r"is required: the name of a rule with a quota limit"),
    re.compile(r"has no quota limit"),
    re.compile(r"has no concurrency limit"),  # lease renew / release
    re.compile(r"cannot be spread|cannot cache a concurrency"),  # rules with one
    re.compile(r"every sub-counter needs a share of at least 1"),  # spread <= each limit
    # a real date, in the future (1970-01-01T00:00:00Z itself is the past)
    re.compile(r"must be in the future|is not a valid date-time|in the years 1970 to 9999"),
    re.compile(r"counts the same counter|must hold at most"),  # the limits list rules
    re.compile(r"decimal places|minor units|amount_scale"),  # amounts within the scale
    re.compile(r"bytes"),  # keys: 512 bytes of UTF-8, the schema counts characters
    re.compile(r"key_header"),  # key or key_header, naming a header of the request
    re.compile(r"must be an integer"),  # 5.0: JSON Schema's integers include it
    re.compile(r"sliding_log limits add up to a cost"),  # a batch's log entries
    re.compile(r"the rule's own name"),  # a rule's name, if given
)


@pytest.mark.timeout(240)
async def test_without_hooks_only_stated_cross_field_cases(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A seed the hooks were never tuned on, and no hooks: every refusal of a
    schema-valid request is one of the cross-field rules the document states."""
    _, text = await run_schemathesis(
        cluster, tmp_path, seed=SEED + 424241, max_examples=20, hooks=False
    )
    assert re.search(r"(\d+) generated", text) is not None, text[-3000:]
    failures = re.findall(r"^- (ST\d+ [^\n]+)", text, re.M)
    assert {f for f in failures if not f.startswith("ST202")} == set(), text[-8000:]
    details = re.findall(r'"detail":"((?:[^"\\]|\\.)*)"', text)
    unstated = [d for d in details if not any(p.search(d) for p in STATED_CROSS_FIELD)]
    assert unstated == [], text[-8000:]
