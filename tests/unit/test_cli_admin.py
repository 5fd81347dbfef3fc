"""The command line's pure parts: the router URL and node ids it takes, the path segments
it builds, how it tells a finished migration from an undone one, what `usage` and
`--no-wait` print, the --plot names it refuses, completion words, the bench checkout."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cluster.cli.admin import (
    AdminError,
    _started_line,
    node_id,
    outcome,
    router_url,
    segment,
    with_url,
    without,
)
from cluster.cli.compare import plot_path_problem
from cluster.cli.completion import completion_script
from cluster.cli.main import bench_checkout
from cluster.cli.parser import build_parser
from cluster.cli.usage import degraded_line, describe

pytestmark = pytest.mark.timeout(30)
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("http://127.0.0.1:99999", "--router's port must be a number from 1 to 65535"),
        ("127.0.0.1:0", "--router's port must be a number from 1 to 65535"),
        ("http://h:port", "--router's port must be a number from 1 to 65535"),
        ("", "--router is empty"),
        ("http://", "--router needs a host"),
        ("http://[::1", "--router needs a host"),
        ("ftp://h:1", "--router must be an http:// or https:// URL"),
    ],
)
def test_a_router_url_that_cannot_be_one_is_a_mistake(given: str, says: str) -> None:
    with pytest.raises(AdminError) as refused:
        router_url(given)
    assert refused.value.code == 2 and str(refused.value).startswith(says)


def test_router_urls_that_are_fine() -> None:
    assert router_url("127.0.0.1:8080") == "http://127.0.0.1:8080"
    assert router_url("https://[::1]:65535/") == "https://[::1]:65535"
    assert router_url("http://router.example") == "http://router.example"


@pytest.mark.parametrize("bad", ["n1?x=1", "n2?dry_run=0&", "a/b", "", "n 1", "x" * 65])
def test_a_node_id_is_checked_as_the_router_does(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        node_id(bad)
    assert node_id("n-1.a:b_2") == "n-1.a:b_2"


def test_a_path_segment_starts_no_query_and_no_path() -> None:
    assert segment("n2?dry_run=0&") == "n2%3Fdry_run%3D0%26"
    assert segment("a/b#c") == "a%2Fb%23c"
    assert segment("n1") == "n1"


NODES = [
    {"id": "n1", "url": "http://h:1", "endpoints": [{"url": "http://h:1"}]},
    {"id": "n2", "url": "http://h:2", "endpoints": [{"url": "http://h:2"}, {"url": "http://h:9"}]},
]


def _info(migration: dict[str, Any] | None) -> dict[str, Any]:
    return {"epoch": 7, "nodes": NODES, "migration": migration}


def test_a_followed_migration_ends_done_paused_or_undone() -> None:
    going = {"id": "m1", "phase": "copying", "running": True}
    assert outcome("m1", _info(going), without("n3")) == "going"
    paused = {**going, "running": False, "last_error": "n3 unreachable"}
    assert outcome("m1", _info(paused), without("n3")) == "paused"
    done = {"id": "m1", "phase": "done", "running": False}
    assert outcome("m1", _info(done), without("n3")) == "done"
    assert outcome("m1", _info(done), without("n2")) == "undone"  # n2 is still there
    reverting = {"id": "m2", "phase": "copying", "running": True, "reverts": "m1"}
    assert outcome("m1", _info(reverting), without("n3")) == "undone"
    assert outcome("m1", _info({**reverting, "phase": "done", "running": False}), None) == (
        "undone"
    )
    # Another migration since: only the layout tells.
    other = {"id": "m9", "phase": "copying", "running": True}
    assert outcome("m1", _info(other), with_url("http://h:9/")) == "done"
    assert outcome("m1", _info(other), with_url("http://h:3")) == "undone"
    assert outcome("m1", _info(None), without("n2", "http://h:9")) == "undone"
    assert outcome("m1", _info(None), without("n1", "http://h:9")) == "done"
    assert outcome("m1", _info(None), None) == "done"


def test_no_wait_says_what_started_as_text() -> None:
    assert _started_line({"epoch": 8, "migration": "ab12", "moves": [{}, {}]}) == (
        "started: migration ab12, epoch 8, 2 moves (`shardlimit reshard status` to follow it)"
    )
    assert _started_line({"epoch": 9, "migration": "cd34", "reverts": "ab12"}) == (
        "started: migration cd34, undoing migration ab12, epoch 9 "
        "(`shardlimit reshard status` to follow it)"
    )


def test_usage_shows_a_count_and_an_amount_both() -> None:
    calendar = {
        "algorithm": "calendar",
        "limit": 4,
        "remaining": 3,
        "max_amount": "9.50",
        "amount_remaining": "7.00",
        "reset_after_ms": 3_600_000,
        "period": "day",
    }
    assert describe(calendar) == (
        "calendar (day): remaining 3 of 4, amount remaining 7.00 of 9.50, resets in 1h"
    )
    amount_only = {**calendar, "limit": None, "remaining": None}
    assert describe(amount_only) == "calendar (day): amount remaining 7.00 of 9.50, resets in 1h"
    quota = {"algorithm": "quota", "limit": 10, "remaining": 10, "reset_after_ms": None}
    assert describe({**quota, "max_amount": "5.00", "amount_remaining": "5.00"}) == (
        "quota: remaining 10 of 10, amount remaining 5.00 of 5.00"
    )


def test_a_degraded_usage_answer_is_one_line_without_none() -> None:
    answer = {
        "key": "k",
        "rule": "r",
        "node": "n2",
        "degraded": True,
        "degraded_reason": "node_down: connection refused",
        "limits": [{"algorithm": "concurrency", "limit": 3, "remaining": None}],
    }
    assert degraded_line(answer) == (
        "usage of k (r) unknown: its node n2 could not answer (node_down: connection refused)"
    )


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("p.txt", "--plot writes a PNG: give a file name ending in .png, not 'p.txt'"),
        ("p", "--plot writes a PNG: give a file name ending in .png, not 'p'"),
        ("/nonexistent/dir/p.png", "--plot: cannot write /nonexistent/dir/p.png: no directory"),
    ],
)
def test_a_plot_name_that_cannot_be_written_is_refused(name: str, says: str) -> None:
    problem = plot_path_problem(Path(name))
    assert problem is not None and problem.startswith(says)
    assert plot_path_problem(Path("p.PNG")) is None


def test_completion_offers_reshard_actions_and_each_command_once(tmp_path: Path) -> None:
    script = completion_script(build_parser(), "bash")
    top = next(line for line in script.splitlines() if line.strip().startswith('"")'))
    words = top.split('words="')[1].split('"')[0].split()
    assert len(words) == len(set(words)) and {"bench", "completion"} <= set(words)
    probe = tmp_path / "probe.sh"
    probe.write_text(
        script
        + 'COMP_WORDS=(shardlimit reshard ""); COMP_CWORD=2; _shardlimit; '
        + 'echo "${COMPREPLY[@]}"\n'
        + "COMP_WORDS=(shardlimit reshard plan --r); COMP_CWORD=3; _shardlimit; "
        + 'echo "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(["bash", str(probe)], capture_output=True, text=True, check=True)
    actions, options = out.stdout.splitlines()
    assert {"plan", "apply", "status", "resume", "abort"} <= set(actions.split())
    assert options.split() == ["--remove", "--router"]


def test_bench_finds_this_checkout() -> None:
    assert bench_checkout() == ROOT
    assert (ROOT / "bench" / "run.py").is_file()
