"""The latency piece's rounds: each figure is the median of the rounds' own figures."""

from __future__ import annotations

from typing import Any

import pytest

from bench.compare import median_figures, round_figures

pytestmark = pytest.mark.timeout(10)


def _run(p50: float, p99: float, p999: float, cores: dict[str, float]) -> dict[str, Any]:
    return {
        "p50_ms": p50,
        "p99_ms": p99,
        "p999_ms": p999,
        "degraded": 1,
        "cpu": {"cores": cores, "wakeups_per_s": {role: 1000.0 for role in cores}},
    }


def _round(router_p99: float, floor_p99: float, router_cores: float) -> dict[str, Any]:
    return {
        "router": _run(0.5, router_p99, 2 * router_p99, {"router": router_cores, "nodes": 0.1}),
        "floor": _run(0.2, floor_p99, 2 * floor_p99, {"trivial aiohttp": 0.1}),
        "one-Redis": _run(
            0.3, floor_p99, 2 * floor_p99, {"one-Redis aiohttp": 0.2, "one-Redis redis": 0.1}
        ),
    }


def test_a_rounds_ratios_are_between_its_own_runs() -> None:
    figures = round_figures(_round(router_p99=3.0, floor_p99=1.0, router_cores=0.2), 1000.0)
    assert figures["p99_vs_floor"] == 3.0
    assert figures["p999_vs_floor"] == 3.0
    # (0.2 + 0.1) cores ÷ 1,000/s = 300 µs per check, against 100 µs per request
    assert figures["cpu_usec_per_check"] == {
        "router": 200.0,
        "nodes": 100.0,
        "redis": 0.0,
        "total": 300.0,
    }
    assert figures["cpu_vs_floor"] == 3.0
    assert figures["one_redis_cpu_vs_floor"] == 3.0
    assert figures["wakeups_per_check"] == {"router": 1.0, "nodes": 1.0, "redis": 0.0, "total": 2.0}


def test_each_figure_is_the_median_of_the_rounds_and_degraded_answers_add_up() -> None:
    rounds = [
        round_figures(_round(router_p99=p99, floor_p99=floor, router_cores=cores), 1000.0)
        for p99, floor, cores in ((3.0, 1.0, 0.2), (9.0, 1.0, 0.5), (4.0, 4.0, 0.3))
    ]
    merged = median_figures(rounds)
    # ratios 3, 9 and 1: their median, not the ratio of the medians (4.0 / 1.0)
    assert merged["p99_vs_floor"] == 3.0
    assert merged["p99_ms"] == 4.0
    assert merged["floor_p99_ms"] == 1.0
    # CPU by role: medians of 200/500/300 and 100/100/100; the total is its own median
    assert merged["cpu_usec_per_check"] == {
        "router": 300.0,
        "nodes": 100.0,
        "redis": 0.0,
        "total": 400.0,
    }
    assert merged["cpu_vs_floor"] == 4.0
    assert merged["degraded"] == 3


def test_a_figure_missing_from_some_rounds_is_the_median_of_the_others() -> None:
    merged = median_figures([{"p99_ms": None}, {"p99_ms": 2.0}, {"p99_ms": 4.0}])
    assert merged == {"p99_ms": 3.0}
    assert median_figures([{"p99_ms": None}]) == {"p99_ms": None}
