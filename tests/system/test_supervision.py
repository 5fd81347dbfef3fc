"""`shardlimit up` supervises its children: a node, a replica redis-server or a Sentinel
killed with SIGKILL is started again (one log line each) and serves as before, counts
intact; backoff doubles while a child keeps exiting. `up --replicas 1` stopped and started
again on its data dir brings back the same replicas and Sentinels, on the same ports."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cluster.local.cluster import scratch_cluster
from cluster.local.ports import free_port, free_port_run
from cluster.local.procs import ChildProcess, command_lines, http_ok
from cluster.local.sentinel_proc import SentinelProcess, ask, sentinel_master, wait_for
from cluster.local.supervisor import Restart, Supervisor, Watched

pytestmark = pytest.mark.system
QUOTA = [{"algorithm": "quota", "limit": 1000}]  # no window: nothing rolls over meanwhile


class Up:
    """`shardlimit up --json` as a subprocess, with its summary."""

    def __init__(self, data_dir: Path, port: int, base: int, *extra: str, nodes: int = 2) -> None:
        env = dict(os.environ, SHARDLIMIT_ADMIN_TOKEN="supervision-admin")
        env.pop("SHARDLIMIT_CLUSTER_TOKEN", None)
        args = ["--nodes", str(nodes), "--port", str(port), "--base-port", str(base)]
        args += ["--data-dir", str(data_dir), *extra]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cluster.cli", "up", "--json", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(30)
            raise AssertionError(self.proc.stderr.read().decode())
        self.info: dict[str, Any] = json.loads(line)
        self.router: str = self.info["router"]

    def stop(self) -> list[dict[str, Any]]:
        """SIGINT, as Ctrl-C; up's log lines."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        assert self.proc.returncode == 0
        assert self.proc.stderr is not None
        return [json.loads(line) for line in self.proc.stderr.read().decode().splitlines()]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(60)


def _post(router: str, path: str, body: Any) -> Any:
    request = urllib.request.Request(router + path, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as denied:  # 429 carries the answer too
        if denied.code != 429:
            raise
        return json.loads(denied.read())


def _check(router: str, key: str, cost: int = 1) -> dict[str, Any]:
    answer: dict[str, Any] = _post(router, "/v1/check", {"key": key, "limits": QUOTA, "cost": cost})
    return answer


def _remaining(router: str, key: str) -> int:
    """What the key has left, once its node answers normally (a degraded answer to a
    cost-0 check consumed nothing either way)."""
    found: list[int] = []

    def answered() -> bool:
        answer = _check(router, key, cost=0)
        if answer.get("degraded"):
            return False
        found.append(answer["limits"][0]["remaining"])
        return True

    wait_for(answered, 30, f"{key} answered normally")
    return found[0]


def _key_on(router: str, node: str) -> str:
    for i in range(1000):
        with urllib.request.urlopen(f"{router}/v1/locate?key=acct:{i}", timeout=5) as response:
            if json.loads(response.read())["node"] == node:
                return f"acct:{i}"
    raise AssertionError(f"no key of 1,000 on {node}")


def _pids_of(text: str) -> list[int]:
    return [pid for pid, cmdline in command_lines() if text in cmdline]


def _pid(port: int) -> int | None:
    """The process id a redis-server or Sentinel on `port` reports (None: no answer)."""
    info = ask("127.0.0.1", port, "INFO", "server")
    return None if info is None else int(info["process_id"])


def _replica_online(primary: int, replica: int) -> bool:
    info = ask("127.0.0.1", primary, "INFO", "replication")
    if not info or info.get("connected_slaves") != 1:
        return False
    slave = info.get("slave0") or {}
    return bool(slave.get("port") == replica and slave.get("state") == "online")


@pytest.mark.timeout(90)
def test_a_killed_node_is_restarted_and_keeps_its_counts(tmp_path: Path) -> None:
    base = free_port_run(2)
    up = Up(tmp_path / "data", free_port(avoid=range(base, base + 2)), base)
    try:
        key = _key_on(up.router, "n1")
        for _ in range(3):
            assert _check(up.router, key)["allowed"] is True
        assert _remaining(up.router, key) == 997
        [pid] = _pids_of(f"--id n1 --host 127.0.0.1 --port {base} ")
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: (
                _pids_of(f"--id n1 --host 127.0.0.1 --port {base} ") not in ([], [pid])
                and http_ok(f"http://127.0.0.1:{base}/healthz")
            ),
            30,
            "node n1 restarted",
        )
        assert _remaining(up.router, key) == 997
        assert _check(up.router, key)["limits"][0]["remaining"] == 996
    finally:
        lines = up.stop()
    restarts = [line for line in lines if line.get("child") == "node-n1"]
    assert [line["message"].split(";")[0] for line in restarts] == [
        "node-n1 was killed by SIGKILL: restarting it in 0.5 s (restart 1)"
    ]
    assert restarts[0]["level"] == "WARNING" and restarts[0]["restart_in_s"] == 0.5


