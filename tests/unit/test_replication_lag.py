"""A replica's lag as `GET /v1/cluster` shows it, from the INFO replication lines."""

from __future__ import annotations

from node.health.replication import _connected


def test_a_lag_redis_reports_as_minus_one_second_is_none_behind() -> None:
    info = {
        "slave0": {"ip": "127.0.0.1", "port": 7101, "state": "online", "offset": 5, "lag": -1},
        "slave1": {"ip": "127.0.0.1", "port": 7102, "state": "online", "offset": 5, "lag": 2},
    }
    assert _connected(info) == {
        "127.0.0.1:7101": {"lag_ms": 0, "up": True},
        "127.0.0.1:7102": {"lag_ms": 2000, "up": True},
    }
