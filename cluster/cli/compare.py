"""`shardlimit compare`: ring vs slots when a cluster grows or shrinks.

Owners of the same generated keys are computed with each partitioner's `owner()` before
and after `Partitioner.resized`, and the rows report how many keys moved (vs the ideal
K/(N+K) on add, K/N on remove), whether any key moved between two surviving nodes (an
"unnecessary move": should be 0), and how evenly keys spread over the nodes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from cluster.cli.command_tree import Exclusive, Parser
from cluster.cli.serve import refuse
from cluster.model.nodes import NodeSpec
from cluster.model.partition import (
    HASH_SLOTS,
    MAX_VNODES,
    Partitioner,
    SlotPartitioner,
    new_partitioner,
)

__all__ = [
    "DEFAULT_VNODES_LIST",
    "CompareRow",
    "add_arguments",
    "compare",
    "make_keys",
    "plot",
    "plot_path_problem",
    "run",
    "total_steps",
]

DEFAULT_VNODES_LIST: tuple[int, ...] = (40, 160, 500, 1000)
_CHUNK = 50_000
_ID_SPACE = 10**9

ProgressFn = Callable[[str, int], None]


@dataclass(frozen=True)
class CompareRow:
    """One partitioner configuration's result (fractions are in [0, 1])."""

    mode: str
    vnodes: int | None
    moved_fraction: float
    ideal_fraction: float
    unnecessary_moves: int
    max_over_mean_after: float
    min_over_mean_after: float
    max_over_mean_before: float
    slots_moved: int | None
    keys_per_second: float

    @property
    def moved_over_ideal(self) -> float:
        """Moved fraction divided by the ideal fraction (1.0 is optimal)."""
        return self.moved_fraction / self.ideal_fraction if self.ideal_fraction else 0.0

    def to_dict(self) -> dict[str, object]:
        """Return a JSON-serialisable form, including `moved_over_ideal`."""
        data = asdict(self)
        data["moved_over_ideal"] = self.moved_over_ideal
        return data