@pytest.mark.timeout(90)
def test_a_killed_replica_rejoins_and_a_killed_sentinel_comes_back(tmp_path: Path) -> None:
    reports: list[Restart] = []
    with scratch_cluster(1, data_dir=tmp_path / "c", replicas=1) as local:
        assert local.replication is not None
        local.supervise(reports.append)
        primary = local.redis[0]
        [replica] = local.replication.shards["n1"]
        wait_for(lambda: _replica_online(primary.port, replica.port), 30, "the replica syncs")
        killed = _pid(replica.port)
        replica.kill()
        wait_for(
            lambda: (
                _pid(replica.port) not in (None, killed)
                and _replica_online(primary.port, replica.port)
            ),
            30,
            "the replica restarted and online again",
        )
        sentinel = local.replication.sentinels[0]
        killed = _pid(sentinel.port)
        sentinel.kill()
        wait_for(lambda: _pid(sentinel.port) not in (None, killed), 30, "the Sentinel restarted")
        assert ask(sentinel.host, sentinel.port, "SENTINEL", "MASTER", "n1") is not None
    assert [(r.name, r.returncode, r.attempt) for r in reports] == [
        (f"redis-server :{replica.port}", -9, 1),
        (f"redis-sentinel :{sentinel.port}", -9, 1),
    ]


def _role(port: int) -> tuple[str, int | None]:
    """("master", None), or ("slave", the port it replicates); ("", None): no answer."""
    role = ask("127.0.0.1", port, "ROLE")
    if not role:
        return "", None
    return role[0].decode(), (int(role[2]) if role[0] == b"slave" else None)


def _ready_for_failover(sentinels: list[SentinelProcess]) -> bool:
    """Every Sentinel knows the replica and the 2 other Sentinels (a majority to elect)."""
    for sentinel in sentinels:
        replicas = ask(*sentinel.address, "SENTINEL", "REPLICAS", "n1") or []
        others = ask(*sentinel.address, "SENTINEL", "SENTINELS", "n1") or []
        if len(replicas) != 1 or len(others) != 2:
            return False
    return True


@pytest.mark.timeout(90)
def test_a_killed_primary_comes_back_as_a_replica_of_the_promoted_one(tmp_path: Path) -> None:
    data = tmp_path / "c"
    with scratch_cluster(1, data_dir=data, replicas=1) as local:
        assert local.replication is not None
        # Later than a failover takes: the restart finds the replica promoted.
        local.supervise().first_delay = 5.0
        primary, [replica] = local.redis[0], local.replication.shards["n1"]
        sentinels = local.replication.sentinels
        for _ in range(4):
            assert _check(local.router_url, "acct:1")["allowed"] is True
        wait_for(lambda: _ready_for_failover(sentinels), 30, "the Sentinels know the shard")
        primary.kill()
        wait_for(
            lambda: all(
                sentinel_master([s], "n1") == (replica.host, replica.port) for s in sentinels
            ),
            30,
            "every Sentinel names the promoted replica",
        )
        wait_for(
            lambda: _role(primary.port) == ("slave", replica.port),
            30,
            "the old primary restarted, replicating the promoted one",
        )
        assert _role(replica.port) == ("master", None)
        assert _remaining(local.router_url, "acct:1") == 996
    # Started again on its data dir, the shard keeps the primary the Sentinels chose.
    with scratch_cluster(1, data_dir=data, replicas=1) as again:
        assert again.replication is not None
        assert (again.redis[0].port, again.replication.shards["n1"][0].port) == (
            primary.port,
            replica.port,
        )
        assert _role(replica.port) == ("master", None)
        wait_for(
            lambda: _role(primary.port) == ("slave", replica.port), 30, "the old primary follows"
        )
        assert _remaining(again.router_url, "acct:1") == 996
        assert _check(again.router_url, "acct:1")["limits"][0]["remaining"] == 995


