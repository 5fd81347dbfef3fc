"""Repeated identical warnings are rate-limited (cluster/web/logs.py RepeatFilter)."""

from __future__ import annotations

import logging

from cluster.web.logs import RepeatFilter


def _record(message: str, level: int = logging.WARNING, *args: object) -> logging.LogRecord:
    return logging.LogRecord("shardlimit.node", level, __file__, 1, message, args, None)


def test_identical_warnings_pass_once_per_window_then_say_how_many_were_held() -> None:
    now = [100.0]
    repeats = RepeatFilter(window_s=10.0, clock=lambda: now[0])
    passed = []
    for _ in range(40):  # 4 a second for 10 s
        record = _record("hold sweep failed, will retry: %s", logging.WARNING, "refused")
        if repeats.filter(record):
            passed.append(record.getMessage())
        now[0] += 0.25
    assert passed == ["hold sweep failed, will retry: refused"]
    record = _record("hold sweep failed, will retry: %s", logging.WARNING, "refused")
    assert repeats.filter(record)
    assert record.getMessage() == (
        "hold sweep failed, will retry: refused (repeated 39 more times in 10 s)"
    )
    assert vars(record)["repeated"] == 39  # a JSON log line's extra field
    # Another message, another level, and INFO records are never held back.
    assert repeats.filter(_record("hold sweep failed, will retry: %s", logging.ERROR, "x"))
    assert repeats.filter(_record("something else"))
    assert all(repeats.filter(_record("tick", logging.INFO)) for _ in range(5))


def test_a_window_of_zero_passes_everything() -> None:
    repeats = RepeatFilter(window_s=0)
    assert all(repeats.filter(_record("same")) for _ in range(5))
