"""compose/docker-compose.yml runs replicated shards on Redis Sentinel, and the start
scripts of compose/redis/ (shared with compose/kubernetes/) do what they say.

No Docker engine on the build machines: the Compose file is checked against the Compose
spec and against the code (the nodes' command lines parse with the real `shardlimit`
parser, their redis+sentinel:// URLs with the real URL parser), and the scripts run here
under `sh` with a stand-in `redis-cli` that answers as the Sentinels would.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import stat
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from cluster.cli.parser import build_parser
from cluster.model.sentinel_url import parse_sentinel_url
from router.config import load_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
SCRIPTS = COMPOSE / "redis"
SENTINEL_PORT = 26379
REDIS_PORT = 6379

Service = dict[str, Any]


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    return doc


def services() -> dict[str, Service]:
    found: dict[str, Service] = compose()["services"]
    return found


def node_ids() -> list[str]:
    return [n.id for n in load_config(COMPOSE / "cluster.yaml").nodes]


def sentinel_services() -> list[str]:
    return sorted(name for name in services() if name.startswith("sentinel-"))


def sentinel_conf() -> list[list[str]]:
    text = (SCRIPTS / "sentinel.conf").read_text()
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def script_mount(service: Service) -> None:
    assert "./redis:/redis:ro" in service["volumes"]


# ---------------------------------------------------------------- the Compose file


def test_compose_file_matches_the_compose_spec_with_sentinels_and_replicas() -> None:
    schema = json.loads((COMPOSE / "compose-spec.json").read_text())
    doc = compose()
    jsonschema.Draft7Validator(schema).validate(doc)
    shards = [f"redis{i}{suffix}" for i in (1, 2, 3) for suffix in ("", "-replica")]
    assert set(doc["services"]) == {
        "router",
        *(f"node{i}{endpoint}" for i in (1, 2, 3) for endpoint in ("", "-b")),
        *shards,
        *(f"sentinel-{i}" for i in (1, 2, 3)),
    }
    assert set(doc["volumes"]) == {"router-data", *(f"{name}-data" for name in shards)}


def test_no_command_needs_compose_interpolation() -> None:
    """Compose expands `$` in the file: the scripts live in compose/redis/, not inline."""
    for name, service in services().items():
        for word in [*service.get("command", []), *service.get("environment", {}).values()]:
            assert "$" not in str(word) or str(word).startswith("${SHARDLIMIT_"), (name, word)


def test_each_node_finds_its_shard_through_the_three_sentinels() -> None:
    expected = tuple((name, SENTINEL_PORT) for name in sentinel_services())
    assert len(expected) == 3
    ids = node_ids()
    for i, node_id in enumerate(ids, start=1):
        for endpoint in (f"node{i}", f"node{i}-b"):
            service = services()[endpoint]
            args = build_parser().parse_args(service["command"])
            assert args.id == node_id
            url = parse_sentinel_url(args.redis)
            assert url.master == node_id
            assert url.sentinels == expected
            assert url.db == 0
            assert service["depends_on"] == {
                name: {"condition": "service_healthy"} for name in sentinel_services()
            }


def test_each_shard_has_two_endpoints_the_router_lists() -> None:
    """Every URL cluster.yaml lists for a shard is a node service of this file, on the
    port it binds, started with the shard's id and the shard's redis+sentinel:// URL; every
    node service is listed, and each shard has two."""
    nodes = load_config(COMPOSE / "cluster.yaml").nodes
    listed: list[str] = []
    for node in nodes:
        assert len(node.urls) == 2
        for url in node.urls:
            parts = urlsplit(url)
            assert parts.scheme == "http" and parts.path == "", url
            assert parts.hostname in services(), f"{url}: no such service"
            args = build_parser().parse_args(services()[parts.hostname]["command"])
            assert (args.command, args.service) == ("serve", "node")
            assert args.id == node.id == parse_sentinel_url(args.redis).master
            assert (args.host, args.port) == ("0.0.0.0", parts.port)
            listed.append(parts.hostname)
    node_services = sorted(
        name for name, s in services().items() if s.get("command", [])[:2] == ["serve", "node"]
    )
    assert sorted(listed) == node_services
    assert services()["router"]["depends_on"] == listed


def test_the_sentinels_watch_every_shard_with_quorum_2() -> None:
    conf = sentinel_conf()
    assert ["port", str(SENTINEL_PORT)] in conf
    assert ["sentinel", "resolve-hostnames", "yes"] in conf
    assert ["sentinel", "announce-hostnames", "yes"] in conf
    first_monitor = next(i for i, d in enumerate(conf) if d[:2] == ["sentinel", "monitor"])
    assert conf.index(["sentinel", "resolve-hostnames", "yes"]) < first_monitor
    monitors = [d[2:] for d in conf if d[:2] == ["sentinel", "monitor"]]
    assert monitors == [
        [node_id, f"redis{i}", str(REDIS_PORT), "2"] for i, node_id in enumerate(node_ids(), 1)
    ]
    for node_id in node_ids():
        assert ["sentinel", "down-after-milliseconds", node_id, "1200"] in conf
        assert ["sentinel", "parallel-syncs", node_id, "1"] in conf
    for name in sentinel_services():
        service = services()[name]
        script_mount(service)
        assert service["image"] == "redis:7.2-alpine"
        assert service["environment"] == {
            "SELF": name,
            "SENTINELS": " ".join(f"{s}:{SENTINEL_PORT}" for s in sentinel_services()),
        }
        sh, dash_c, line = service["command"]
        assert (sh, dash_c) == ("sh", "-c")
        assert shlex.split(line) == [
            *("sh", "/redis/sentinel-config.sh", "/redis/sentinel.conf", "/data/sentinel.conf"),
            *("&&", "exec", "redis-server", "/data/sentinel.conf", "--sentinel"),
        ]
        assert service["healthcheck"]["test"] == ["CMD", "redis-cli", "-p", "26379", "ping"]


def test_each_shard_has_a_primary_and_a_replica() -> None:
    sentinels = " ".join(f"{s}:{SENTINEL_PORT}" for s in sentinel_services())
    for i, node_id in enumerate(node_ids(), start=1):
        servers = sorted(
            name
            for name, s in services().items()
            if s.get("environment", {}).get("SHARD") == node_id
        )
        assert servers == [f"redis{i}", f"redis{i}-replica"]
        for name in servers:
            service = services()[name]
            script_mount(service)
            assert f"{name}-data:/data" in service["volumes"]
            assert service["environment"] == {
                "SHARD": node_id,
                "SELF": name,
                "FIRST_PRIMARY": f"redis{i}",
                "SENTINELS": sentinels,
            }
            command = service["command"]
            assert command[:3] == ["sh", "/redis/redis-start.sh", "redis-server"]
            flags = dict(zip(command[3::2], command[4::2], strict=True))
            assert flags == {
                "--appendonly": "yes",
                "--appendfsync": "everysec",
                "--save": "",
                "--repl-diskless-sync-delay": "0",
            }
            assert service["restart"] == "unless-stopped"


# ---------------------------------------------------------------- the scripts, run


@pytest.fixture
def fake_cli(tmp_path: Path) -> Path:
    """A `redis-cli` on PATH that answers `-h HOST ... get-master-addr-by-name NAME` with
    the file answers/HOST_NAME (else fails, as for an unreachable Sentinel) and logs the
    hosts it was asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "answers").mkdir()
    cli = bin_dir / "redis-cli"
    cli.write_text(
        "#!/bin/sh\n"
        f'host=$2; for last in "$@"; do :; done; echo "$host" >>{tmp_path}/asked\n'
        f'[ -f "{tmp_path}/answers/${{host}}_$last" ] || exit 1\n'
        f'cat "{tmp_path}/answers/${{host}}_$last"\n'
    )
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def answer(fake: Path, sentinel: str, master: str, host: str, port: int) -> None:
    (fake / "answers" / f"{sentinel}_{master}").write_text(f"{host}\n{port}\n")


