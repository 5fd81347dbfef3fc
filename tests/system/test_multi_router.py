"""Several router processes over the same nodes: rules as cluster state, shared counters,
topology changes through one router while others serve, a router started mid-migration.

Everything is a real process: `shardlimit up --routers 3` (3 Redis, 3 nodes, 3 routers),
an extra node with its own Redis for `node add`, and load from `cluster.local.loadgen`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from multidict import CIMultiDict

from cluster.local.cluster import node_process, router_process
from cluster.local.loadgen import start_loadgen
from cluster.local.procs import ChildProcess, child_preexec
from cluster.local.redis_proc import RedisProcess, free_port
from tests.conftest import eventually
from tests.system.test_cli_up import consecutive_free_ports

pytestmark = pytest.mark.timeout(180)

ADMIN = "multi-router-admin"
CLUSTER_TOKEN = "multi-router-cluster"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}


def _env() -> dict[str, str]:
    return dict(os.environ, SHARDLIMIT_ADMIN_TOKEN=ADMIN, SHARDLIMIT_CLUSTER_TOKEN=CLUSTER_TOKEN)


@dataclass
class Cluster:
    """`shardlimit up --routers 3` and spare node processes for `node add`."""

    workdir: Path
    up: subprocess.Popen[str]
    info: dict[str, Any]
    http: aiohttp.ClientSession
    extra: list[ChildProcess] = field(default_factory=list)
    extra_redis: list[RedisProcess] = field(default_factory=list)

    @property
    def routers(self) -> list[str]:
        urls: list[str] = self.info["routers"]
        return urls

    async def request(
        self, method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, CIMultiDict[str]]:
        async with self.http.request(method, url, json=body, headers=headers) as resp:
            raw = await resp.read()
            return resp.status, json.loads(raw) if raw else None, CIMultiDict(resp.headers)

    async def check(self, router: str, body: dict[str, Any]) -> dict[str, Any]:
        status, decision, _ = await self.request("POST", router + "/v1/check", body)
        assert status in (200, 429), decision
        assert decision["degraded"] is False, decision
        result: dict[str, Any] = decision
        return result

    def spare_node(self, node_id: str) -> str:
        """A node process with its own Redis, not yet in the cluster: its URL."""
        redis = RedisProcess(port=free_port(), data_dir=self.workdir / f"redis-{node_id}")
        redis.start()
        self.extra_redis.append(redis)
        port = free_port()
        node = node_process(
            node_id, port, redis.url, log=self.workdir / f"{node_id}.log", env=_env()
        )
        self.extra.append(node)
        node.start()
        return f"http://127.0.0.1:{port}"

    def start_router(self, name: str, *, rules_file: bool = True) -> str:
        """One more router process, from a config of its own (a brand-new data dir;
        without `rules_file`, no rules file at all)."""
        base = yaml.safe_load((Path(self.info["data_dir"]) / "cluster.yaml").read_text())
        port = free_port()
        base["router"].update(port=port, data_dir=str(self.workdir / name))
        if not rules_file:
            del base["router"]["rules_file"]
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(base))
        url = f"http://127.0.0.1:{port}"
        router = router_process(name, path, url, log=self.workdir / f"{name}.log", env=_env())
        self.extra.append(router)
        router.start()
        return url


def _start_up(workdir: Path, router_settings: dict[str, Any]) -> tuple[subprocess.Popen[str], Any]:
    config = workdir / "base.yaml"
    config.write_text(yaml.safe_dump({"router": router_settings, "cluster": {"nodes": []}}))
    port = consecutive_free_ports(3)
    base_port = consecutive_free_ports(3)
    while abs(base_port - port) < 3:  # two runs picked while neither was bound yet
        base_port = consecutive_free_ports(3)
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            "up",
            "--routers",
            "3",
            "--nodes",
            "3",
            "--port",
            str(port),
            "--base-port",
            str(base_port),
            "--data-dir",
            str(workdir / "data"),
            "--config",
            str(config),
            "--json",
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=child_preexec,
    )
    assert up.stdout is not None
    line = up.stdout.readline()
    if not line:
        up.wait(10)
        raise RuntimeError(f"shardlimit up failed: {up.stderr.read() if up.stderr else ''}")
    return up, json.loads(line)


def _stop(up: subprocess.Popen[str], extra: list[ChildProcess]) -> None:
    for child in extra:
        child.terminate()
    for child in extra:
        child.wait_stopped(10)
    up.send_signal(signal.SIGTERM)
    try:
        up.wait(30)
    except subprocess.TimeoutExpired:
        up.kill()
        up.wait()


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Router settings for `cluster`: none, or a test's (parametrize it, indirect)."""
    given: dict[str, Any] = getattr(request, "param", {})
    return given


