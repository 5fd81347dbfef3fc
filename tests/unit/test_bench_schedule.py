"""The generators' open-loop schedule (bench.ticker.send_on_schedule): every send once, in
order, each due at start + i / rate and never made before it; a stop ends it early."""

from __future__ import annotations

import time

import pytest

from bench import ticker

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("on_timer", [True, False])
async def test_each_send_once_in_order_at_its_due_time(
    on_timer: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not on_timer:
        monkeypatch.setattr(ticker, "available", lambda: False)
    elif not ticker.available():
        pytest.skip("no timerfd on this platform")
    sent: list[tuple[int, float, float]] = []

    def send(index: int, due: float) -> None:
        sent.append((index, due, time.monotonic()))

    start, ended = await ticker.send_on_schedule(2000.0, 60, send)

    assert [index for index, _, _ in sent] == list(range(60))
    assert all(due == pytest.approx(start + index / 2000.0) for index, due, _ in sent)
    assert all(at >= due for _, due, at in sent)  # never ahead of its time
    assert ended >= sent[-1][2]


async def test_a_stop_ends_the_schedule() -> None:
    sent: list[int] = []
    result = await ticker.send_on_schedule(
        2000.0, 1000, lambda index, _due: sent.append(index), lambda: len(sent) >= 7
    )
    assert sent == list(range(7))
    assert result[0] <= result[1]
