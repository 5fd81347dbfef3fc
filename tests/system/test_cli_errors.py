"""The command line's rough edges, each as a new user met it: help that helps, a version,
output cut short by `head`, one clear line for each mistake (wrong or missing token,
unknown rule, missing change, a router URL without a scheme, a typo in cluster.yaml,
an unwritable data dir), and status output a person reads."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from cluster.cli.command_tree import Parser
from cluster.cli.completion import completion_script
from cluster.cli.parser import build_parser
from cluster.local.cluster import LocalCluster, scratch_cluster
from cluster.local.ports import free_port

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, SHARDLIMIT_ROUTER="http://127.0.0.1:1", **(env or {})),
    )


def _one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The single stderr line of a refused command (and no traceback)."""
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# -- help, version, pipes ---------------------------------------------------------


def test_completion_help_is_help() -> None:
    done = _run("completion", "--help")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: shardlimit completion [--json] {bash,zsh}\n")
    assert 'eval "$(shardlimit completion bash)"' in done.stdout
    assert _run("completion", "-h").stdout == done.stdout


def test_version() -> None:
    done = _run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"shardlimit {metadata.version('shardlimit')}\n"


def test_output_cut_short_by_the_reader_ends_quietly() -> None:
    """`shardlimit compare --json | head`: the reader has gone before the first write."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "cluster.cli",
                "compare",
                "--nodes",
                "3",
                "--add",
                "1",
                "--keys",
                "2000",
                "--json",
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 141  # 128 + SIGPIPE, as a C program killed by it


def _all_actions(parser: Parser, path: str = "") -> Iterator[tuple[str, argparse.Action]]:
    for action in parser.options:
        yield path, action
    for name, child in parser.commands.items():
        yield from _all_actions(child, f"{path} {name}".strip())


def test_every_flag_has_help_and_internal_ones_are_hidden() -> None:
    actions = list(_all_actions(build_parser()))
    missing = [f"{path} {a.option_strings or a.dest}" for path, a in actions if a.help is None]
    assert missing == []
    hidden = sorted(
        {(path, a.option_strings[0]) for path, a in actions if a.help == argparse.SUPPRESS}
    )
    assert hidden == [("serve node", "--test-clock"), ("up", "--test-clock")]
    for command in (("up",), ("serve", "node")):
        done = _run(*command, "--help")
        assert done.returncode == 0 and "--test-clock" not in done.stdout
    assert "--test-clock" not in completion_script(build_parser(), "bash")
    # Hidden, still accepted (the test suite uses it).
    assert build_parser().parse_args(["up", "--test-clock"]).test_clock is True


# -- cluster.yaml and the data dir ---------------------------------------------------


def _config(tmp_path: Path, **router: object) -> Path:
    path = tmp_path / "cluster.yaml"
    settings = {"port": 1, "data_dir": str(tmp_path / "router"), **router}
    path.write_text(
        yaml.safe_dump(
            {
                "router": settings,
                "cluster": {"nodes": [{"id": "n1", "url": "http://127.0.0.1:1"}]},
            }
        )
    )
    return path


def test_a_typo_in_cluster_yaml_is_refused_naming_the_nearest_setting(tmp_path: Path) -> None:
    config = _config(tmp_path, nodee_deadline="2s")
    line = _one_line(_run("serve", "router", "--config", str(config)), 2)
    assert line == (
        f"shardlimit router: {config}: router.nodee_deadline: unknown setting; "
        "did you mean 'node_deadline'?"
    )
    assert not (tmp_path / "router").exists()  # refused before anything was written


def test_a_cluster_yaml_that_is_not_yaml_is_refused_in_one_line_naming_where(
    tmp_path: Path,
) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text("router:\n  port: [8080\n")
    line = _one_line(_run("serve", "router", "--config", str(config)), 2)
    assert line == (
        f"shardlimit router: {config}:3:1: not YAML: expected ',' or ']', "
        "but got '<stream end>' (while parsing a flow sequence)"
    )


def test_envoy_descriptors_that_are_not_yaml_stop_the_router_with_one_line_naming_where(
    tmp_path: Path,
) -> None:
    descriptors = tmp_path / "ratelimit.yaml"
    descriptors.write_text("domain: [x\n")
    config = _config(
        tmp_path, port=free_port(), grpc_port=free_port(), envoy_config=str(descriptors)
    )
    done = _run("serve", "router", "--config", str(config))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"shardlimit router: envoy config rejected: {descriptors}:2:1: not YAML: expected ',' or ']', "
        "but got '<stream end>' (while parsing a flow sequence)"
    )


def test_an_unknown_section_is_refused_naming_the_nearest(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump({"router": {}, "cluster": {}, "clusterr": {}}))
    line = _one_line(_run("serve", "router", "--config", str(config)), 2)
    assert line.endswith(": clusterr: unknown setting; did you mean 'cluster'?")


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        (
            {"router": {"quota_tll": "1d"}},
            "router.quota_tll: unknown setting; did you mean 'quota_ttl'?",
        ),
        (
            {"cluster": {"partitoner": "ring"}},
            "cluster.partitoner: unknown setting; did you mean 'partitioner'?",
        ),
        (
            {"cluster": {"nodes": [{"id": "n1", "url": "http://h:1", "wieght": 2}]}},
            "cluster.nodes[0].wieght: unknown setting; did you mean 'weight'?",
        ),
        ({"router": {"zzz": 1}}, "router.zzz: unknown setting; known: aon_hold, coalesce_max,"),
    ],
)
def test_every_section_refuses_unknown_settings(doc: dict[str, Any], says: str) -> None:
    from cluster.model.errors import ValidationError
    from router.config import parse_config

    with pytest.raises(ValidationError) as refused:
        parse_config(doc, Path("."))
    assert str(refused.value).startswith(says)


@pytest.mark.parametrize(("wait_us", "kept"), [(0, 0.0), (1, None), (999, None), (1000, 0.001)])
def test_a_coalescing_wait_is_refused_where_a_timer_cannot_keep_it(
    wait_us: int, kept: float | None
) -> None:
    from cluster.model.errors import ValidationError
    from router.config import parse_config

    doc = {"router": {"coalesce_wait_us": wait_us}, "cluster": {"nodes": []}}
    if kept is None:
        with pytest.raises(ValidationError) as refused:
            parse_config(doc, Path("."))
        assert str(refused.value) == (
            "router.coalesce_wait_us: must be 0 (no wait) or from 1000: timers fire in whole ms"
        )
    else:
        assert parse_config(doc, Path(".")).coalesce_wait_us / 1_000_000 == kept


def test_an_unwritable_data_dir_is_one_line(tmp_path: Path) -> None:
    """Under a regular file: no one, root included, can make that directory."""
    (tmp_path / "a-file").write_text("")
    config = _config(tmp_path, data_dir=str(tmp_path / "a-file" / "router"))
    line = _one_line(_run("serve", "router", "--config", str(config)), 2)
    assert line == (
        f"shardlimit router: {config}: router.data_dir {tmp_path}/a-file/router is not a "
        "writable directory: Not a directory"
    )


# -- against a running cluster -------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two nodes serving configs/rules.yaml (its `basic` rule has no quota limit)."""
    data_dir = tmp_path_factory.mktemp("cli-errors")
    with scratch_cluster(2, data_dir=data_dir, config=ROOT / "configs" / "cluster.yaml") as local:
        yield local


