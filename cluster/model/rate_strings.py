"""`limits`-style rate strings ("10/second", "1000 per day", "500/7 days") and the limit
documents they stand for."""

from __future__ import annotations

import re
from typing import Any

from cluster.model.errors import Problems
from cluster.model.limit_values import NUMBER, SPACES

# `limits`-style rate strings: "10/second", "1000 per day", "500/7 days"; several
# separated by ";" or ","; an optional "sliding_window:" (or "fixed_window:") first.
_RATE = re.compile(
    rf"{SPACES}{NUMBER}{SPACES}(?:/|per[ \t\n\r\f\v]){SPACES}(?:{NUMBER})?{SPACES}"
    r"(second|minute|hour|day|month|year)s?"
    rf"{SPACES}"
)
_RATE_ALGORITHM = re.compile(rf"{SPACES}(fixed_window|sliding_window){SPACES}:")
# As in the `limits` library: a month is 30 days and a year 365 (calendar months and
# years that follow the calendar are the `calendar` algorithm's).
RATE_UNIT_MS = {
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "month": 30 * 86_400_000,
    "year": 365 * 86_400_000,
}


def expand_rate_string(text: str, path: str, problems: Problems) -> list[dict[str, Any]]:
    """A rate string -> limit documents (fixed_window unless it starts with
    "sliding_window:"); a problem at `path` for each part that is not a rate."""
    algorithm = "fixed_window"
    named = _RATE_ALGORITHM.match(text)
    if named:
        algorithm, text = named.group(1), text[named.end() :]
    out: list[dict[str, Any]] = []
    for part in re.split(r"[;,]", text.lower()):
        match = _RATE.fullmatch(part)
        if match is None:
            problems.add(path, f"'{part.strip()}' is not a rate like '10/second' or '500/7 days'")
            continue
        count, multiple, unit = int(match.group(1)), int(match.group(2) or 1), match.group(3)
        window_ms = multiple * RATE_UNIT_MS[unit]
        out.append({"algorithm": algorithm, "limit": count, "window": f"{window_ms}ms"})
    return out
