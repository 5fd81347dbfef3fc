"""Tests for cluster.cli.compare: ring vs slots key movement and balance on resize."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cluster.cli.command_tree import Parser
from cluster.cli.compare import (
    CompareRow,
    add_arguments,
    compare,
    make_keys,
    plot,
    run,
    total_steps,
)
from cluster.model.partition import routing_part

KEYS = make_keys(20_000)


def _by_vnodes(rows: list[CompareRow]) -> dict[int | None, CompareRow]:
    return {row.vnodes: row for row in rows}


def _parse(*argv: str) -> argparse.Namespace:
    parser = Parser(prog="shardlimit compare")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_make_keys_deterministic_and_shaped() -> None:
    assert make_keys(5000, seed=7) == make_keys(5000, seed=7)
    assert make_keys(5000, seed=7) != make_keys(5000, seed=8)
    assert len(set(KEYS)) == len(KEYS)
    tagged = sum(routing_part(key) != key for key in KEYS) / len(KEYS)
    assert 0.08 <= tagged <= 0.12
    merchants = sum(key.startswith("merchant:") for key in KEYS) / len(KEYS)
    assert 0.17 <= merchants <= 0.23


def test_add_one_node_to_three() -> None:
    steps: list[int] = []
    rows = compare(3, 1, KEYS, progress=lambda _label, count: steps.append(count))
    assert sum(steps) == total_steps(len(KEYS))
    assert [(row.mode, row.vnodes) for row in rows] == [
        ("ring", 40),
        ("ring", 160),
        ("ring", 500),
        ("ring", 1000),
        ("slots", None),
    ]
    for row in rows:
        assert row.unnecessary_moves == 0, row
        assert row.ideal_fraction == pytest.approx(0.25)
        assert row.keys_per_second > 0
    by = _by_vnodes(rows)
    slots = by[None]
    assert slots.moved_fraction == pytest.approx(0.25, abs=0.02)
    assert slots.slots_moved is not None and abs(slots.slots_moved - 4096) <= 1
    assert slots.moved_over_ideal == pytest.approx(slots.moved_fraction / 0.25)
    assert 0.15 <= by[160].moved_fraction <= 0.35
    assert by[160].slots_moved is None
    # More virtual nodes spread keys more evenly, before and after the change.
    assert by[1000].max_over_mean_after <= by[40].max_over_mean_after
    assert by[1000].max_over_mean_before <= by[40].max_over_mean_before
    for row in rows:
        assert row.min_over_mean_after <= 1.0 <= row.max_over_mean_after


def test_remove_one_node_of_four() -> None:
    rows = compare(4, 1, KEYS, remove=True, vnodes_list=(160, 1000))
    assert len(rows) == 3
    for row in rows:
        assert row.unnecessary_moves == 0, row
        assert row.ideal_fraction == pytest.approx(0.25)
        assert row.moved_fraction == pytest.approx(0.25, abs=0.06), row
    by = _by_vnodes(rows)
    assert by[1000].moved_fraction == pytest.approx(0.25, abs=0.03)
    assert by[None].moved_fraction == pytest.approx(0.25, abs=0.02)
    assert by[None].slots_moved == 4096


def test_compare_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="remain"):
        compare(2, 2, KEYS[:10], remove=True)
    with pytest.raises(ValueError, match="key"):
        compare(3, 1, [])
    with pytest.raises(ValueError, match="vnodes"):
        compare(3, 1, KEYS[:10], vnodes_list=(0,))


def test_run_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_parse("--nodes", "3", "--add", "1", "--keys", "3000", "--json")) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["parameters"]["nodes"] == 3
    assert document["parameters"]["change"] == 1
    assert document["parameters"]["operation"] == "add"
    assert document["parameters"]["keys"] == 3000
    assert document["parameters"]["vnodes"] == [40, 160, 500, 1000]
    rows = document["rows"]
    assert len(rows) == 5
    for row in rows:
        for field in ("moved_fraction", "ideal_fraction", "moved_over_ideal", "keys_per_second"):
            assert isinstance(row[field], float)
        assert row["unnecessary_moves"] == 0
    assert rows[-1]["mode"] == "slots"
    assert rows[-1]["vnodes"] is None
    assert isinstance(rows[-1]["slots_moved"], int)
    assert captured.err == ""  # no progress bar with --json


def test_run_table_and_remove(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_parse("--nodes", "4", "--remove", "1", "--keys", "2000", "--vnodes", "64")) == 0
    out = capsys.readouterr().out
    assert "4 -> 3 nodes" in out
    assert "ring" in out and "slots" in out
    assert run(_parse("--nodes", "2", "--remove", "2", "--keys", "10")) == 2


def test_add_and_remove_are_exclusive() -> None:
    with pytest.raises(SystemExit):
        _parse("--nodes", "3", "--add", "1", "--remove", "1")
    with pytest.raises(SystemExit):
        _parse("--nodes", "3", "--keys", "10")


def test_run_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "compare.png"
    argv = ("--nodes", "3", "--add", "1", "--keys", "2000", "--json", "--plot", str(target))
    assert run(_parse(*argv)) == 0
    assert json.loads(capsys.readouterr().out)["plot"] == str(target)
    data = target.read_bytes()
    assert len(data) > 1000
    assert data.startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_slots_only(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = compare(3, 1, KEYS[:500], vnodes_list=())
    target = tmp_path / "slots.png"
    plot(rows, target, "slots only")
    assert target.stat().st_size > 1000
