"""A client generated from the served /openapi.json by openapi-python-client makes real
calls against a real cluster: what the document says is enough to use the API."""

from __future__ import annotations

import asyncio
import importlib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import Cluster

PACKAGE = "shardlimit_client"
# No post-hooks: they would run ruff from PATH
CONFIG = "post_hooks: []\n"


@pytest.fixture
def clean_imports() -> Iterator[None]:
    """The generated package leaves sys.path and sys.modules as it found them."""
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


async def generate_client(cluster: Cluster, where: Path) -> ModuleType:
    """Generate the client package from the live document into `where`; import it."""
    status, document = await cluster.get("/openapi.json")
    assert status == 200
    (where / "openapi.json").write_text(json.dumps(document))
    (where / "config.yaml").write_text(CONFIG)
    generator = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    assert generator is not None, "openapi-python-client is a dev dependency"
    proc = await asyncio.create_subprocess_exec(
        generator,
        "generate",
        "--path",
        str(where / "openapi.json"),
        "--config",
        str(where / "config.yaml"),
        "--output-path",
        str(where / PACKAGE),
        "--meta",
        "none",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=where,
    )
    output, _ = await proc.communicate()
    assert proc.returncode == 0, output.decode(errors="replace")[-4000:]
    assert b"Warning" not in output, output.decode(errors="replace")[-4000:]
    sys.path.insert(0, str(where))
    return importlib.import_module(PACKAGE)


def remaining(decision: Any) -> list[int]:
    return [state.remaining for state in decision.limits]


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("clean_imports")
async def test_generated_client_checks_and_reads_usage(cluster: Cluster, tmp_path: Path) -> None:
    await generate_client(cluster, tmp_path)
    client_module = importlib.import_module(f"{PACKAGE}.client")
    models = importlib.import_module(f"{PACKAGE}.models")
    check = importlib.import_module(f"{PACKAGE}.api.default.post_v1_check")
    usage = importlib.import_module(f"{PACKAGE}.api.default.get_v1_usage")

    async with client_module.Client(base_url=cluster.router_url) as client:
        # `basic`: a fixed window of 5 per hour
        first = await check.asyncio_detailed(
            client=client, body=models.Check(key="gen:1", rule="basic", cost=4)
        )
        assert first.status_code == 200
        assert isinstance(first.parsed, models.Decision)
        assert (first.parsed.allowed, first.parsed.rule) == (True, "basic")
        assert remaining(first.parsed) == [1]
        assert first.parsed.denied_by == []

        second = await check.asyncio_detailed(
            client=client, body=models.Check(key="gen:1", rule="basic", cost=2)
        )
        assert second.status_code == 429
        assert isinstance(second.parsed, models.Decision)
        assert second.parsed.allowed is False
        assert remaining(second.parsed) == [1]
        assert second.parsed.denied_by == [0]
        assert second.parsed.retry_after_ms > 0

        now = await usage.asyncio(client=client, key="gen:1", rule="basic")
        assert isinstance(now, models.Decision)
        assert (now.allowed, remaining(now)) == (True, [1])

        # inline limits, through the discriminated Limit models: a bucket of 3 that
        # refills one token an hour
        bucket = models.TokenBucket(algorithm="token_bucket", rate=1, period="1h", burst=3)
        inline = models.Check(key="gen:2", limits=[bucket], cost=2)
        taken = await check.asyncio_detailed(client=client, body=inline)
        assert taken.status_code == 200
        assert remaining(taken.parsed) == [1]
        refused = await check.asyncio_detailed(client=client, body=inline)
        assert refused.status_code == 429
        assert remaining(refused.parsed) == [1]
        assert refused.parsed.limits[0].algorithm == "token_bucket"

        # what a schema cannot say (the rule exists) comes back as a Problem
        bad = await check.asyncio_detailed(
            client=client, body=models.Check(key="gen:3", rule="no-such-rule")
        )
        assert bad.status_code == 400
        assert isinstance(bad.parsed, models.Problem)
        assert [(e.field, e.message) for e in bad.parsed.errors] == [
            ("rule", "unknown rule 'no-such-rule'")
        ]