def _against(
    local: LocalCluster, *args: str, token: str | None
) -> subprocess.CompletedProcess[str]:
    env = {"SHARDLIMIT_ROUTER": local.router_url}
    done_env = dict(os.environ, **env)
    done_env.pop("SHARDLIMIT_ADMIN_TOKEN", None)
    if token is not None:
        done_env["SHARDLIMIT_ADMIN_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=done_env,
    )


def test_wrong_token_and_no_token_are_told_apart(live: LocalCluster) -> None:
    adjust = ("quota", "adjust", "k", "--rule", "basic", "--delta", "1")
    wrong = _one_line(_against(live, *adjust, token="not-the-token"), 2)
    assert wrong == (
        "shardlimit: POST /v1/quota/adjust: token rejected (401): the router's admin "
        "token differs from --token / SHARDLIMIT_ADMIN_TOKEN"
    )
    missing = _one_line(_against(live, *adjust, token=None), 2)
    assert missing == (
        "shardlimit: POST /v1/quota/adjust needs the admin token: pass --token or set "
        "SHARDLIMIT_ADMIN_TOKEN"
    )


def test_quota_adjust_names_the_unknown_rule_and_the_missing_flags(live: LocalCluster) -> None:
    unknown = _against(
        live, "quota", "adjust", "k", "--rule", "nosuch", "--delta", "1", token=live.admin_token
    )
    assert _one_line(unknown, 2) == "shardlimit: quota adjust: --rule: unknown rule 'nosuch'"
    no_change = _against(live, "quota", "adjust", "k", "--rule", "nosuch", token=live.admin_token)
    assert _one_line(no_change, 2) == (
        "shardlimit: quota adjust needs one of --delta N, --set N, --amount-delta A or "
        "--amount-set A"
    )
    not_quota = _against(
        live, "quota", "adjust", "k", "--rule", "basic", "--amount-set", "5", token=live.admin_token
    )
    assert _one_line(not_quota, 2) == (
        "shardlimit: quota adjust: --rule: rule 'basic' has no quota limit to adjust"
    )


def test_node_add_of_a_url_that_is_no_new_node_is_one_line_exit_2(live: LocalCluster) -> None:
    router, n1 = live.router_url, live.node_url(0)
    itself = _against(live, "node", "add", router, "--id", "n9", token=live.admin_token)
    assert _one_line(itself, 2) == (
        f"shardlimit: POST /v1/cluster/nodes: 422 not a node: {router} does not serve a "
        "shardlimit node's stats: it is a shardlimit router; give the URL of a `shardlimit "
        "serve node`; nothing was changed"
    )
    member = _against(live, "node", "add", n1, "--id", "n9", token=live.admin_token)
    assert _one_line(member, 2) == (
        f"shardlimit: POST /v1/cluster/nodes: 409 the node at {n1} is already a member, as "
        "n1; nothing was changed"
    )


