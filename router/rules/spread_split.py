"""How a `spread: N` rule's budget is split over its N sub-counters.

Sub-counter i of key K is the ordinary limit key `K#i` (cluster/model/keys.py `sub_key`),
placed by the partitioner on its own. Every number a limit admits against is split
the same way: sub-counter i gets floor(X/N), plus 1 when i < X mod N, so the N
shares add up to exactly X. X is a window's `limit`, a bucket's `rate` and
`burst`/`capacity`, a calendar's `max_count`, a quota's `limit`, and `max_amount`
in integer minor units. Windows, periods, timezones and expiry stay as they are,
and every limit of the rule is split together, so a sub-counter holds the whole
rule (all-or-nothing within it).
"""

from __future__ import annotations

from dataclasses import replace

from cluster.model.errors import Problems
from cluster.model.limits import LimitSpec

MAX_SPREAD = 64


def share(total: int, n: int, index: int) -> int:
    """Sub-counter `index`'s share of `total` (a signed total splits by its size)."""
    if total < 0:
        return -share(-total, n, index)
    return total // n + (1 if index < total % n else 0)


def _split(value: int | None, n: int, index: int) -> int | None:
    return None if value is None else share(value, n, index)


def split_limit(spec: LimitSpec, n: int, index: int) -> LimitSpec:
    return replace(
        spec,
        limit=_split(spec.limit, n, index),
        rate=share(spec.rate, n, index),
        max_amount=_split(spec.max_amount, n, index),
    )


def split_limits(limits: tuple[LimitSpec, ...], n: int) -> tuple[tuple[LimitSpec, ...], ...]:
    """The limits of each sub-counter, in order."""
    return tuple(tuple(split_limit(spec, n, i) for spec in limits) for i in range(n))


def check_spread(
    value: object, limits: tuple[LimitSpec, ...], path: str, problems: Problems
) -> int:
    """A valid `spread` (1..64, no larger than any number it splits; 1 = not spread),
    else 1 after reporting the problem."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SPREAD:
        problems.add(path, f"must be an integer from 1 (not spread) to {MAX_SPREAD}")
        return 1
    if value > 1 and any(spec.algorithm == "concurrency" for spec in limits):
        problems.add(
            path, "a rule with a concurrency limit cannot be spread: its leases live on one key"
        )
        return 1
    for index, spec in enumerate(limits):
        for name, number in (
            ("limit", spec.limit),
            ("rate", spec.rate or None),
            ("max_amount (in minor units)", spec.max_amount),
        ):
            if number is not None and number < value:
                problems.add(
                    path,
                    f"is more than limits[{index}].{name} = {number}: "
                    "every sub-counter needs a share of at least 1",
                )
                return 1
    return value