@pytest.fixture
async def cluster(tmp_path: Path, settings: dict[str, Any]) -> AsyncIterator[Cluster]:
    up, info = _start_up(tmp_path, settings)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    started = Cluster(tmp_path, up, info, http)
    try:
        yield started
    finally:
        await http.close()
        _stop(up, started.extra)
        for redis in started.extra_redis:
            redis.stop()


RULE = {"limits": [{"algorithm": "fixed_window", "limit": 5, "window": "3660d"}]}  # real clock


async def test_a_rule_written_through_one_router_is_served_by_all(
    cluster: Cluster,
) -> None:
    a, b, c = cluster.routers
    status, body, headers = await cluster.request("PUT", a + "/v1/rules/ocr", RULE, ADMIN_HEADERS)
    assert status == 201, body
    version = int(headers["ETag"].strip('"'))

    async def served_everywhere() -> bool:
        for router in (b, c):
            _, listing, _ = await cluster.request("GET", router + "/v1/rules")
            if listing["version"] != version or [r["name"] for r in listing["rules"]] != ["ocr"]:
                return False
        return True

    await eventually(served_everywhere, within=5)

    # A router started later, without any rules file, serves the cluster's rules.
    d = cluster.start_router("router-d", rules_file=False)
    _, listing, _ = await cluster.request("GET", d + "/v1/rules")
    assert listing["version"] == version and [r["name"] for r in listing["rules"]] == ["ocr"]

    # Checks spread over the three routers share one counter, exactly.
    answers = [
        await cluster.check(cluster.routers[i % 3], {"key": "user:1", "rule": "ocr"})
        for i in range(8)
    ]
    assert [a["allowed"] for a in answers] == [True] * 5 + [False] * 3
    assert [a["limits"][0]["remaining"] for a in answers] == [4, 3, 2, 1, 0, 0, 0, 0]


async def test_a_write_against_a_stale_version_gets_409(cluster: Cluster) -> None:
    a, b, _ = cluster.routers
    _, listing, headers = await cluster.request("GET", a + "/v1/rules")
    seen = headers["ETag"]
    assert seen == f'"{listing["version"]}"'
    status, body, headers = await cluster.request(
        "PUT", a + "/v1/rules/one", RULE, {**ADMIN_HEADERS, "If-Match": seen}
    )
    assert status == 201, body
    # Router b still holds the version the writer read: its write is refused, whatever b
    # itself has learnt so far, and nothing of it is stored.
    status, problem, headers_b = await cluster.request(
        "PUT", b + "/v1/rules/two", RULE, {**ADMIN_HEADERS, "If-Match": seen}
    )
    assert status == 409, problem
    assert problem["type"].endswith("/version-conflict")
    assert headers_b["ETag"] == headers["ETag"]
    status, _, _ = await cluster.request("GET", a + "/v1/rules/two")
    assert status == 404
    # Without If-Match, writes from two routers at once both land, one after the other.
    results = await asyncio.gather(
        cluster.request("PUT", a + "/v1/rules/x", RULE, ADMIN_HEADERS),
        cluster.request("PUT", b + "/v1/rules/y", RULE, ADMIN_HEADERS),
    )
    assert sorted(r[0] for r in results) == [201, 201]
    versions = sorted(int(r[2]["ETag"].strip('"')) for r in results)
    assert versions[1] == versions[0] + 1

    async def both_kept() -> bool:
        _, listing, _ = await cluster.request("GET", a + "/v1/rules")
        return bool(listing["version"] == versions[1])

    await eventually(both_kept, within=5)
    _, listing, _ = await cluster.request("GET", a + "/v1/rules")
    assert [r["name"] for r in listing["rules"]] == ["one", "x", "y"]


