"""A refused edit of the live rules file shows where people look: the `up` console,
`shardlimit status`, `GET /v1/rules` (its `file` block) and `/ui`, with its cause
(file:line:column for YAML) and the rules version still served; an edit accepted again
clears it. Real processes: `shardlimit up`, its routers, nodes and Redis, Chromium."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.cdp import chromium_path, launch
from tests.support.up_process import UpProcess, up_ports

pytestmark = pytest.mark.timeout(240)

GOOD = """rules:
  basic:
    limits: 5/minute
  login:
    limits:
      - {algorithm: sliding_log, limit: 5, window: 15m}
"""
BROKEN = """rules:
  basic:
    limits: [5/minute
  login:
"""
WITHOUT_LOGIN = """rules:
  basic:
    limits: 5/minute
"""
UI_LINE_JS = "document.getElementById('rules-file')"


def rules_of(router: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{router}/v1/rules", timeout=5) as answer:
        body: dict[str, Any] = json.loads(answer.read())
    return body


def wait_for_file_block(router: str, wanted: Any, within: float = 30.0) -> dict[str, Any]:
    """GET /v1/rules, polled until its `file.rejected` is `wanted` (None: not rejected)
    or, for a string, its cause is that string."""
    give_up = time.monotonic() + within
    while True:
        body = rules_of(router)
        rejected = body["file"]["rejected"]
        if (rejected is None and wanted is None) or (
            rejected is not None and rejected["cause"] == wanted
        ):
            return body
        assert time.monotonic() < give_up, body
        time.sleep(0.1)  # polling cadence


def status_lines(router: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "status", "--router", router],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


async def ui_line(router: str, text: str) -> tuple[bool, str]:
    """(hidden, text) of the page's rules-file line, once it reads `text`."""
    async with launch() as browser:
        page = await browser.new_page()
        await page.goto(router + "/ui")
        await page.wait_for(f"{UI_LINE_JS}.textContent === {json.dumps(text)}", within=30)
        shown: list[Any] = await page.evaluate(f"[{UI_LINE_JS}.hidden, {UI_LINE_JS}.textContent]")
        return bool(shown[0]), str(shown[1])


def test_a_refused_rules_file_edit_shows_everywhere(tmp_path: Path) -> None:
    rules = (tmp_path / "rules.yaml").resolve()
    rules.write_text(GOOD)
    config = tmp_path / "cluster.yaml"
    config.write_text("router: {rules_file: rules.yaml, rules_poll: 100ms}\n")
    args = ["--config", str(config), "--data-dir", str(tmp_path / "data"), *up_ports(2)]
    with UpProcess(args) as up:
        up.wait_ready()
        router = next(line for line in up.seen() if line.startswith("shardlimit is up: "))
        router = router.split("router ")[1].split(" ")[0]
        version = rules_of(router)["version"]
        assert rules_of(router)["file"] == {"path": str(rules), "rejected": None}

        rules.write_text(BROKEN)
        cause = (
            f"{rules}:4:8: not YAML: expected ',' or ']', but got ':' "
            "(while parsing a flow sequence)"
        )
        body = wait_for_file_block(router, cause)
        assert body["version"] == version
        rejected = body["file"]["rejected"]
        assert rejected["serving_version"] == version
        line = (
            f"rules file rejected at {rejected['at']}: {cause}; "
            f"still serving rules version {version}"
        )
        assert up.wait_for(lambda said: said == line, within=10) == line
        assert status_lines(router)[-1] == line
        if chromium_path() is not None:
            assert asyncio.run(ui_line(router, line)) == (False, line)

        rules.write_text(WITHOUT_LOGIN)  # valid YAML, but it would delete a rule
        deleting = (
            f"{rules}: not published: it would delete login; "
            "`shardlimit rules apply -f FILE --prune` deletes rules"
        )
        body = wait_for_file_block(router, deleting)
        assert [rule["name"] for rule in body["rules"]] == ["basic", "login"]
        rejected = body["file"]["rejected"]
        line = (
            f"rules file rejected at {rejected['at']}: {deleting}; "
            f"still serving rules version {version}"
        )
        assert up.wait_for(lambda said: said == line, within=10) == line
        assert status_lines(router)[-1] == line

        rules.write_text(GOOD.replace("5/minute", "7/minute"))  # accepted: published
        body = wait_for_file_block(router, None)
        assert body["version"] == version + 1
        accepted = f"rules file accepted again: {rules}"
        assert up.wait_for(lambda said: said == accepted, within=10) == accepted
        assert not any(said.startswith("rules file rejected") for said in status_lines(router))
        if chromium_path() is not None:
            assert asyncio.run(ui_line(router, "")) == (True, "")
    assert up.proc.returncode == 0
    if chromium_path() is None:
        pytest.skip("no chromium on PATH: /ui was not checked (apt-get install chromium)")
