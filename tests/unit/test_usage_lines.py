"""`shardlimit usage`'s lines: a wait as a person reads it, whatever its length."""

from __future__ import annotations

import pytest

from cluster.cli.usage import describe, duration

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("ms", "said"),
    [
        (0, "0 s"),
        (29_459, "29.459 s"),
        (59_999, "59.999 s"),
        (60_000, "1m"),
        (51_125_300, "14h 12m 5s"),
        (86_400_000, "1d"),
        (2_124_720_000, "24d 14h 12m"),
    ],
)
def test_a_wait_reads_in_seconds_under_a_minute_and_in_units_above(ms: int, said: str) -> None:
    assert duration(ms) == said


def test_a_monthly_reset_is_not_written_in_scientific_notation() -> None:
    month = {
        "algorithm": "calendar",
        "period": "month",
        "max_amount": "1000000.00",
        "amount_remaining": "999879.50",
        "reset_after_ms": 2_124_720_000,
    }
    assert describe(month) == (
        "calendar (month): amount remaining 999879.50 of 1000000.00, resets in 24d 14h 12m"
    )
