"""The command line: its help, verbs, the old spellings, one-line mistakes, completion,
and `--json` on every command (against a real cluster for those that talk to one)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.cli.command_tree import Parser
from cluster.cli.completion import completion_script
from cluster.cli.main import legacy_spelling
from cluster.cli.parser import build_parser
from cluster.local.cluster import LocalCluster, node_process, scratch_cluster
from cluster.local.ports import free_port
from cluster.local.redis_proc import RedisProcess
from cluster.web.logs import JsonFormatter

pytestmark = pytest.mark.timeout(60)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SHARDLIMIT_ROUTER="http://127.0.0.1:1")
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )


def test_help_lists_every_command_and_hides_nothing() -> None:
    done = _run("--help")
    assert done.returncode == 0
    assert "SUPPRESS" not in done.stdout
    for command in (
        "up",
        "serve",
        "status",
        "node",
        "reshard",
        "rules",
        "compare",
        "usage",
        "bench",
        "completion",
    ):
        assert re.search(rf"\n    {command}\s", done.stdout), command
    serve = _run("serve", "--help").stdout
    assert "router" in serve and "node" in serve
    node = _run("node", "--help").stdout
    assert "add" in node and "remove" in node and "--redis" not in node


def test_old_spellings_still_work_for_one_release() -> None:
    assert legacy_spelling(["router", "--config", "c.yaml"]) == [
        "serve",
        "router",
        "--config",
        "c.yaml",
    ]
    assert legacy_spelling(["node", "--id", "n1"]) == ["serve", "node", "--id", "n1"]
    assert legacy_spelling(["node-add", "http://h:1"]) == ["node", "add", "http://h:1"]
    assert legacy_spelling(["node", "add", "http://h:1"]) == ["node", "add", "http://h:1"]
    assert legacy_spelling(["node", "--help"]) == ["node", "--help"]
    args = build_parser().parse_args(
        legacy_spelling(["node", "--id", "n1", "--port", "7001", "--redis", "redis://x:1/0"])
    )
    assert (args.command, args.service, args.id, args.port) == ("serve", "node", "n1", 7001)


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (("bogus",), 2, "invalid choice: 'bogus'"),
        (
            ("serve", "node", "--id", "bad id", "--port", "7001", "--redis", "redis://x:1/0"),
            2,
            "--id: a node id is 1-64 characters of A-Z a-z 0-9 _ . : - (not . or ..), not 'bad id'",
        ),
        (("up", "--routers", "0"), 2, "--routers: must be a whole number from 1 to 64"),
        (("up", "--nodes", "0"), 2, "--nodes: must be a whole number from 1 to 64"),
        (("up", "--port", "70000"), 2, "--port: must be a TCP port from 1 to 65535"),
        (("up", "--base-port", "0"), 2, "--base-port: must be a TCP port from 1 to 65535"),
        (("up", "--grpc-port", "x"), 2, "--grpc-port: must be a TCP port from 1 to 65535"),
        (("up", "--port", "\u00b2"), 2, "--port: must be a TCP port from 1 to 65535, not '\u00b2'"),
        (("up", "--nodes", "+2"), 2, "--nodes: must be a whole number from 1 to 64, not '+2'"),
        (("up", "--down-after-ms", "99"), 2, "--down-after-ms: must be milliseconds from 100"),
        (
            ("up", "--port", "65535", "--routers", "2"),
            2,
            "shardlimit up: 2 routers on consecutive ports from 65535 run past 65535",
        ),
        (
            ("up", "--base-port", "65534", "--nodes", "2", "--replicas", "1"),
            2,
            "shardlimit up: 4 node processes on consecutive ports from 65534 run past 65535",
        ),
        (("serve", "router", "--config", "c.yaml", "--port", "65536"), 2, "must be a TCP port"),
        (("serve", "node", "--id", "n1", "--port", "0"), 2, "must be a TCP port"),
        (("serve", "node", "--id", "n1"), 2, "the following arguments are required"),
        (("node", "add"), 2, "the following arguments are required: url"),
        (("reshard", "explode"), 2, "invalid choice: 'explode'"),
        (("rules", "apply", "-f", "/nonexistent/rules.yaml"), 2, "cannot read /nonexistent"),
        (("status",), 1, "cannot reach the router at http://127.0.0.1:1"),
        (("node", "remove", "n9"), 1, "cannot reach the router"),
        (("serve", "router", "--config", "/nonexistent.yaml"), 2, "cannot read /nonexistent"),
        (("completion", "fish"), 2, "completion takes bash or zsh"),
        (("node", "remove", "n1?x=1"), 2, "argument ID: a node id is 1-64 characters of"),
        (("reshard", "plan", "--remove", "n2?dry_run=0&"), 2, "argument --remove: a node id"),
        (
            ("reshard", "apply", "--add", "http://127.0.0.1:1", "--remove", "n2"),
            2,
            "argument --remove: not allowed with argument --add",
        ),
        (("status", "--router", "http://127.0.0.1:99999"), 2, "--router's port must be"),
        (("status", "--router", "http://:8080"), 2, "--router needs a host"),
        (
            (
                "compare",
                "--nodes",
                "3",
                "--add",
                "1",
                "--keys",
                "100",
                "--plot",
                "/nonexistent/d/p.png",
            ),
            2,
            "shardlimit compare: --plot: cannot write /nonexistent/d/p.png: no directory",
        ),
        (
            ("compare", "--nodes", "3", "--add", "1", "--keys", "100", "--plot", "p.txt"),
            2,
            "shardlimit compare: --plot writes a PNG: give a file name ending in .png",
        ),
        (
            ("compare", "--nodes", "3", "--remove", "3"),
            2,
            "shardlimit compare: cannot remove 3 of 3 nodes: at least one must remain",
        ),
    ],
)
def test_a_mistake_is_one_line_without_a_traceback(
    args: tuple[str, ...], code: int, says: str
) -> None:
    done = _run(*args)
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert says in lines[0] and "Traceback" not in done.stderr


def test_an_empty_router_url_is_a_mistake() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "status"],
        capture_output=True,
        text=True,
        env=dict(os.environ, SHARDLIMIT_ROUTER=""),
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (
        "shardlimit: --router is empty: give a router URL such as http://127.0.0.1:8080 "
        "(or unset an empty SHARDLIMIT_ROUTER)\n"
    )


def test_bench_help_from_the_source_checkout() -> None:
    done = _run("bench", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: shardlimit bench ")


def test_help_says_the_exit_statuses() -> None:
    done = _run("--help")
    assert done.returncode == 0
    assert " ".join(done.stdout.split("\n\n")[-1].split()) == (
        "exit status: 0 done; 1 the cluster could not do it (the router unreachable, an "
        "HTTP 5xx, a migration paused); 2 a mistake in the command or its input (usage, a "
        "bad file, an HTTP 4xx refusal)"
    )


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "rules:\n  basic:\n    limits: 5/minute\n   on_failure: allow\n",
            ":4:4: not YAML: expected <block end>, but found '<block mapping start>' "
            "(while parsing a block mapping)",
        ),
        (
            "rules:\n  basic: {limits: [5/minute}\n",
            ":2:28: not YAML: expected ',' or ']', but got '}' (while parsing a flow sequence)",
        ),
        (
            "rules:\n\tbasic: x\n",
            ":2:1: not YAML: found character '\\t' that cannot start any token "
            "(while scanning for the next token)",
        ),
        # Keys YAML reads as other types: a rule named on (true), fields null and 7.
        (
            "rules:\n  on:\n    limits: 5/minute\n",
            ": rules.True: is True to YAML: quote a rule name such as on, yes, no or null",
        ),
        (
            "rules:\n  basic:\n    limits:\n      - {algorithm: fixed_window, limit: 5, window: 1m,"
            " null: 1, 7: x}\n",
            ": rules.basic.limits[0].7: is not a parameter of fixed_window; "
            "rules.basic.limits[0].None: is not a parameter of fixed_window",
        ),
    ],
    ids=["indent", "bracket", "tab", "rule-named-on", "null-and-number-fields"],
)
def test_a_rules_file_refused_before_the_router_is_asked_says_where(
    tmp_path: Path, text: str, where: str
) -> None:
    """No router listens here: exit 2, one line (file:line:column for YAML errors)."""
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    done = _run("rules", "apply", "-f", str(path))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"shardlimit: {path}{where}\n")


@pytest.mark.parametrize(("status", "code"), [(400, 2), (404, 2), (409, 2), (500, 1), (503, 1)])
def test_a_refusal_exits_2_and_a_cluster_failure_1(status: int, code: int) -> None:
    import argparse
    import urllib.error

    from cluster.cli.admin import _refusal

    body = io.BytesIO(json.dumps({"detail": "why"}).encode())
    error = urllib.error.HTTPError("http://r/v1/x", status, "reason", {}, body)  # type: ignore[arg-type]
    refused = _refusal(argparse.Namespace(token="t"), "GET", "/v1/x", error)
    assert (str(refused), refused.code) == (f"GET /v1/x: {status} why", code)


@pytest.mark.parametrize("side", ["channel", "liveness"])
def test_a_node_on_a_taken_side_port_says_so_in_one_line(side: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ("--id", "n1", "--port", str(free_port()), "--redis", "redis://127.0.0.1:1/0")
        done = _run("serve", "node", *args, f"--{side}-port", str(port))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"shardlimit node: cannot listen on 127.0.0.1:{port} ({side}): ")


@pytest.mark.parametrize("service", ["node", "router"])
def test_serve_on_a_taken_port_says_so_in_one_line(service: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "cluster.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "router": {"port": port, "data_dir": str(tmp_path / "router")},
                    "cluster": {"nodes": [{"id": "n1", "url": "http://127.0.0.1:1"}]},
                }
            )
        )
        args = {
            "node": ("--id", "n1", "--port", str(port), "--redis", "redis://127.0.0.1:1/0"),
            "router": ("--config", str(config)),
        }[service]
        done = _run("serve", service, *args, "--json")
    assert done.returncode == 2, done.stderr
    *logged, last = done.stderr.strip().splitlines()
    assert last.startswith(f"shardlimit {service}: cannot listen on 127.0.0.1:{port}: ")
    assert "Traceback" not in done.stderr
    assert all(json.loads(line)["level"] == "WARNING" for line in logged)  # --json logs


def test_completion_knows_commands_and_options(tmp_path: Path) -> None:
    script = completion_script(build_parser(), "bash")
    assert '"") words="' in script and " serve " in script
    assert (
        '"serve node") words="--channel-port --cluster-token-file --help --host --id --json '
        "--liveness-port --port"
    ) in script
    assert '"completion") words="--json bash zsh"' in script
    assert '"node add") words="' in script and "--weight" in script
    done = _run("completion", "bash")
    assert done.returncode == 0 and done.stdout == script
    # bash itself accepts it and completes `shardlimit se` to `serve`.
    probe = tmp_path / "probe.sh"
    probe.write_text(
        script
        + 'COMP_WORDS=(shardlimit se); COMP_CWORD=1; _shardlimit; echo "${COMPREPLY[@]}"\n'
        + 'COMP_WORDS=(shardlimit serve r); COMP_CWORD=2; _shardlimit; echo "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(["bash", str(probe)], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["serve", "router"]


# -- --json on every command ------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two nodes and a router, logging JSON (`serve router|node --json`)."""
    data_dir = tmp_path_factory.mktemp("live")
    with scratch_cluster(2, data_dir=data_dir, json_logs=True, log_level="INFO") as local:
        yield local