def make_keys(count: int, seed: int = 1) -> list[str]:
    """Return `count` distinct, deterministic limit keys of realistic shapes.

    About 70% ``user:<n>``, 20% ``merchant:<n>:payments`` and 10% hash-tagged
    ``{user:<n>}:login``; ids are distinct, so every key is distinct.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(seed)
    ids = rng.sample(range(1, _ID_SPACE), count)
    keys: list[str] = []
    append = keys.append
    draw = rng.random
    for n in ids:
        shape = draw()
        if shape < 0.7:
            append(f"user:{n}")
        elif shape < 0.9:
            append(f"merchant:{n}:payments")
        else:
            append(f"{{user:{n}}}:login")
    return keys


def _cluster(count: int, start: int = 1) -> list[NodeSpec]:
    return [NodeSpec(id=f"n{i}", url=f"http://node-n{i}") for i in range(start, start + count)]


def total_steps(key_count: int, vnodes_list: Sequence[int] = DEFAULT_VNODES_LIST) -> int:
    """Return the sum of the counts `compare` reports to its progress callback."""
    return 2 * key_count * (len(vnodes_list) + 1)


def _owners(
    part: Partitioner, keys: list[str], label: str, progress: ProgressFn | None
) -> tuple[list[str], float]:
    """Return the owner of every key and the seconds spent in `owner()`."""
    owner = part.owner
    result: list[str] = []
    elapsed = 0.0
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        began = time.perf_counter()
        result.extend(map(owner, chunk))
        elapsed += time.perf_counter() - began
        if progress is not None:
            progress(label, len(chunk))
    return result, elapsed


def _spread(owners: list[str], node_ids: Sequence[str]) -> tuple[float, float]:
    """Return (max/mean, min/mean) of keys per node, counting nodes that got no key."""
    counts = Counter(owners)
    per_node = [counts.get(node_id, 0) for node_id in node_ids]
    mean = len(owners) / len(node_ids)
    if mean == 0:
        return 0.0, 0.0
    return max(per_node) / mean, min(per_node) / mean


def _row(
    old: Partitioner,
    keys: list[str],
    new_nodes: Sequence[NodeSpec],
    ideal: float,
    vnodes: int | None,
    progress: ProgressFn | None,
) -> CompareRow:
    new = old.resized(new_nodes)
    label = old.kind if vnodes is None else f"{old.kind} vnodes={vnodes}"
    before, before_s = _owners(old, keys, f"{label}: before", progress)
    after, after_s = _owners(new, keys, f"{label}: after", progress)
    surviving = set(old.node_ids).intersection(new.node_ids)
    moves = Counter(pair for pair in zip(before, after, strict=True) if pair[0] != pair[1])
    moved = sum(moves.values())
    unnecessary = sum(n for (src, dst), n in moves.items() if src in surviving and dst in surviving)
    max_after, min_after = _spread(after, new.node_ids)
    max_before, _ = _spread(before, old.node_ids)
    slots_moved = None
    if isinstance(old, SlotPartitioner):
        slots_moved = sum(len(move.slots) for move in old.plan(new))
    seconds = before_s + after_s
    return CompareRow(
        mode=old.kind,
        vnodes=vnodes,
        moved_fraction=moved / len(keys),
        ideal_fraction=ideal,
        unnecessary_moves=unnecessary,
        max_over_mean_after=max_after,
        min_over_mean_after=min_after,
        max_over_mean_before=max_before,
        slots_moved=slots_moved,
        keys_per_second=2 * len(keys) / seconds if seconds > 0 else float("inf"),
    )


def compare(
    nodes: int,
    change: int,
    keys: list[str],
    *,
    remove: bool = False,
    vnodes_list: Sequence[int] = DEFAULT_VNODES_LIST,
    progress: ProgressFn | None = None,
) -> list[CompareRow]:
    """Compare ring (once per vnodes value) and slots when `nodes` grow/shrink by `change`.

    Nodes are ``n1..nN``; adding appends ``n{N+1}..n{N+K}``, removing drops the last K.
    `progress(label, count)` is called after each chunk of `count` keys is owned; the
    counts add up to `total_steps(len(keys), vnodes_list)`. Raises ValueError on bad input.
    """
    if nodes < 1:
        raise ValueError(f"need at least one node, got {nodes}")
    if change < 1:
        raise ValueError(f"the change must be at least one node, got {change}")
    if remove and change >= nodes:
        raise ValueError(f"cannot remove {change} of {nodes} nodes: at least one must remain")
    if not keys:
        raise ValueError("need at least one key")
    for vnodes in vnodes_list:
        if not 1 <= vnodes <= MAX_VNODES:
            raise ValueError(f"vnodes must be between 1 and {MAX_VNODES}, got {vnodes}")
    old_nodes = _cluster(nodes)
    if remove:
        new_nodes = old_nodes[: nodes - change]
        ideal = change / nodes
    else:
        new_nodes = old_nodes + _cluster(change, start=nodes + 1)
        ideal = change / (nodes + change)
    rows = [
        _row(new_partitioner("ring", old_nodes, vnodes=v), keys, new_nodes, ideal, v, progress)
        for v in vnodes_list
    ]
    rows.append(_row(new_partitioner("slots", old_nodes), keys, new_nodes, ideal, None, progress))
    return rows


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(parser: Parser) -> None:
    """Add the `compare` flags to `parser` (a subparser)."""
    parser.add_argument(
        "--nodes", type=_positive_int, required=True, metavar="N", help="nodes before the change"
    )
    change = Exclusive(parser, required=True)
    change.add_argument("--add", type=_positive_int, metavar="K", help="grow by K nodes")
    change.add_argument("--remove", type=_positive_int, metavar="K", help="shrink by K nodes")
    parser.add_argument(
        "--keys",
        type=_positive_int,
        default=1_000_000,
        metavar="M",
        help="keys to place (default 1,000,000)",
    )
    parser.add_argument(
        "--vnodes",
        type=_positive_int,
        nargs="+",
        default=list(DEFAULT_VNODES_LIST),
        metavar="V",
        help="ring vnodes values (default: 40 160 500 1000)",
    )
    parser.add_argument("--seed", type=int, default=1, help="key generator seed (default 1)")
    parser.add_argument("--plot", type=Path, metavar="FILE", help="write a PNG plot to FILE")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _title(nodes: int, change: int, remove: bool, key_count: int) -> str:
    after = nodes - change if remove else nodes + change
    return f"{nodes} -> {after} nodes, {key_count:,} keys"


def _print_table(rows: Sequence[CompareRow], title: str, elapsed: float) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, padding=0)
    headers = (
        "mode",
        "vnodes",
        "moved\n%",
        "ideal\n%",
        "moved/\nideal",
        "unnecessary\nmoves",
        "max/mean\nafter",
        "min/mean\nafter",
        "max/mean\nbefore",
        "keys/s",
    )
    for header in headers:
        table.add_column(header, justify="left" if header == "mode" else "right", overflow="fold")
    for row in rows:
        table.add_row(
            row.mode,
            "-" if row.vnodes is None else str(row.vnodes),
            f"{row.moved_fraction:.2%}",
            f"{row.ideal_fraction:.2%}",
            f"{row.moved_over_ideal:.3f}",
            f"{row.unnecessary_moves:,}",
            f"{row.max_over_mean_after:.3f}",
            f"{row.min_over_mean_after:.3f}",
            f"{row.max_over_mean_before:.3f}",
            f"{row.keys_per_second / 1e6:.2f} M",
        )
    notes = [
        f"slots: {row.slots_moved:,} of {HASH_SLOTS:,} slots reassigned"
        for row in rows
        if row.slots_moved is not None
    ]
    notes.append(f"wall time {elapsed:.1f} s")
    table.caption = "; ".join(notes)
    console = Console()
    if not console.is_terminal:  # piped: do not squeeze the table into 80 columns
        console = Console(width=200)
    console.print(table)


def _compute(args: argparse.Namespace, keys: list[str], change: int) -> list[CompareRow]:
    if args.json:
        return compare(
            args.nodes, change, keys, remove=args.remove is not None, vnodes_list=args.vnodes
        )
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description:<24}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("owning keys", total=total_steps(len(keys), args.vnodes))

        def advance(label: str, count: int) -> None:
            bar.update(task, description=label, advance=count)

        return compare(
            args.nodes,
            change,
            keys,
            remove=args.remove is not None,
            vnodes_list=args.vnodes,
            progress=advance,
        )


def run(args: argparse.Namespace) -> int:
    """Run `shardlimit compare`: print a table (or JSON with --json), write --plot."""
    started = time.perf_counter()
    remove = args.remove is not None
    change: int = args.remove if remove else args.add
    if remove and change >= args.nodes:
        left = "at least one must remain"
        return refuse("compare", f"cannot remove {change} of {args.nodes} nodes: {left}")
    if args.plot is not None:
        if (unusable := plot_path_problem(args.plot)) is not None:
            return refuse("compare", unusable)
        try:
            _require_matplotlib()
        except RuntimeError as exc:
            return refuse("compare", str(exc))
    keys = make_keys(args.keys, args.seed)
    try:
        rows = _compute(args, keys, change)
    except ValueError as exc:
        return refuse("compare", str(exc))
    elapsed = time.perf_counter() - started
    title = _title(args.nodes, change, remove, len(keys))
    if args.plot is not None:
        try:
            plot(rows, args.plot, title)
        except OSError as exc:
            return refuse("compare", f"--plot: cannot write {args.plot}: {exc.strerror or exc}")
    if args.json:
        document = {
            "parameters": {
                "nodes": args.nodes,
                "change": change,
                "operation": "remove" if remove else "add",
                "keys": len(keys),
                "seed": args.seed,
                "vnodes": list(args.vnodes),
            },
            "rows": [row.to_dict() for row in rows],
            "elapsed_seconds": elapsed,
            "plot": None if args.plot is None else str(args.plot),
        }
        print(json.dumps(document, indent=2))
    else:
        _print_table(rows, title, elapsed)
        if args.plot is not None:
            print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def plot_path_problem(path: Path) -> str | None:
    """Why --plot cannot write a PNG to `path`, known before any work (None: it can)."""
    if path.suffix.lower() != ".png":
        return f"--plot writes a PNG: give a file name ending in .png, not {str(path)!r}"
    if not path.parent.is_dir():
        return f"--plot: cannot write {path}: no directory {path.parent}"
    return None


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "--plot needs matplotlib, which is not installed: pip install 'shardlimit[plot]'"
        ) from exc


def plot(rows: Sequence[CompareRow], path: Path, title: str) -> None:
    """Write a two-panel PNG: moved fraction and max/mean imbalance vs ring vnodes.

    Slots (and the ideal moved fraction) are drawn as horizontal lines. Raises
    RuntimeError if matplotlib is not installed.
    """
    _require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ring = sorted((row for row in rows if row.vnodes is not None), key=lambda r: r.vnodes or 0)
    slots = [row for row in rows if row.vnodes is None]
    xs = [row.vnodes or 0 for row in ring]

    figure = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(figure)  # Agg canvas: no GUI backend, no pyplot global state
    moved_ax, spread_ax = figure.subplots(1, 2)

    if ring:
        moved_ax.plot(xs, [100 * r.moved_fraction for r in ring], "o-", label="ring")
        spread_ax.plot(xs, [r.max_over_mean_after for r in ring], "o-", label="ring, after")
        spread_ax.plot(
            xs,
            [r.max_over_mean_before for r in ring],
            "s--",
            color="tab:blue",
            alpha=0.45,
            label="ring, before",
        )
    if rows:
        moved_ax.axhline(100 * rows[0].ideal_fraction, color="grey", ls=":", label="ideal")
    for row in slots:
        moved_ax.axhline(100 * row.moved_fraction, color="tab:red", ls="--", label="slots")
        spread_ax.axhline(row.max_over_mean_after, color="tab:red", ls="--", label="slots")
    spread_ax.axhline(1.0, color="grey", ls=":", label="perfect balance")

    for ax in (moved_ax, spread_ax):
        if xs and min(xs) > 0:
            ax.set_xscale("log")
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.minorticks_off()
        ax.set_xlabel("ring vnodes per node")
        ax.grid(True, alpha=0.3)
        ax.legend()
    moved_ax.set_ylabel("keys moved (%)")
    moved_ax.set_title("keys moved")
    spread_ax.set_ylabel("max / mean keys per node")
    spread_ax.set_title("imbalance after the change")
    figure.suptitle(title)
    figure.savefig(path, dpi=120)