def asked(fake: Path) -> list[str]:
    log = fake / "asked"
    return log.read_text().split() if log.exists() else []


def run(fake: Path, script: str, args: list[str], env: dict[str, str]) -> str:
    path = f"{fake / 'bin'}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(
        ["sh", str(SCRIPTS / script), *args],
        env={"PATH": path, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


def redis_start(fake: Path, self_name: str) -> list[str]:
    env = {
        "SHARD": "n1",
        "SELF": self_name,
        "FIRST_PRIMARY": "redis1",
        "SENTINELS": "sentinel-1:26379 sentinel-2:26379 sentinel-3:26379",
    }
    # "$@" is the server's command line: printf shows what the script would exec.
    return run(
        fake, "redis-start.sh", ["printf", "%s\\n", "redis-server", "--save", ""], env
    ).split("\n")[:-1]


def test_a_fresh_shard_starts_its_first_primary_and_replicates_it(fake_cli: Path) -> None:
    assert redis_start(fake_cli, "redis1") == [
        *("redis-server", "--save", ""),
        *("--replica-announce-ip", "redis1"),
    ]
    assert redis_start(fake_cli, "redis1-replica") == [
        *("redis-server", "--save", ""),
        *("--replicaof", "redis1", "6379", "--replica-announce-ip", "redis1-replica"),
    ]
    assert asked(fake_cli) == ["sentinel-1", "sentinel-2", "sentinel-3"] * 2


def test_a_restarted_server_follows_the_primary_the_sentinels_name(fake_cli: Path) -> None:
    # sentinel-1 is unreachable; sentinel-2 knows the replica was promoted.
    answer(fake_cli, "sentinel-2", "n1", "redis1-replica", 6379)
    assert redis_start(fake_cli, "redis1") == [
        *("redis-server", "--save", ""),
        *("--replicaof", "redis1-replica", "6379", "--replica-announce-ip", "redis1"),
    ]
    assert asked(fake_cli) == ["sentinel-1", "sentinel-2"]
    # The promoted one, restarted, stays the primary the Sentinels name.
    assert redis_start(fake_cli, "redis1-replica") == [
        *("redis-server", "--save", ""),
        *("--replica-announce-ip", "redis1-replica"),
    ]


def sentinel_config(fake: Path, self_name: str) -> str:
    out = fake / f"{self_name}.conf"
    env = {"SELF": self_name, "SENTINELS": "sentinel-1:26379 sentinel-2:26379 sentinel-3:26379"}
    run(fake, "sentinel-config.sh", [str(SCRIPTS / "sentinel.conf"), str(out)], env)
    return out.read_text()


def test_a_fresh_sentinel_gets_the_template_its_id_and_its_name(fake_cli: Path) -> None:
    template = (SCRIPTS / "sentinel.conf").read_text()
    myid = hashlib.sha1(b"sentinel-2").hexdigest()  # noqa: S324 - an id, not a secret
    assert sentinel_config(fake_cli, "sentinel-2") == (
        f"{template}sentinel myid {myid}\nsentinel announce-ip sentinel-2\n"
    )
    # It asked the other two, once per shard, never itself; then each first primary.
    assert asked(fake_cli) == [
        *("sentinel-1", "sentinel-3", "redis1"),
        *("sentinel-1", "sentinel-3", "redis2"),
        *("sentinel-1", "sentinel-3", "redis3"),
    ]
    assert sentinel_config(fake_cli, "sentinel-2") == sentinel_config(fake_cli, "sentinel-2")
    assert f"myid {myid}" not in sentinel_config(fake_cli, "sentinel-1")


def test_a_restarted_sentinel_monitors_the_current_primary(fake_cli: Path) -> None:
    answer(fake_cli, "sentinel-3", "n2", "redis2-replica", 6379)
    conf = sentinel_config(fake_cli, "sentinel-1").splitlines()
    monitors = [line for line in conf if line.startswith("sentinel monitor ")]
    assert monitors == [
        "sentinel monitor n1 redis1 6379 2",
        "sentinel monitor n2 redis2-replica 6379 2",
        "sentinel monitor n3 redis3 6379 2",
    ]


def test_sentinels_restarted_together_follow_the_first_primary_to_its_primary(
    fake_cli: Path,
) -> None:
    """No other Sentinel answers (all were restarted), but a failover had made redis2 a
    replica: the monitor line names the primary redis2 replicates, if that one says it
    is one."""
    (fake_cli / "answers" / "redis2_role").write_text("slave\nredis2-replica\n6379\nconnected\n9\n")
    (fake_cli / "answers" / "redis2-replica_role").write_text("master\n9\n")
    (fake_cli / "answers" / "redis3_role").write_text("slave\nredis3-replica\n6379\nconnect\n-1\n")
    (fake_cli / "answers" / "redis3-replica_role").write_text("slave\nredis3\n6379\nconnect\n-1\n")
    conf = sentinel_config(fake_cli, "sentinel-1").splitlines()
    monitors = [line for line in conf if line.startswith("sentinel monitor ")]
    assert monitors == [
        "sentinel monitor n1 redis1 6379 2",  # unreachable: the template's
        "sentinel monitor n2 redis2-replica 6379 2",
        "sentinel monitor n3 redis3 6379 2",  # its primary is no primary: the template's
    ]