def _run_live(local: LocalCluster, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a command against `local` (its router and admin token), with `env` added."""
    done = subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args],
        capture_output=True,
        text=True,
        env=dict(
            os.environ,
            SHARDLIMIT_ROUTER=local.router_url,
            SHARDLIMIT_ADMIN_TOKEN=local.admin_token,
            **env,
        ),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


def _run_json(local: LocalCluster, *args: str) -> Any:
    """Run a command with --json against `local`; its stdout parsed (it must be JSON)."""
    done = _run_live(local, *args, "--json")
    for line in done.stderr.splitlines():  # any log line is a JSON object too
        assert {"ts", "level", "logger", "message"} <= set(json.loads(line)), line
    return json.loads(done.stdout)


def _json_log(path: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records), path
    return records


def test_status_and_rules_json(live: LocalCluster, tmp_path: Path) -> None:
    status = _run_json(live, "status")
    assert [(n["id"], n["url"]) for n in status["nodes"]] == [
        ("n1", live.node_url(0)),
        ("n2", live.node_url(1)),
    ]
    assert status["partitioner"] == "ring"
    rules = _run_json(live, "rules", "get")
    assert set(rules) == {"version", "rules"}
    wanted = tmp_path / "rules.yaml"
    one = {"limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1m"}]}
    wanted.write_text(yaml.safe_dump({"rules": {**rules["rules"], "cli-json": one}}))
    plan = _run_json(live, "rules", "apply", "-f", str(wanted), "--dry-run")
    assert (plan["applied"], plan["added"], plan["removed"], plan["changed"]) == (
        False,
        ["cli-json"],
        [],
        [],
    )
    assert plan["version"] == plan["from_version"] == rules["version"]


def test_status_gives_each_node_one_row_and_says_once_what_no_replicas_means(
    live: LocalCluster,
) -> None:
    """The table as a person reads it (120 columns): a row a node, its Redis cell the
    primary and "no replicas"; what that means for `replica` rules, once, below it."""
    done = _run_live(live, "status", COLUMNS="120")
    nodes = _run_json(live, "status")["nodes"]
    lines = done.stdout.splitlines()
    for node in nodes:
        row = [line for line in lines if line.startswith(f"│ {node['id']} ")]
        assert len(row) == 1, done.stdout
        assert f"{node['redis']['primary']}, no replicas" in row[0], done.stdout
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == len(nodes) == 2, done.stdout  # no row wrapped onto a second line
    assert lines[-1] == (
        "no replicas on n1, n2: `durability: replica` rules are served as `primary` there"
    )


def test_usage_shows_the_leases_a_key_holds(live: LocalCluster) -> None:
    doc = {"limits": [{"algorithm": "concurrency", "limit": 3, "lease": "30s"}]}
    _http(live, "PUT", "/v1/rules/cli-exports", doc)
    for _ in range(2):
        assert _http(live, "POST", "/v1/check", {"key": "tenant:cli", "rule": "cli-exports"})[
            "allowed"
        ]
    usage = _run_json(live, "usage", "tenant:cli", "--rule", "cli-exports")
    [limit] = usage["limits"]
    assert (usage["dry_run"], limit["held"], limit["remaining"]) == (True, 2, 1)
    done = _run_live(live, "usage", "tenant:cli", "--rule", "cli-exports")
    lines = done.stdout.splitlines()
    assert lines[0] == f"tenant:cli (cli-exports) on {usage['node']}"
    assert re.fullmatch(
        r"  concurrency: 2 held of 3 \(1 free\); the first expires in \d+(\.\d+)? s unless "
        r"renewed",
        lines[1],
    ), lines


def _http(local: LocalCluster, method: str, path: str, body: Any) -> Any:
    call = urllib.request.Request(
        local.router_url + path, data=json.dumps(body).encode(), method=method
    )
    call.add_header("Content-Type", "application/json")
    call.add_header("Authorization", f"Bearer {local.admin_token}")
    with urllib.request.urlopen(call, timeout=30) as answer:
        return json.loads(answer.read())


def test_reshard_and_node_json(live: LocalCluster, tmp_path: Path) -> None:
    assert _run_json(live, "reshard", "status") is None  # no migration yet
    plan = _run_json(live, "reshard", "plan", "--remove", "n2")
    assert {(m["source"], m["target"]) for m in plan["moves"]} == {("n2", "n1")}
    redis = RedisProcess(port=free_port(), data_dir=tmp_path / "redis-n3", aof=False)
    port = free_port()
    channel, liveness = free_port(avoid={port}), free_port(avoid={port})
    while liveness == channel:
        liveness = free_port(avoid={port})
    log = tmp_path / "node-n3.log"
    side_ports = ("--channel-port", str(channel), "--liveness-port", str(liveness))
    spare = node_process(
        "n3", port, redis.url, log=log, env=live.env(), extra=("--json", *side_ports)
    )
    redis.start()
    try:
        with spare:
            # The side ports given are the ones announced to the routers.
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as got:
                health = json.loads(got.read())
            assert (health["channel"], health["live"]) == (channel, liveness)
            with urllib.request.urlopen(f"http://127.0.0.1:{liveness}/", timeout=10) as got:
                assert got.read() == b"ok"
            added = _run_json(live, "node", "add", f"http://127.0.0.1:{port}", "--id", "n3")
            assert added["phase"] == "done"
            ids = [n["id"] for n in _run_json(live, "status")["nodes"]]
            assert ids == ["n1", "n2", "n3"]
            checks = [
                _http(live, "POST", "/v1/check", {"key": f"fixed:{i}", "limits": "5/minute"})
                for i in range(40)
            ]
            assert all(c["allowed"] and not c["degraded"] for c in checks)
            assert "n3" in {c["node"] for c in checks}
            removed = _run_json(live, "node", "remove", "n3")
            assert removed["phase"] == "done" and removed["epoch"] > added["epoch"]
            assert [n["id"] for n in _run_json(live, "status")["nodes"]] == ["n1", "n2"]
    finally:
        redis.stop()
    # `serve node --json`: its log lines are JSON objects.
    messages = [r["message"] for r in _json_log(log)]
    assert f"listening on http://127.0.0.1:{port}" in messages


def test_serve_router_json_logs(live: LocalCluster) -> None:
    log = live.routers[0].log
    assert log is not None
    listening = [r for r in _json_log(log) if r["message"].startswith("listening on")]
    assert [(r["level"], r["logger"], r["message"]) for r in listening] == [
        ("INFO", "shardlimit", f"listening on {live.router_url}")
    ]


def test_compare_json() -> None:
    done = _run(
        "compare", "--nodes", "3", "--add", "1", "--keys", "2000", "--vnodes", "40", "--json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["parameters"] == {
        "nodes": 3,
        "change": 1,
        "operation": "add",
        "keys": 2000,
        "seed": 1,
        "vnodes": [40],
    }
    assert [(r["mode"], r["vnodes"]) for r in result["rows"]] == [("ring", 40), ("slots", None)]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_json(shell: str) -> None:
    done = _run("completion", shell, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "shell": shell,
        "script": completion_script(build_parser(), shell),
    }


def test_json_log_lines_carry_extra_fields() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("shardlimit.test-json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("node %s is %s", "n1", "down", extra={"node": "n1", "failures": 3})
    finally:
        logger.removeHandler(handler)
    record = json.loads(out.getvalue())
    assert record.pop("ts").endswith("+00:00")
    assert record == {
        "level": "WARNING",
        "logger": "shardlimit.test-json",
        "message": "node n1 is down",
        "node": "n1",
        "failures": 3,
    }


def test_every_command_offers_json() -> None:
    """Every leaf command of the parser takes --json (bench and completion parse their
    own arguments and are tested above / in bench)."""
    missing = []

    def walk(path: str, parser: Parser) -> None:
        if not parser.commands and path not in ("bench", "completion"):
            options = {o for a in parser.options for o in a.option_strings}
            if "--json" not in options:
                missing.append(path)
        for name, child in parser.commands.items():
            walk(f"{path} {name}".strip(), child)

    walk("", build_parser())
    assert missing == []
