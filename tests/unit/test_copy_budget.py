"""node.migration.copy_step.Budget: the pause after each copy call that kept the source
Redis busy, and the default share of its time that the router hands every source."""

from __future__ import annotations

import pytest

from node.migration.copy_step import Budget
from router.config import RouterConfig


@pytest.mark.parametrize("busy_pct", [25, 50, 80, 100])
async def test_a_copy_call_is_followed_by_the_pause_its_share_leaves(busy_pct: int) -> None:
    budget = Budget(busy_pct=busy_pct)
    for _ in range(3):
        await budget.after(0.004, moved=100)
    assert budget.moved == 300
    assert budget.paused_s == pytest.approx(3 * 0.004 * (100 / busy_pct - 1))


async def test_a_rate_holds_the_copy_to_its_keys_per_second() -> None:
    budget = Budget(busy_pct=100, rate=10)
    await budget.after(0.0, moved=1)
    # One key at 10/s ends 100 ms after the start: the pause is what is left of it.
    assert 0.0 < budget.paused_s <= 0.1
    assert budget.moved == 1


def test_the_routers_default_share_is_the_nodes() -> None:
    assert RouterConfig().reshard_busy_pct == Budget().busy_pct == 80