def test_a_router_address_without_a_scheme_means_http(live: LocalCluster) -> None:
    address = live.router_url.removeprefix("http://")
    done = _against(live, "status", "--json", "--router", address, token=live.admin_token)
    assert done.returncode == 0, done.stderr
    assert [n["id"] for n in json.loads(done.stdout)["nodes"]] == ["n1", "n2"]
    other = _against(live, "status", "--router", "ftp://127.0.0.1:1", token=None)
    assert _one_line(other, 2) == (
        "shardlimit: --router must be an http:// or https:// URL, not 'ftp://127.0.0.1:1'"
    )


def test_reshard_status_without_a_migration(live: LocalCluster) -> None:
    done = _against(live, "reshard", "status", token=live.admin_token)
    assert (done.returncode, done.stdout, done.stderr) == (0, "no migration in progress\n", "")
    as_json = _against(live, "reshard", "status", "--json", token=live.admin_token)
    assert as_json.returncode == 0 and json.loads(as_json.stdout) is None


def test_status_shows_a_down_node_with_dashes(tmp_path: Path) -> None:
    with scratch_cluster(2, data_dir=tmp_path / "down") as local:
        local.nodes[1].kill()
        done = _against(local, "status", token=local.admin_token)
    assert done.returncode == 0, done.stderr
    rows = {
        cells[0]: cells
        for line in done.stdout.splitlines()
        if (cells := [c.strip() for c in line.strip("│ \n").split("│")])[0] in ("n1", "n2")
    }
    assert rows["n2"][3:5] == ["down", "-"]  # state, keys
    assert rows["n1"][3:5] == ["up", "0"]
    assert "None" not in done.stdout


def test_a_migration_reads_as_lines() -> None:
    from cluster.cli.status import finished, migration_lines

    migration = {
        "id": "m-7",
        "phase": "paused",
        "epoch": 4,
        "running": False,
        "sources": {
            "n2": {"scanned": 40, "moved": 12, "done": False},
            "n1": {"scanned": 90, "moved": 30, "done": True},
            "n3": {"scanned": 0, "moved": 0, "copying": False, "done": False},
        },
        "keys_moved": 42,
        "keys_per_s": 21.0,
        "last_error": "n3 unreachable",
        "aborting": False,
    }
    assert migration_lines(migration) == [
        "migration m-7: paused (not running), epoch 4",
        "  keys moved: 42 (21.0 keys/s)",
        "  from n1: 30 moved of 90 scanned, done",
        "  from n2: 12 moved of 40 scanned, copying",
        "  from n3: 0 moved of 0 scanned, waiting",
        "  aborting: False",
        "  last error: n3 unreachable"
        " (fix it, then `shardlimit reshard resume`, or `shardlimit reshard abort`)",
    ]
    blocked = {**migration, "blocked": {"node": "n3", "reason": "copy step failed: refused"}}
    assert "  blocked by n3: copy step failed: refused" in migration_lines(blocked)
    assert migration_lines(None) == ["no migration in progress"]
    assert finished(migration) is None
    over = {**migration, "phase": "done", "epoch": 5, "seconds": 2.0, "last_error": None}
    assert (
        finished(over) == "last migration m-7: done, epoch 5, 42 keys moved in 2.0 s (21.0 keys/s)"
    )


@pytest.mark.parametrize("server", ["lean", "grpcio"])
def test_a_taken_grpc_port_stops_the_router_with_one_line(tmp_path: Path, server: str) -> None:
    """Held with SO_REUSEPORT as a running grpcio router holds it: grpcio's own default
    would share the port with it, and Envoy's calls with a misconfigured router."""
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        config = _config(
            tmp_path,
            port=free_port(),
            grpc_port=port,
            envoy_config=str(ROOT / "configs" / "ratelimit.yaml"),
        )
        done = _run(
            "serve", "router", "--config", str(config), env={"SHARDLIMIT_GRPC_SERVER": server}
        )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"shardlimit router: cannot listen on 127.0.0.1:{port} (gRPC): ")
    ), done.stderr


def test_a_grpc_key_that_is_not_the_certificates_is_one_line(tmp_path: Path) -> None:
    ca = trustme.CA()
    one, other = ca.issue_cert("127.0.0.1"), ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "other.key"
    cert.write_bytes(one.cert_chain_pems[0].bytes())
    key.write_bytes(other.private_key_pem.bytes())
    config = _config(
        tmp_path,
        port=free_port(),
        grpc_port=free_port(),
        envoy_config=str(ROOT / "configs" / "ratelimit.yaml"),
    )
    env = {"GRPC_SERVER_TLS_CERT": str(cert), "GRPC_SERVER_TLS_KEY": str(key)}
    done = _run("serve", "router", "--config", str(config), env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"shardlimit router: envoy gRPC TLS: cannot load certificate {cert} with key {key}: "
        )
    ), done.stderr