async def _metric(cluster: Cluster, router: str, name: str) -> float:
    async with cluster.http.get(router + "/metrics", headers=ADMIN_HEADERS) as resp:
        text = await resp.text()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, name
    return values[0]


@pytest.mark.parametrize("settings", [{"rules_poll": "100ms"}], indirect=True)
async def test_routers_sharing_a_rules_file_never_rewrite_it(
    cluster: Cluster, settings: dict[str, Any]
) -> None:
    """`up --routers 3` gives the routers one rules file: API writes through any router
    land in the cluster, every router serves the last of them, and the file is untouched."""
    config = yaml.safe_load((Path(cluster.info["data_dir"]) / "cluster.yaml").read_text())
    rules_file = Path(config["router"]["rules_file"])

    def contents() -> bytes | None:
        return rules_file.read_bytes() if rules_file.exists() else None

    before = contents()
    names = [f"r{i:02d}" for i in range(30)]
    for i, name in enumerate(names):
        router = cluster.routers[i % 3]
        status, body, _ = await cluster.request(
            "PUT", router + f"/v1/rules/{name}", RULE, ADMIN_HEADERS
        )
        assert status == 201, body
    _, listing, _ = await cluster.request("GET", cluster.routers[2] + "/v1/rules")
    final = listing["version"]

    async def everywhere() -> bool:
        for router in cluster.routers:
            _, listing, _ = await cluster.request("GET", router + "/v1/rules")
            if listing["version"] != final or [r["name"] for r in listing["rules"]] != names:
                return False
        return True

    await eventually(everywhere, within=10)
    assert contents() == before
    assert await _metric(cluster, cluster.routers[0], "shardlimit_rules_version") == final


async def test_rules_apply_shows_a_diff_and_applies_a_file(
    cluster: Cluster, tmp_path: Path
) -> None:
    a, _, c = cluster.routers
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n  ocr:\n    limits:\n"
        "      - {algorithm: fixed_window, limit: 100, window: 1d}\n"
        "      - {algorithm: fixed_window, limit: 10, window: 1h}\n"
    )
    dry = await cli("apply", "-f", str(rules), "--dry-run", "--router", a, "--token", ADMIN)
    assert dry.returncode == 0, dry.stderr
    assert "+  ocr:" in dry.stdout and "dry run: 1 added; nothing applied" in dry.stdout
    _, listing, _ = await cluster.request("GET", a + "/v1/rules")
    assert listing["rules"] == []
    applied = await cli("apply", "-f", str(rules), "--router", a, "--token", ADMIN, "--json")
    assert applied.returncode == 0, applied.stderr
    report = json.loads(applied.stdout)
    assert report["applied"] is True and report["added"] == ["ocr"]
    assert report["version"] == report["from_version"] + 1

    async def on_c() -> bool:
        return (await cluster.request("GET", c + "/v1/rules/ocr"))[0] == 200

    await eventually(on_c, within=5)
    got = await cli("get", "--router", c)
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith(f"# rules version {report['version']}\n")
    assert yaml.safe_load(got.stdout)["rules"]["ocr"]["limits"][1]["window"] == "1h"
    again = await cli("apply", "-f", str(rules), "--router", c, "--token", ADMIN)
    assert again.returncode == 0 and again.stdout.startswith("no changes"), again.stdout
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules:\n  bad:\n    limits: [{algorithm: fixed_window, limit: -1}]\n")
    refused = await cli("apply", "-f", str(broken), "--router", a, "--token", ADMIN)
    assert refused.returncode == 2
    assert refused.stderr.startswith("shardlimit: ") and "Traceback" not in refused.stderr


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`shardlimit rules ...` in a child process."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cluster.cli",
        "rules",
        *args,
        env=_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return subprocess.CompletedProcess(list(args), proc.returncode, out.decode(), err.decode())


KEYS = [f"k{i}" for i in range(400)]
LIMITS = [{"algorithm": "fixed_window", "limit": 1000, "window": "3660d"}]  # real clock


def _bodies(path: Path) -> str:
    path.write_text("".join(json.dumps({"key": k, "limits": LIMITS}) + "\n" for k in KEYS))
    return str(path)


