"""`shardlimit up` end to end: real processes, a real check, clean shutdown, no orphans."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from cluster.local.ports import free_port, free_port_run
from cluster.local.procs import command_lines
from tests.support.up_process import UpProcess


def consecutive_free_ports(count: int) -> int:
    return free_port_run(count)


def processes_mentioning(text: str) -> list[int]:
    return [pid for pid, cmdline in command_lines() if text in cmdline]


def listening_addresses(ports: set[int]) -> dict[int, str]:
    """Local address of each listening TCP socket on one of `ports` (from /proc/net)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(port_hex, 16) in ports:  # 0A = LISTEN
                found[int(port_hex, 16)] = address
    return found


def secrets_leaked(secret: str, data_dir: Path) -> list[str]:
    """Where a secret shows: log files under data_dir, or any process command line."""
    leaks = [str(p) for p in data_dir.rglob("*.log") if secret in p.read_text(errors="replace")]
    return leaks + [f"cmdline of {pid}" for pid in processes_mentioning(secret)]


def cluster_token_of(pid: int) -> str:
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        name, _, value = item.decode().partition("=")
        if name == "SHARDLIMIT_CLUSTER_TOKEN":
            return value
    raise AssertionError(f"process {pid} has no cluster token")


@pytest.mark.timeout(90)
def test_up_serves_then_stops_every_child(tmp_path: Path) -> None:
    data_dir = tmp_path / "cluster-data"
    port = free_port()
    base = consecutive_free_ports(2)
    env = dict(os.environ, SHARDLIMIT_ADMIN_TOKEN="admin-from-env")
    env.pop("SHARDLIMIT_CLUSTER_TOKEN", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            "up",
            "--json",
            "--nodes",
            "2",
            "--port",
            str(port),
            "--base-port",
            str(base),
            "--data-dir",
            str(data_dir),
            "--partitioner",
            "slots",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read().decode() if proc.stderr else ""
        info = json.loads(line)
        assert info["admin_token"] == "admin-from-env"
        assert [n["id"] for n in info["nodes"]] == ["n1", "n2"]
        # No --replicas: one Redis per node, no Sentinel.
        assert [(n["replicas"], n["sentinels"]) for n in info["nodes"]] == [([], [])] * 2
        router = info["router"]
        request = urllib.request.Request(
            router + "/v1/check",
            data=json.dumps(
                {
                    "key": "u:1",
                    "limits": [{"algorithm": "fixed_window", "limit": 1, "window": "1h"}],
                }
            ).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            body = json.loads(response.read())
        assert body["allowed"] is True and body["node"] in ("n1", "n2")
        with urllib.request.urlopen(router + "/v1/cluster", timeout=5) as response:
            cluster = json.loads(response.read())
        assert cluster["partitioner"] == "slots" and len(cluster["nodes"]) == 2
        # Redis runs with AOF under the data dir.
        assert (data_dir / "redis-n1").is_dir()
        assert len(processes_mentioning(str(data_dir))) >= 2
        # Every listener is on the loopback interface only (127.0.0.1 = 0100007F).
        redis_ports = {int(n["redis"].rsplit(":", 1)[1].split("/")[0]) for n in info["nodes"]}
        ports = {port, base, base + 1, *redis_ports}
        assert listening_addresses(ports) == dict.fromkeys(ports, "0100007F")
        # Secrets travel in the environment: never on a command line or in a log.
        node_pid = processes_mentioning(f"--port {base} ")[0]
        cluster_token = cluster_token_of(node_pid)
        assert len(cluster_token) >= 24
        assert secrets_leaked(cluster_token, data_dir) == []
        assert secrets_leaked("admin-from-env", data_dir) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0
    # --json: every log line is a JSON object, up's own (stderr) and the children's.
    assert proc.stderr is not None
    up_lines = proc.stderr.read().decode().splitlines()
    assert [json.loads(line)["message"] for line in up_lines] == [
        "stopped: router, nodes and Redis processes are down"
    ]
    logs = sorted(p.name for p in (data_dir / "logs").iterdir())
    assert logs == ["node-n1.log", "node-n2.log", "router.log"]
    for name in logs:
        lines = (data_dir / "logs" / name).read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert records and all({"ts", "level", "logger", "message"} <= set(r) for r in records)
        assert any(r["message"].startswith("listening on http://127.0.0.1:") for r in records)
    assert processes_mentioning(str(data_dir)) == []
    for node_port in (base, base + 1, port):
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", node_port)) != 0, f"port {node_port} still open"
    assert any((data_dir / "redis-n1").rglob("*.aof"))


@pytest.mark.timeout(60)
def test_up_help_names_replicas_and_supervision() -> None:
    def up(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "cluster.cli", "up", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=30)

    shown = up("--help")
    assert shown.returncode == 0
    for text in ("--replicas N", "--down-after-ms MS", "Sentinels", "is restarted"):
        assert text in shown.stdout, text
    refused = up("--replicas", "-1")
    assert refused.returncode == 2
    assert "argument --replicas: must be a whole number from 0 to 8, not '-1'" in refused.stderr


@pytest.mark.timeout(90)
def test_up_serves_on_the_port_its_config_names(tmp_path: Path) -> None:
    """Without --port, the first router listens where --config's router.port says."""
    port = free_port()
    base = consecutive_free_ports(1)
    config = tmp_path / "cluster.yaml"
    config.write_text(f"router:\n  port: {port}\ncluster: {{}}\n")
    args = ["--config", str(config), "--nodes", "1", "--base-port", str(base)]
    with UpProcess([*args, "--data-dir", str(tmp_path / "data")]) as up:
        up.wait_ready()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/cluster", timeout=5) as response:
            cluster = json.loads(response.read())
        assert [node["id"] for node in cluster["nodes"]] == ["n1"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "router: [\n",
            ":2:1: not YAML: expected the node content, but found '<stream end>' "
            "(while parsing a flow node)",
        ),
        (
            "router: {nodee_deadline: 2s}\n",
            ": router.nodee_deadline: unknown setting; did you mean 'node_deadline'?",
        ),
        ("router: {port: http}\n", ": router.port: must be a TCP port number"),
    ],
    ids=["not-yaml", "typo", "port"],
)
def test_up_refuses_a_config_the_router_could_not_serve_before_starting_anything(
    tmp_path: Path, text: str, says: str
) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(text)
    data_dir = tmp_path / "data"
    up = [sys.executable, "-m", "cluster.cli", "up", "--config", str(config)]
    done = subprocess.run(
        [*up, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        f"shardlimit up: {config}{says}\n",
    )
    assert not data_dir.exists()
