"""Chaos figures: the fault scenarios of tests/system/test_chaos.py, timed.

Each scenario starts its own real processes through the cluster launcher (redis-server
with AOF, `shardlimit serve node` x3, `shardlimit serve router`), runs 24 concurrent
clients on keys spread over every node (a fixed_window rule that fails open and a
calendar rule that fails closed), injects the fault, and reports:

* per fault (Redis SIGKILL, node SIGKILL, node SIGSTOP): p50/p99/max latency of the
  answers for the failed node's keys and for the other nodes' keys while it is down,
  how long the breaker took to open, how long the restart itself took, and the
  recovery time (the failed component is back -> first normal answer; "stable": -> the
  last degraded answer for its keys, i.e. no relapse after);
* Redis SIGKILLed while acknowledged writes stream in, for appendfsync everysec and
  always: acknowledged writes lost and the loss window (how long before the kill the
  oldest lost write had been acknowledged);
* a router SIGKILLed among all_or_nothing batches: batches in flight, caught with
  holds, and whether any ended partial.

    python -m bench.chaos [--concurrency 24] [--fault-seconds 3] [--only faults] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.chaos_scenarios import (
    FAULTS,
    Answer,
    ChaosCluster,
    Fault,
    FaultSizes,
    percentiles_ms,
    run_durability,
    run_fault,
    run_router_kill,
)
from router.channel.breaker import CIRCUIT_OPEN

TARGET_P99_MS = 100.0
TARGET_RECOVERY_S = 1.0
# A hung node cannot answer "refused": it is declared down by the liveness probe. Its
# target is that bound, and fast answers once it is known down.
TARGET_HUNG_DOWN_S = 0.3


def _reasons(answers: Iterable[Answer]) -> dict[str, int]:
    """Degraded answers by reason (router.dispatch.Reason: down, timeout, unavailable...)."""
    out: Counter[str] = Counter()
    for a in answers:
        if a.degraded:
            reason = a.reason or ""
            out[reason.split(":", 1)[0] or "unknown"] += 1
    return dict(out)


async def fault_figures(root: Path, fault: Fault, args: argparse.Namespace) -> dict[str, Any]:
    cluster = await ChaosCluster.start(root / fault)
    try:
        sizes = FaultSizes(
            warm_answers=3000,
            fault_answers=500,
            post_answers=500,
            min_fault_s=args.fault_seconds,
            min_post_s=2.0,
        )
        run = await run_fault(
            cluster, fault, concurrency=args.concurrency, sizes=sizes, read_usage=False
        )
    finally:
        await cluster.close()
    victim = run.victim_answers(run.fault_at, run.heal_started_at)
    others = run.other_answers(run.fault_at, run.heal_started_at)
    before = run.other_answers(0.0, run.fault_at)
    breaker = [a.received for a in victim if CIRCUIT_OPEN in (a.reason or "")]
    victim_p = percentiles_ms([a.latency for a in victim])
    recovery_s = run.recovered_at - run.heal_at
    # Stricter: from the fault's end until the victim's answers are normal for good.
    relapses = [a.received for a in run.victim_answers(run.heal_at, float("inf")) if a.degraded]
    stable_s = max([run.recovered_at, *relapses]) - run.heal_at
    p99 = victim_p["p99_ms"]
    opened_at = min(breaker) if breaker else float("inf")
    after_open = percentiles_ms([a.latency for a in victim if a.sent >= opened_at])
    targets: dict[str, bool] = {
        "recovery_le_1s": recovery_s <= TARGET_RECOVERY_S,
        "stable_recovery_le_1s": stable_s <= TARGET_RECOVERY_S,
    }
    if fault == "node_stop":
        after_p99 = after_open["p99_ms"]
        targets["hung_declared_down_le_300ms"] = opened_at - run.fault_at <= TARGET_HUNG_DOWN_S
        targets["victim_p99_once_down_le_100ms"] = (
            after_p99 is not None and after_p99 <= TARGET_P99_MS
        )
    else:
        targets["victim_p99_le_100ms"] = p99 is not None and p99 <= TARGET_P99_MS
    return {
        "victim_keys_while_down": victim_p,
        "victim_keys_once_marked_down": after_open,
        "other_keys_while_down": percentiles_ms([a.latency for a in others]),
        "other_keys_before_fault": percentiles_ms([a.latency for a in before]),
        "breaker_open_after_s": round(min(breaker) - run.fault_at, 3) if breaker else None,
        "node_requests_while_open": run.requests_at_heal - run.requests_at_open,
        "down_for_s": round(run.heal_started_at - run.fault_at, 2),
        "restart_took_s": round(run.heal_at - run.heal_started_at, 3),
        "recovery_s": round(recovery_s, 3),
        "stable_recovery_s": round(stable_s, 3),
        "degraded_other_answers_while_down": sum(1 for a in others if a.degraded),
        "degraded_other_answers": _reasons(a for a in run.answers if a.node != run.victim),
        "degraded_victim_answers_after_recovery": _reasons(
            run.victim_answers(run.post_from, float("inf"))
        ),
        "answers": len(run.answers),
        "problems": len(run.problems),
        "targets_met": targets,
    }


async def durability_figures(root: Path, appendfsync: str) -> dict[str, Any]:
    cluster = await ChaosCluster.start(root / f"aof-{appendfsync}", appendfsync=appendfsync)
    try:
        run = await run_durability(cluster, run_s=5.0)
    finally:
        await cluster.close()
    acked = sum(len(a) for a in run.acks.values())
    return {
        "acknowledged_writes": acked,
        "lost_acknowledged_writes": sum(run.lost(k) for k in run.acks),
        "loss_window_s": round(run.loss_window_s(), 3),
        "amounts_match_counts": all(
            amount == count * run.amount_minor for count, amount in run.survived.values()
        ),
        "problems": len(run.problems),
    }


async def router_kill_figures(root: Path) -> dict[str, Any]:
    cluster = await ChaosCluster.start(root / "router-kill", aon_hold="1s")
    try:
        run = await run_router_kill(cluster, answered_before_kill=400)
    finally:
        await cluster.close()
    in_flight = run.in_flight()
    return {
        "aon_hold_s": 1.0,
        "batches_sent": len(run.batches),
        "answered_before_kill": len(run.answered),
        "in_flight_at_kill": len(in_flight),
        "in_flight_outcomes": dict(Counter(run.outcome(b) for b in in_flight)),
        "in_flight_with_holds_at_kill": len(run.caught_mid_flight()),
        "answered_rolled_back": sum(1 for allowed in run.answered.values() if not allowed),
        "hold_entries_at_kill": run.holds_at_kill,
        "partial_batches": sum(1 for b in run.batches if run.outcome(b) == "partial"),
        "holds_given_back_after_s": round(run.given_back_s, 2),
        "problems": len(run.problems),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sl-chaos-") as tmp:
        root = Path(tmp)
        only = args.only
        faults = {f: await fault_figures(root, f, args) for f in FAULTS if only in (None, "faults")}
        durability = {
            mode: await durability_figures(root, mode)
            for mode in ("everysec", "always")
            if only in (None, "durability")
        }
        router_kill = await router_kill_figures(root) if only in (None, "router_kill") else None
    return {
        "node_deadline_ms": 1000,
        "concurrency": args.concurrency,
        "faults": faults,
        "redis_sigkill_under_writes": durability,
        "router_sigkill_all_or_nothing": router_kill,
        "targets": {"victim_p99_ms": TARGET_P99_MS, "recovery_s": TARGET_RECOVERY_S},
        "all_targets_met": all(all(f["targets_met"].values()) for f in faults.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--fault-seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--only", choices=("faults", "durability", "router_kill"))
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
