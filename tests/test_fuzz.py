"""Schemathesis against /openapi.json with every check but one: no 5xx, problem+json
errors, responses match the schema, schema-invalid requests refused. (Schema-valid
requests accepted, `positive_data_acceptance`, still finds cross-field rules the hooks do
not ground in batch and stateful cases.)

This module is also schemathesis's hooks module (SCHEMATHESIS_HOOKS=tests.test_fuzz):
what a schema cannot say, that a named rule must exist, the hooks make true by naming
`basic` (a rule of the test cluster's, which every rules write keeps).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster.errors import Problems
from cluster.limits import parse_limits
from tests.conftest import ADMIN, Cluster

ROOT = Path(__file__).resolve().parent.parent
KEEP = {"basic": {"limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]}}


# What parse_limits refuses that the schema says only in prose: rules across fields
# and across limits. A schema-valid case that breaks one gets a valid limit instead.
CROSS_FIELD = (
    "counts the same counter",
    "must stay below 2**53",
    "decimal places",
    "must be greater than zero",
    "must hold at most",
    "must be at most 10000000000000",
)


def _ground_limits(body: dict[str, Any]) -> None:
    limits = body.get("limits")
    if limits is None:
        return
    problems = Problems()
    parse_limits(limits, "limits", problems)
    if any(m in e.message for e in problems.errors for m in CROSS_FIELD) or any(
        "max_amount" in e.path for e in problems.errors
    ):
        body["limits"] = KEEP["basic"]["limits"]
    if "amount" in body:
        body["amount"] = "0"


def _integral(value: Any) -> Any:
    """5.0 -> 5: JSON Schema's integers include 5.0, the server's do not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def _ground(case: Any) -> None:
    """Make a generated case name an existing rule and keep the cluster's rules; for
    schema-valid cases, also meet the rules the schema says only in prose."""
    path, method, body = case.operation.path, case.method.upper(), case.body
    positive = case.meta is None or case.meta.generation.mode.name == "POSITIVE"
    if path == "/v1/rules/{name}" and case.path_parameters.get("name") == "basic":
        case.path_parameters["name"] = "other"
    if isinstance(body, dict):
        if isinstance(body.get("rule"), str):
            body["rule"] = "basic"
        items = [body, *(c for c in body.get("checks") or [] if isinstance(c, dict))]
        if path == "/v1/rules" and method == "PUT" and isinstance(body.get("rules"), dict):
            items += [r for r in body["rules"].values() if isinstance(r, dict)]
            body["rules"].update(KEEP)
        for item in items:
            if isinstance(item.get("rule"), str):
                item["rule"] = "basic"
            if positive:
                _ground_limits(item)
        if path == "/v1/rules/{name}" and "name" in body and positive:
            body["name"] = None
    if positive and body is not None:
        case.body = _integral(case.body)
    if isinstance(case.query, dict):
        if isinstance(case.query.get("rule"), str):
            case.query["rule"] = "basic"
        if positive and path == "/v1/authz" and "key_header" not in case.query:
            case.query.setdefault("key", "k")
        if positive and path == "/v1/authz" and "key_header" in case.query:
            del case.query["key_header"]  # names a header of the request: none here
            case.query["key"] = "k"


if os.environ.get("SCHEMATHESIS_HOOKS") == __name__:
    import schemathesis

    @schemathesis.hook
    def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
        _ground(case)


async def run_schemathesis(cluster: Cluster, tmp_path: Path, seed: int, max_examples: int) -> str:
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st is not None, "schemathesis is a dev dependency"
    env = {**os.environ, "SCHEMATHESIS_HOOKS": __name__, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        st, "run", cluster.router_url + "/openapi.json",
        "--max-examples", str(max_examples), "--seed", str(seed),
        "--header", f"Authorization: Bearer {ADMIN}",
        "--checks", "all",
        # Left out until the hooks ground every cross-field rule (a bucket's rate x period
        # below 2**53) in batch and stateful cases too: see the notes of the issue.
        "--exclude-checks", "positive_data_acceptance",
        "--generation-database", "none",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,
        env=env,
    )  # fmt: skip
    output, _ = await proc.communicate()
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-8000:]
    return text


@pytest.mark.timeout(240)
async def test_schemathesis_finds_nothing(cluster: Cluster, tmp_path: Path) -> None:
    text = await run_schemathesis(cluster, tmp_path, seed=1, max_examples=50)
    generated = re.search(r"(\d+) generated, (\d+) passed", text)
    assert generated is not None, text[-3000:]
    assert int(generated.group(1)) >= 1000
    assert generated.group(1) == generated.group(2)