async def _remaining(cluster: Cluster, router: str) -> dict[str, int]:
    checks = [{"key": k, "limits": LIMITS, "cost": 0} for k in KEYS]
    status, body, _ = await cluster.request("POST", router + "/v1/check/batch", {"checks": checks})
    assert status == 200, body
    assert not any(r["degraded"] for r in body["results"])
    return {k: r["limits"][0]["remaining"] for k, r in zip(KEYS, body["results"], strict=True)}


async def _migration_done(cluster: Cluster, router: str) -> dict[str, Any]:
    final: dict[str, Any] = {}

    async def done() -> bool:
        _, info, _ = await cluster.request("GET", router + "/v1/cluster")
        migration = info.get("migration")
        if migration and migration.get("last_error"):
            raise AssertionError(migration["last_error"])
        if migration and migration.get("phase") == "done" and not migration["running"]:
            final.update(migration, epoch=info["epoch"])
            return True
        return False

    await eventually(done, within=90)
    return final


async def _checks_served(cluster: Cluster, router: str) -> int:
    async with cluster.http.get(router + "/metrics", headers=ADMIN_HEADERS) as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith('shardlimit_request_duration_seconds_count{endpoint="/v1/check"}'):
            return int(float(line.split()[-1]))
    return 0


async def test_node_add_through_one_router_while_load_flows_through_the_others(
    cluster: Cluster, tmp_path: Path
) -> None:
    a, b, c = cluster.routers
    n4 = cluster.spare_node("n4")
    bodies = _bodies(tmp_path / "bodies.jsonl")
    loads = [
        await start_loadgen(
            router + "/v1/check", connections=32, body="", bodies_file=bodies, per_key=True
        )
        for router in (b, c)
    ]

    async def flowing() -> bool:
        return min([await _checks_served(cluster, r) for r in (b, c)]) >= 300

    await eventually(flowing, within=30)
    status, started, _ = await cluster.request(
        "POST", a + "/v1/cluster/nodes", {"url": n4, "id": "n4"}, ADMIN_HEADERS
    )
    assert status == 202, started
    final = await _migration_done(cluster, a)
    reports = [await load.stop() for load in loads]
    admitted: Counter[str] = Counter()
    for report in reports:
        assert report["errors"] == 0, report["error_samples"]
        assert report["degraded"] == 0, report["degraded_reasons"]
        admitted.update(report["allowed_by_key"])
    assert sum(admitted.values()) == sum(r["allowed"] for r in reports) > 0
    assert final["keys_moved"] > 0
    _, told, _ = await cluster.request("GET", a + "/v1/cluster")

    async def every_router_tells_it() -> bool:
        for router in (b, c):
            _, info, _ = await cluster.request("GET", router + "/v1/cluster")
            if info["migration"] != told["migration"]:
                return False
        return True

    # The routers that did not run it learn its summary with the topology.
    await eventually(every_router_tells_it, within=10)
    for router in (a, b, c):
        remaining = await _remaining(cluster, router)
        assert {k: 1000 - v for k, v in remaining.items() if v != 1000} == dict(admitted)


@pytest.mark.parametrize("second", [1, 0], ids=["through-two-routers", "through-one-router"])
async def test_two_node_adds_at_once_one_runs_the_other_gets_409(
    cluster: Cluster, second: int
) -> None:
    a, c = cluster.routers[0], cluster.routers[2]
    b = cluster.routers[second]
    for i in range(40):
        await cluster.check(cluster.routers[i % 3], {"key": KEYS[i % 10], "limits": LIMITS})
    n4, n5 = cluster.spare_node("n4"), cluster.spare_node("n5")
    results = await asyncio.gather(
        cluster.request("POST", a + "/v1/cluster/nodes", {"url": n4, "id": "n4"}, ADMIN_HEADERS),
        cluster.request("POST", b + "/v1/cluster/nodes", {"url": n5, "id": "n5"}, ADMIN_HEADERS),
    )
    statuses = sorted(r[0] for r in results)
    assert statuses == [202, 409], results
    refused = next(r for r in results if r[0] == 409)[1]
    assert refused["type"].endswith("/reshard-refused")
    assert "lease" in refused["detail"] or "in progress" in refused["detail"]
    winner = a if results[0][0] == 202 else b
    await _migration_done(cluster, winner)

    async def c_knows() -> bool:
        _, info, _ = await cluster.request("GET", c + "/v1/cluster")
        migration = info["migration"] or {}
        return len(info["nodes"]) == 4 and migration.get("phase") == "done"

    await eventually(c_knows, within=10)
    remaining = await _remaining(cluster, c)
    assert {k: v for k, v in remaining.items() if v != 1000} == {k: 996 for k in KEYS[:10]}


