"""Chaos under load, all real processes: a node's Redis SIGKILLed, a node SIGKILLed or
SIGSTOPped, Redis SIGKILLed while writes stream in, a router SIGKILLed mid-batch.

No timing assertions (the machine is shared): these assert behaviour and structure.
Latencies, recovery times and the everysec loss window are measured by bench/chaos.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench.chaos_scenarios import (
    FAULTS,
    QUOTA,
    WINDOW,
    ChaosCluster,
    Fault,
    run_durability,
    run_fault,
    run_router_kill,
)
from router.channel.breaker import CIRCUIT_OPEN


@pytest.fixture
async def chaos(tmp_path: Path) -> AsyncIterator[ChaosCluster]:
    cluster = await ChaosCluster.start(tmp_path / "chaos")
    try:
        yield cluster
    finally:
        await cluster.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fault", FAULTS)
async def test_fault_under_load_degrades_only_the_victim_then_recovers(
    chaos: ChaosCluster, fault: Fault
) -> None:
    run = await run_fault(chaos, fault)
    victim = run.victim
    assert run.problems == []  # every check answered: no exception, no 5xx

    # Other nodes' keys: never degraded, never denied, at any moment of the run.
    others = [a for a in run.answers if a.node != victim]
    assert others
    assert [a for a in others if a.degraded or not a.allowed or a.status != 200] == []

    # While the victim is down every answer for its keys is degraded, with the rule's
    # on_failure: the fixed window fails open, the calendar rule fails closed.
    end = run.heal_started_at  # a restarted Redis / node may answer before we see it up
    down = [a for a in run.victim_answers(run.fault_at, end) if a.received < end]
    assert len(down) >= 300
    assert all(a.degraded for a in down), [a for a in down if not a.degraded][:3]
    assert {(a.rule, a.allowed, a.status) for a in down} == {
        (WINDOW, True, 200),
        (QUOTA, False, 429),
    }

    # Once the breaker is open the router stops sending to the victim: every answer is
    # the breaker's, and the router made no request to the node until the fault ended.
    after_open = run.victim_answers(run.open_seen_at, end)
    assert len(after_open) >= 300
    assert [a for a in after_open if CIRCUIT_OPEN not in (a.reason or "")] == []
    assert run.requests_at_heal == run.requests_at_open
    # A crash fails a batch before the breaker opens; a hang is caught by the liveness
    # probe, usually before any batch to it reaches its deadline.
    assert run.failures_at_open >= (0 if fault == "node_stop" else 1)

    status, ready = run.readyz
    assert status == 503 and ready["nodes"][victim] == "down"
    assert {n for n, s in ready["nodes"].items() if s == "up"} == {"n1", "n2", "n3"} - {victim}
    assert run.cluster_state != "up"

    # Normal answers resume and stay.
    resumed = run.victim_answers(run.post_from, float("inf"))
    assert len(resumed) >= 200
    assert [a for a in resumed if a.degraded] == []
    assert run.readyz_after[0] == 200

    print(
        f"{fault}: {len(run.answers)} answers, {len(down)} degraded while {victim} was down "
        f"({len(after_open)} by the open breaker), breaker opened after "
        f"{run.failures_at_open} failures, {len(resumed)} normal answers after recovery"
    )

    # Exact counts. Other nodes: usage == admitted checks. A hung victim applied nothing
    # it did not answer in time (deadlines): exact too. A crashed victim (AOF always):
    # every admitted check survived; at most the degraded answers that did reach the
    # node (not the breaker's) were applied on top, by a batch the crash cut off.
    admitted: Counter[tuple[str, str]] = Counter()
    maybe: Counter[tuple[str, str]] = Counter()
    for a in run.answers:
        assert a.node == run.owners[a.key]
        if not a.degraded:
            admitted[(a.key, a.rule)] += a.allowed
        elif CIRCUIT_OPEN not in (a.reason or ""):
            maybe[(a.key, a.rule)] += 1
    assert sum(admitted.values()) > 0 and len(run.usage) == 2 * len(run.owners)
    for (key, rule), used in run.usage.items():
        if run.owners[key] != victim or fault == "node_stop":
            if used != admitted[(key, rule)]:
                metrics = await chaos.metrics()
                late = {m: v for m, v in metrics.items() if "node_" in m}
                deg = [a for a in run.answers if a.key == key and a.rule == rule and a.degraded]
                reasons = Counter(a.reason for a in deg)
                pytest.fail(
                    f"{key} {rule} on {run.owners[key]}: used {used}, admitted "
                    f"{admitted[(key, rule)]}; {reasons}; {late}"
                )
        else:
            assert admitted[(key, rule)] <= used <= admitted[(key, rule)] + maybe[(key, rule)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("appendfsync", ["always", "everysec"])
async def test_redis_sigkilled_under_writes_keeps_acknowledged_counts_and_amounts(
    tmp_path: Path, appendfsync: str
) -> None:
    cluster = await ChaosCluster.start(tmp_path / "dur", appendfsync=appendfsync)
    try:
        run = await run_durability(cluster)
    finally:
        await cluster.close()
    assert run.problems == []
    # Writers stream until the kill; what survives is a prefix of each key's writes.
    old = 0
    for key, acks in run.acks.items():
        count, amount = run.survived[key]
        assert acks, key
        assert amount == count * run.amount_minor, key  # amounts survive with their counts
        assert count <= len(acks) + 1, key  # at most the write in flight at the kill on top
        if appendfsync == "always":
            assert count >= len(acks), key  # nothing acknowledged is lost
        else:
            # everysec: Redis may postpone its AOF write up to 2 s; anything acknowledged
            # earlier than that (plus scheduling slack) before the kill survives.
            settled = sum(1 for t in acks if t <= run.killed_at - 2.5)
            assert count >= settled, key
            old += settled
    if appendfsync == "everysec":
        assert old > 0  # the bound was really exercised
    print(f"appendfsync {appendfsync}: loss window {run.loss_window_s():.3f} s")


@pytest.mark.timeout(90)
async def test_router_sigkilled_mid_all_or_nothing_batches_leaves_no_partial_batch(
    tmp_path: Path,
) -> None:
    cluster = await ChaosCluster.start(tmp_path / "aon", aon_hold="1s")
    try:
        run = await run_router_kill(cluster)
    finally:
        await cluster.close()
    assert run.problems == []
    assert len(run.answered) >= 150
    outcomes = {b: run.outcome(b) for b in run.batches}
    partial = [b for b, o in outcomes.items() if o == "partial"]
    assert partial == [], [(b, b in run.answered, run.explain(b)) for b in partial]
    for batch, allowed in run.answered.items():
        # Answered before the kill: committed if allowed, rolled back to nothing if not.
        assert outcomes[batch] == ("committed" if allowed else "nothing"), batch
    # The kill cannot be aimed between the two phases; report what it hit.
    in_flight = run.in_flight()
    print(
        f"{len(run.batches)} batches, {len(in_flight)} in flight at the kill "
        f"({dict(Counter(outcomes[b] for b in in_flight))}), {len(run.caught_mid_flight())} "
        f"of them with holds at the kill; all holds given back after {run.given_back_s:.2f} s"
    )


@pytest.mark.timeout(120)
async def test_a_coordinators_endpoint_sigkilled_mid_all_or_nothing_batches_settles_all_or_nothing(
    tmp_path: Path,
) -> None:
    """Each node has two endpoints; the one the router sends n1's checks to, and with them
    the decisions of the batches n1 coordinates, is SIGKILLed mid-flow. Decisions go on
    through n1's other endpoint, on the same records; holds left behind are settled by
    them: no batch is half applied, and every batch answered allowed is committed."""
    cluster = await ChaosCluster.start(tmp_path / "aon", aon_hold="1s", endpoints=2)
    try:
        # A fail-closed rule: a check n1 could not decide denies its batch.
        run = await run_router_kill(cluster, victim=cluster.local.endpoints[0][0], rule=QUOTA)
    finally:
        await cluster.close()
    assert run.problems == []
    assert len(run.answered) >= 150
    outcomes = {b: run.outcome(b) for b in run.batches}
    partial = [b for b, o in outcomes.items() if o == "partial"]
    assert partial == [], [(b, b in run.answered, run.explain(b)) for b in partial]
    admitted = [b for b, allowed in run.answered.items() if allowed]
    assert all(outcomes[b] == "committed" for b in admitted)
    coordinated = [b for b in run.batches if run.owners[run.batches[b][0]] == "n1"]
    print(
        f"{len(run.batches)} batches ({len(coordinated)} coordinated by n1), "
        f"{dict(Counter(outcomes.values()))}; {run.holds_at_kill} holds of "
        f"{len(run.held_at_kill)} batches pending at the kill, all settled "
        f"{run.given_back_s:.2f} s after it"
    )
