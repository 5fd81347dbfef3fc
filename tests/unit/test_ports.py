"""Free ports: picked in the range SHARDLIMIT_FREE_PORTS gives, else below the ephemeral ones."""

from __future__ import annotations

import pytest

from cluster.local.ports import PORT_RANGE_ENV, free_port, free_port_run


def test_ports_are_picked_in_the_range_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "23000-25500")
    picked = {free_port() for _ in range(200)}
    assert all(23_000 <= port < 25_500 for port in picked), sorted(picked)
    assert len(picked) > 100  # spread over the range, not one port
    base = free_port_run(4)
    assert 23_000 <= base < 25_500


def test_a_small_range_is_kept_to_and_one_with_no_free_port_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "23100-23110")
    assert {free_port() for _ in range(100)} <= set(range(23_100, 23_110))
    assert free_port(avoid=set(range(23_100, 23_109))) == 23_109
    with pytest.raises(RuntimeError, match="no free port in SHARDLIMIT_FREE_PORTS=23100-23110"):
        free_port(avoid=set(range(23_100, 23_110)))


@pytest.mark.parametrize("given", ["", "junk", "30000-20000", "80-90000", "20000-"])
def test_a_range_that_is_not_one_is_ignored(monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, given)
    picked = [free_port() for _ in range(50)]
    assert all(10_000 <= port < 65_536 for port in picked)
    assert any(port >= 25_500 or port < 23_000 for port in picked)