@pytest.mark.parametrize(
    "settings", [{"reshard_step_keys": 20, "reshard_lease_ttl": "2s"}], indirect=True
)
async def test_a_new_router_started_mid_migration_serves_and_resumes_it(
    cluster: Cluster, settings: dict[str, Any]
) -> None:
    b = cluster.routers[1]
    many = [f"m{i}" for i in range(6000)]  # enough keys that the move takes a while
    for start in range(0, len(many), 500):
        checks = [{"key": k, "limits": LIMITS, "cost": 3} for k in many[start : start + 500]]
        status, _, _ = await cluster.request("POST", b + "/v1/check/batch", {"checks": checks})
        assert status == 200
    n4 = cluster.spare_node("n4")
    # A router of its own (`shardlimit up` stops everything when one of its children
    # dies) orchestrates the move and dies in the middle of it.
    orchestrator = cluster.start_router("router-a")
    status, _, _ = await cluster.request(
        "POST", orchestrator + "/v1/cluster/nodes", {"url": n4, "id": "n4"}, ADMIN_HEADERS
    )
    assert status == 202

    async def copying() -> bool:
        _, info, _ = await cluster.request("GET", orchestrator + "/v1/cluster")
        migration = info["migration"] or {}
        return bool(migration.get("phase") == "copying" and migration.get("keys_moved", 0) > 0)

    await eventually(copying, within=30)
    cluster.extra[-1].kill()
    d = cluster.start_router("router-d")
    _, info, _ = await cluster.request("GET", d + "/v1/cluster")
    assert info["epoch"] == 2 and info["migration"] is not None  # learnt from the nodes
    moved_so_far = info["migration"].get("keys_moved", 0)
    assert moved_so_far < len(many)  # the move is unfinished
    # It serves keys on both sides of the move exactly...
    for key in many[:: len(many) // 60]:
        answer = await cluster.check(d, {"key": key, "limits": LIMITS})
        assert answer["limits"][0]["remaining"] == 1000 - 3 - 1, key
    # ... and finishes the move.
    status, body, _ = await cluster.request(
        "POST", d + "/v1/cluster/migration/resume", None, ADMIN_HEADERS
    )
    assert status == 202, body
    await _migration_done(cluster, d)
    touched = set(many[:: len(many) // 60])
    for start in range(0, len(many), 1000):
        chunk = many[start : start + 1000]
        checks = [{"key": k, "limits": LIMITS, "cost": 0} for k in chunk]
        status, body, _ = await cluster.request("POST", b + "/v1/check/batch", {"checks": checks})
        assert status == 200 and not any(r["degraded"] for r in body["results"])
        got = {k: r["limits"][0]["remaining"] for k, r in zip(chunk, body["results"], strict=True)}
        assert got == {k: 1000 - 3 - (1 if k in touched else 0) for k in chunk}


async def _removing_n3(cluster: Cluster, prefix: str) -> list[dict[str, Any]]:
    """3,000 keys checked through router a (about 1,000 move when n3 goes), then n3's
    removal started through a, once router b sees it running: the checks made."""
    a, b, _c = cluster.routers
    checks: list[dict[str, Any]] = [{"key": f"{prefix}:{i}", "limits": LIMITS} for i in range(3000)]
    for first in range(0, len(checks), 1000):
        batch = {"checks": checks[first : first + 1000]}
        status, body, _ = await cluster.request("POST", a + "/v1/check/batch", batch)
        assert status == 200 and all(r["allowed"] for r in body["results"])
    status, started, _ = await cluster.request(
        "DELETE", a + "/v1/cluster/nodes/n3", None, ADMIN_HEADERS
    )
    assert status == 202, started

    async def b_sees_it() -> bool:
        _, info, _ = await cluster.request("GET", b + "/v1/cluster")
        migration: dict[str, Any] = info["migration"] or {}
        return bool(migration.get("id") == started["migration"] and migration["phase"] != "done")

    await eventually(b_sees_it, within=10)
    return checks


@pytest.mark.parametrize(
    "settings", [{"reshard_rate": 300, "reshard_lease_ttl": "2s"}], indirect=True
)
async def test_an_abort_through_another_router_never_forks_the_topology(
    cluster: Cluster, settings: dict[str, Any]
) -> None:
    """Router a runs a node's removal; router b, asked to abort it, waits for the lease:
    whatever it answers, every router ends on the one topology the nodes hold, and no
    key is answered degraded."""
    a, b, c = cluster.routers
    checks = await _removing_n3(cluster, "spread")
    status, aborted, _ = await cluster.request(
        "POST", b + "/v1/cluster/migration/abort", None, ADMIN_HEADERS
    )
    assert status in (202, 409), aborted

    async def one_topology() -> bool:
        seen = []
        for router in (a, b, c):
            _, info, _ = await cluster.request("GET", router + "/v1/cluster")
            migration = info["migration"] or {}
            if migration.get("phase") != "done" or migration.get("running"):
                return False
            seen.append((info["epoch"], [n["id"] for n in info["nodes"]]))
        return len(set(map(str, seen))) == 1

    await eventually(one_topology, within=60)
    reads = [{**check, "cost": 0} for check in checks]
    for router in (a, b, c):
        for first in range(0, len(reads), 1000):
            batch = {"checks": reads[first : first + 1000]}
            status, body, _ = await cluster.request("POST", router + "/v1/check/batch", batch)
            assert status == 200
            assert [r["limits"][0]["remaining"] for r in body["results"]] == [999] * 1000
            assert not any(r["degraded"] for r in body["results"])


@pytest.mark.parametrize(
    "settings", [{"reshard_rate": 150, "reshard_lease_ttl": "2s"}], indirect=True
)
async def test_a_resume_through_another_router_than_the_one_running_it_is_refused(
    cluster: Cluster, settings: dict[str, Any]
) -> None:
    """Router a runs a node's removal; a resume through b waits out the lease's TTL, finds
    a still renewing it, and is refused (409), leaving b as it was; a finishes."""
    a, b, _c = cluster.routers
    await _removing_n3(cluster, "slow")
    status, refused, _ = await cluster.request(
        "POST", b + "/v1/cluster/migration/resume", None, ADMIN_HEADERS
    )
    assert status == 409 and refused["type"].endswith("/reshard-refused"), refused
    assert "another router holds the topology lease and keeps it" in refused["detail"]
    _, info, _ = await cluster.request("GET", b + "/v1/cluster")
    assert info["migration"]["running"] is False, info["migration"]
    await _migration_done(cluster, a)
    _, info, _ = await cluster.request("GET", a + "/v1/cluster")
    assert [n["id"] for n in info["nodes"]] == ["n1", "n2"]


async def test_every_router_tells_the_last_migration_whichever_ran_it(cluster: Cluster) -> None:
    """a adds n4, then b removes it: a then tells b's migration, not its own older one."""
    a, b, c = cluster.routers
    n4 = cluster.spare_node("n4")
    status, added, _ = await cluster.request(
        "POST", a + "/v1/cluster/nodes", {"url": n4, "id": "n4"}, ADMIN_HEADERS
    )
    assert status == 202, added
    await _migration_done(cluster, a)
    await _migration_done(cluster, b)  # b learnt of it
    status, removed, _ = await cluster.request(
        "DELETE", b + "/v1/cluster/nodes/n4", None, ADMIN_HEADERS
    )
    assert status == 202, removed
    await _migration_done(cluster, b)

    async def all_tell_the_removal() -> bool:
        for router in (a, b, c):
            _, info, _ = await cluster.request("GET", router + "/v1/cluster")
            if (info["migration"] or {}).get("id") != removed["migration"]:
                return False
        return True

    await eventually(all_tell_the_removal)