@pytest.mark.timeout(90)
def test_up_again_brings_back_the_replicas_and_sentinels_on_their_ports(tmp_path: Path) -> None:
    data, base = tmp_path / "data", free_port_run(1)
    port = free_port(avoid={base})
    up = Up(data, port, base, "--replicas", "1", nodes=1)
    try:
        [node] = up.info["nodes"]
        assert len(node["replicas"]) == 1 and len(node["sentinels"]) == 3
        assert node["redis"].startswith("redis+sentinel://")
        assert _check(up.router, "acct:1", cost=3)["allowed"] is True
        assert _remaining(up.router, "acct:1") == 997
    finally:
        up.stop()
    shape = (node["redis"], node["redis_port"], node["replicas"], node["sentinels"])
    for extra in (("--replicas", "1"), ()):
        again = Up(data, port, base, *extra, nodes=1)
        try:
            [node] = again.info["nodes"]
            assert (node["redis"], node["redis_port"], node["replicas"], node["sentinels"]) == shape
            if extra:
                assert again.info["notes"] == []
            else:  # the data dir keeps the count it was started with, and up says so
                assert any("--replicas 1" in note for note in again.info["notes"]), again.info
            shard = node["redis_port"], node["replicas"][0]
            wait_for(functools.partial(_replica_online, *shard), 30, "the replica follows")
            assert _remaining(again.router, "acct:1") == 997
        finally:
            again.stop()


@pytest.mark.timeout(60)
def test_backoff_doubles_to_its_longest_and_starts_over_once_a_child_stays_up(
    tmp_path: Path,
) -> None:
    child = ChildProcess(
        "flaky", [sys.executable, "-c", "raise SystemExit(3)"], log=tmp_path / "flaky.log"
    )
    now = [100.0]
    reports: list[Restart] = []
    supervisor = Supervisor([Watched(child)], reports.append, clock=lambda: now[0])
    child.spawn()
    try:
        for _ in range(7):
            wait_for(lambda: not child.alive, 10, "the child exits")
            supervisor.tick()  # notices the exit: schedules a restart
            now[0] += reports[-1].delay - 0.01
            supervisor.tick()  # too early
            assert not child.alive
            now[0] += 0.01
            supervisor.tick()  # starts it again
        assert [(r.delay, r.at_max, r.returncode) for r in reports] == [
            (0.5, False, 3),
            (1.0, False, 3),
            (2.0, False, 3),
            (4.0, False, 3),
            (8.0, False, 3),
            (10.0, True, 3),
            (10.0, True, 3),
        ]
        assert "keeps exiting: restarting it every 10 s" in reports[-1].message
        # A child that stays up 30 s is back to the shortest delay when it exits.
        wait_for(lambda: not child.alive, 10, "the child exits")
        child.args = [sys.executable, "-c", "import signal; signal.pause()"]
        supervisor.tick()
        now[0] += reports[-1].delay
        supervisor.tick()
        assert child.alive
        now[0] += 30
        supervisor.tick()
        child.kill()
        supervisor.tick()
        assert (reports[-1].delay, reports[-1].attempt, reports[-1].returncode) == (0.5, 1, -9)
        supervisor.halt()
        now[0] += 1
        supervisor.tick()
        assert not child.alive  # halted: no restart
    finally:
        supervisor.close()
        child.stop()
