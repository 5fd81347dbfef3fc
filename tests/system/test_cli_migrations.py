"""`node add|remove` follow the migration they started, not whichever is current: one
aborted meanwhile ends them with one line and exit 1, Ctrl-C with one line and 130 while
the migration goes on; `--no-wait` says what started as text. And `usage` of a key whose
node is down says so in one line, without None."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.local.cluster import LocalCluster, scratch_cluster

pytestmark = pytest.mark.timeout(120)
KEYS = 1200  # about 400 a node: at 100 keys/s, a node's keys take seconds to move


def _http(local: LocalCluster, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    call = urllib.request.Request(local.router_url + path, data=data, method=method)
    call.add_header("Content-Type", "application/json")
    call.add_header("Authorization", f"Bearer {local.admin_token}")
    with urllib.request.urlopen(call, timeout=30) as answer:
        return json.loads(answer.read())


def _env(local: LocalCluster) -> dict[str, str]:
    return dict(
        os.environ,
        SHARDLIMIT_ROUTER=local.router_url,
        SHARDLIMIT_ADMIN_TOKEN=local.admin_token,
        COLUMNS="200",
    )


def _cli(local: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args],
        capture_output=True,
        text=True,
        env=_env(local),
        timeout=60,
        check=False,
    )


def _interruptible() -> None:
    """In the child: Ctrl-C as at a terminal. A suite started in the background by a
    shell (`make test &`) inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _started(local: LocalCluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cluster.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(local),
        preexec_fn=_interruptible,
    )


def _until(what: str, condition: Callable[[], bool], within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {within_s} s"
        time.sleep(0.05)


def _migration(local: LocalCluster) -> dict[str, Any]:
    return _http(local, "GET", "/v1/cluster").get("migration") or {}


def _copying(local: LocalCluster) -> bool:
    migration = _migration(local)
    return bool(migration.get("running")) and migration.get("phase") == "copying"


def _over(local: LocalCluster) -> bool:
    migration = _migration(local)
    return migration.get("phase") == "done" and not migration.get("running")


def _members(local: LocalCluster) -> list[str]:
    return [node["id"] for node in _http(local, "GET", "/v1/cluster")["nodes"]]


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def _config(directory: Path, **router: object) -> Path:
    """A cluster.yaml with these router settings and an empty rules file."""
    (directory / "rules.yaml").write_text("rules: {}\n")
    config = directory / "cluster.yaml"
    settings = {"rules_file": "rules.yaml", **router}
    config.write_text(yaml.safe_dump({"router": settings, "cluster": {"partitioner": "ring"}}))
    return config


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes whose router moves 100 keys/s a source, holding KEYS counters."""
    data_dir = tmp_path_factory.mktemp("cli-migrations")
    config = _config(data_dir, reshard_rate=100, reshard_step_keys=10)
    with scratch_cluster(3, data_dir=data_dir / "cluster", config=config) as local:
        limits = [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]
        for start in range(0, KEYS, 600):  # a batch takes up to 1,000 checks
            checks = [{"key": f"moving:{i}", "limits": limits} for i in range(start, start + 600)]
            answer = _http(local, "POST", "/v1/check/batch", {"checks": checks})
            assert all(result["allowed"] for result in answer["results"])
        yield local


def test_node_remove_aborted_meanwhile_says_so_and_exits_1(slow: LocalCluster) -> None:
    _until("over", lambda: _over(slow) or not _migration(slow))
    remove = _started(slow, "node", "remove", "n3")
    try:
        _until("copying", lambda: _copying(slow))
        abort = _cli(slow, "reshard", "abort", "--no-wait")
        assert abort.returncode == 0, abort.stderr
        assert re.fullmatch(
            r"started: migration \w+, undoing migration \w+, epoch \d+ "
            r"\(`shardlimit reshard status` to follow it\)\n",
            abort.stdout,
        ), abort.stdout
        _, stderr = remove.communicate(timeout=60)
    finally:
        remove.kill()
        remove.wait()
    assert remove.returncode == 1, stderr
    line = _one_line(stderr)
    assert re.fullmatch(
        r"shardlimit: migration (\w+) was aborted \(migration \w+ returns to the previous "
        r"layout\): the change was not made",
        line,
    ), line
    _until("reverted", lambda: _over(slow))
    assert _members(slow) == ["n1", "n2", "n3"]


def test_ctrl_c_while_following_leaves_the_migration_going(slow: LocalCluster) -> None:
    _until("over", lambda: _over(slow) or not _migration(slow))
    remove = _started(slow, "node", "remove", "n2")
    try:
        _until("copying", lambda: _copying(slow))
        remove.send_signal(signal.SIGINT)
        _, stderr = remove.communicate(timeout=60)
    finally:
        remove.kill()
        remove.wait()
    assert remove.returncode == 130, stderr
    assert re.fullmatch(
        r"shardlimit: stopped following migration \w+: it goes on in the cluster "
        r"\(`shardlimit reshard status` to follow it\)",
        _one_line(stderr),
    ), stderr
    _until("done", lambda: _over(slow))
    assert "n2" not in _members(slow)


def test_usage_of_a_key_on_a_down_node_says_so(tmp_path: Path) -> None:
    with scratch_cluster(2, data_dir=tmp_path / "usage", config=_config(tmp_path)) as local:
        rules = {
            "cli-down-held": [{"algorithm": "concurrency", "limit": 3, "lease": "30s"}],
            "cli-down-window": [{"algorithm": "fixed_window", "limit": 5, "window": "1m"}],
            "cli-both-quota": [{"algorithm": "quota", "limit": 10, "max_amount": "100.00"}],
            "cli-both-calendar": [
                {"algorithm": "calendar", "period": "day", "max_count": 4, "max_amount": "9.50"}
            ],
        }
        for name, limits in rules.items():
            _http(local, "PUT", f"/v1/rules/{name}", {"limits": limits})
        key = next(
            f"down:{i}"
            for i in range(1000)
            if _http(local, "GET", f"/v1/locate?key=down:{i}")["node"] == "n2"
        )
        quota = _cli(local, "usage", key, "--rule", "cli-both-quota")
        assert quota.returncode == 0, quota.stderr
        assert quota.stdout.splitlines()[1] == (
            "  quota: remaining 10 of 10, amount remaining 100.00 of 100.00"
        )
        calendar = _cli(local, "usage", key, "--rule", "cli-both-calendar")
        assert calendar.returncode == 0, calendar.stderr
        assert re.fullmatch(
            r"  calendar \(day\): remaining 4 of 4, amount remaining 9\.50 of 9\.50, "
            r"resets in .+",
            calendar.stdout.splitlines()[1],
        ), calendar.stdout
        local.nodes[1].kill()
        for rule in ("cli-down-held", "cli-down-window"):
            done = _cli(local, "usage", key, "--rule", rule)
            assert (done.returncode, done.stdout) == (1, ""), done.stderr
            line = _one_line(done.stderr)
            assert line.startswith(
                f"shardlimit: usage of {key} ({rule}) unknown: its node n2 could not answer ("
            ), line
            assert "None" not in line
