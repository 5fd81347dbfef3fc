"""bench/results/latest.png: the run's comparisons on one page (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import NullFormatter

MET, MISSED, BASE = "#2a9d55", "#d1495b", "#8d99ae"
OTHER = "#edae49"  # a second baseline


def _not_run(ax: Axes, title: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _targets(ax: Axes, targets: dict[str, dict[str, Any]]) -> None:
    ratios = {n: t for n, t in targets.items() if t["target"].startswith(">=")}
    if not ratios:
        _not_run(ax, "ratios vs targets")
        return
    names = list(ratios)
    values = [ratios[n]["measured"] or 0.0 for n in names]
    goals = [float(ratios[n]["target"].split()[1]) for n in names]
    colors = [MET if ratios[n]["met"] else MISSED for n in names]
    ax.barh(names, values, color=colors)
    ax.scatter(goals, names, marker="|", s=400, color="black", zorder=3, label="target")
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.3g}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    # Plain decimal ticks: the log axis' own minor labels overlap on a span this short.
    ticks = [t for t in (0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0) if t <= 2 * max(values + goals)]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks(range(len(names)), [n.replace("_vs_", "\nvs ") for n in names])
    ax.set_title("ratios (green: target met; | = target)")
    ax.tick_params(axis="y", labelsize=7)


def _throughput(ax: Axes, results: dict[str, Any]) -> None:
    pairs: list[tuple[str, float, str]] = []
    if "single" in results:
        r = results["single"]
        pairs += [
            ("router\n/v1/check", r["router_checks_per_s"], MISSED),
            ("trivial\naiohttp", r["trivial_requests_per_s"], BASE),
        ]
    if "batch" in results:
        r = results["batch"]
        pairs += [
            ("router\nbatch", r["router_decisions_per_s"], MISSED),
            ("redis\nEVALSHA", r["redis_evalsha_per_s"], BASE),
        ]
    if "sdk" in results:
        r = results["sdk"]
        pairs += [
            ("SDK", r["sdk_decisions_per_s"], MISSED),
            ("limits\ncoredis", r["limits_decisions_per_s"], BASE),
            ("limits\nredis-py", r["limits_redispy_decisions_per_s"], BASE),
        ]
    if not pairs:
        _not_run(ax, "throughput, side by side")
        return
    ax.bar([p[0] for p in pairs], [p[1] for p in pairs], color=[p[2] for p in pairs])
    for x, (_, v, _c) in enumerate(pairs):
        ax.text(x, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("decisions (requests) / s")
    ax.set_title("throughput, side by side (same run)")
    ax.tick_params(axis="x", labelsize=7)


def _latency(ax: Axes, results: dict[str, Any]) -> None:
    if "latency" not in results:
        _not_run(ax, "open-loop latency")
        return
    r = results["latency"]
    labels = ["p50", "p99", "p999"]
    sides = [("router", "", MISSED), ("one process, one Redis", "one_redis_", OTHER)]
    sides.append(("floor (trivial)", "floor_", BASE))
    sides = [side for side in sides if f"{side[1]}p99_ms" in r]
    xs = range(len(labels))
    width = 0.8 / len(sides)
    for index, (label, prefix, color) in enumerate(sides):
        values = [r[f"{prefix}{q}_ms"] or 0 for q in ("p50", "p99", "p999")]
        offset = (index - (len(sides) - 1) / 2) * width
        ax.bar([x + offset for x in xs], values, width=width, color=color, label=label)
    if r.get("floor_p99_ms"):
        target = 3 * r["floor_p99_ms"]
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label="p99 target: 3x floor")
    ax.set_xticks(list(xs), labels)
    ax.set_yscale("log")
    ax.set_ylabel("ms from scheduled send")
    ax.set_title(f"open loop at {r['rate_per_s']:g}/s")
    ax.legend(fontsize=7)


def _scaling(ax: Axes, results: dict[str, Any]) -> None:
    if "scaling" not in results:
        _not_run(ax, "decisions/s by node count")
        return
    per = results["scaling"]["decisions_per_s"]
    ax.bar(list(per), list(per.values()), color=BASE)
    for x, v in enumerate(per.values()):
        ax.text(x, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("nodes")
    ax.set_ylabel("decisions / s (batch of 100)")
    ax.set_title("scaling on 2 cores")


def _memory(ax: Axes, results: dict[str, Any]) -> None:
    if "memory" not in results:
        _not_run(ax, "Redis bytes per counter")
        return
    per = results["memory"]["bytes_per_key"]
    ax.barh(list(per), list(per.values()), color=BASE)
    ax.axvline(100, color="black", linestyle="--", linewidth=1, label="fixed_window target")
    ax.invert_yaxis()
    ax.set_xlabel("bytes per key")
    ax.set_title("Redis memory per counter")
    ax.legend(fontsize=7)
    ax.tick_params(axis="y", labelsize=7)


def _cpu(ax: Axes, results: dict[str, Any]) -> None:
    windows: list[tuple[str, dict[str, Any]]] = []
    if "single" in results:
        windows += [
            ("single\nrouter", results["single"]["runs"]["router"][0]["cpu"]),
            ("single\ntrivial", results["single"]["runs"]["trivial"][0]["cpu"]),
        ]
    if "batch" in results:
        windows.append(("batch\nrouter", results["batch"]["runs"]["router"][0]["cpu"]))
    if "latency" in results:
        windows.append(("open loop\nrouter", results["latency"]["router"]["cpu"]))
    if not windows:
        _not_run(ax, "CPU split")
        return
    roles: list[str] = []
    for _, cpu in windows:
        roles += [r for r in cpu["cores"] if r not in roles]
    roles.append("outside")
    bottoms = [0.0] * len(windows)
    cmap = plt.get_cmap("tab10")
    for i, role in enumerate(roles):
        values = [
            cpu["outside_this_benchmark_cores"] if role == "outside" else cpu["cores"].get(role, 0)
            for _, cpu in windows
        ]
        ax.bar([w[0] for w in windows], values, bottom=bottoms, label=role, color=cmap(i % 10))
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.axhline(windows[0][1]["cpus"], color="black", linewidth=1)
    ax.set_ylabel("cores")
    ax.set_title("CPU split (first round)")
    ax.legend(fontsize=6, ncol=2)
    ax.tick_params(axis="x", labelsize=7)


def draw(results: dict[str, Any], path: Path) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    _targets(axes[0][0], results.get("targets", {}))
    _throughput(axes[0][1], results)
    _latency(axes[0][2], results)
    _scaling(axes[1][0], results)
    _memory(axes[1][1], results)
    _cpu(axes[1][2], results)
    fig.suptitle(
        f"shardlimit make bench, {results.get('started', '')} "
        f"({results.get('seconds', '?')} s, 2 cores shared)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
