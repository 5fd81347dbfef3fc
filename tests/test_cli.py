"""The command line: its help, verbs, the old spellings, one-line mistakes, completion."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.cli import build_parser, completion_script, legacy_spelling

pytestmark = pytest.mark.timeout(60)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SHARDLIMIT_ROUTER="http://127.0.0.1:1")
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args],
        capture_output=True, text=True, env=env, timeout=30, check=False,
    )  # fmt: skip


def test_help_lists_every_command_and_hides_nothing() -> None:
    done = _run("--help")
    assert done.returncode == 0
    assert "SUPPRESS" not in done.stdout
    for command in ("up", "serve", "status", "node", "reshard", "rules", "compare", "bench",
                    "completion"):  # fmt: skip
        assert re.search(rf"\n    {command}\s", done.stdout), command
    serve = _run("serve", "--help").stdout
    assert "router" in serve and "node" in serve
    node = _run("node", "--help").stdout
    assert "add" in node and "remove" in node and "--redis" not in node


def test_old_spellings_still_work_for_one_release() -> None:
    assert legacy_spelling(["router", "--config", "c.yaml"]) == [
        "serve", "router", "--config", "c.yaml",
    ]  # fmt: skip
    assert legacy_spelling(["node", "--id", "n1"]) == ["serve", "node", "--id", "n1"]
    assert legacy_spelling(["node-add", "http://h:1"]) == ["node", "add", "http://h:1"]
    assert legacy_spelling(["node", "add", "http://h:1"]) == ["node", "add", "http://h:1"]
    assert legacy_spelling(["node", "--help"]) == ["node", "--help"]
    args = build_parser().parse_args(legacy_spelling(["node", "--id", "n1", "--port", "7001",
                                                      "--redis", "redis://x:1/0"]))  # fmt: skip
    assert (args.command, args.service, args.id, args.port) == ("serve", "node", "n1", 7001)


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (("bogus",), 2, "invalid choice: 'bogus'"),
        (("up", "--routers", "0"), 2, "--routers: must be a whole number from 1 to 64"),
        (("serve", "node", "--id", "n1"), 2, "the following arguments are required"),
        (("node", "add"), 2, "the following arguments are required: url"),
        (("reshard", "explode"), 2, "invalid choice: 'explode'"),
        (("rules", "apply", "-f", "/nonexistent/rules.yaml"), 1, "cannot read /nonexistent"),
        (("status",), 1, "cannot reach the router at http://127.0.0.1:1"),
        (("node", "remove", "n9"), 1, "cannot reach the router"),
        (("serve", "router", "--config", "/nonexistent.yaml"), 2, "cannot read /nonexistent"),
        (("completion", "fish"), 2, "completion takes bash or zsh"),
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


def test_completion_knows_commands_and_options(tmp_path: Path) -> None:
    script = completion_script(build_parser(), "bash")
    assert '"") words="' in script and " serve " in script
    assert '"serve node") words="--cluster-token-file --help --host --id --port' in script
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
