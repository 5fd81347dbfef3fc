"""Which replicas INFO replication shows as able to acknowledge a WAIT now."""

from __future__ import annotations

import pytest

from node.store.replica_presence import live_replicas

pytestmark = pytest.mark.timeout(5)


def test_online_replicas_that_acknowledged_within_a_second_are_live() -> None:
    info = {
        "role": "master",
        "connected_slaves": 4,
        "slave0": {"ip": "127.0.0.1", "port": 7101, "state": "online", "offset": 9, "lag": 0},
        "slave1": {"ip": "127.0.0.1", "port": 7102, "state": "online", "offset": 9, "lag": 1},
        "slave2": {"ip": "127.0.0.1", "port": 7103, "state": "online", "offset": 3, "lag": 7},
        "slave3": {"ip": "127.0.0.1", "port": 7104, "state": "wait_bgsave", "lag": 0},
        "master_repl_offset": 9,
    }
    assert live_replicas(info) == 2


def test_no_replica_listed_is_none_live() -> None:
    assert live_replicas({"role": "master", "connected_slaves": 0}) == 0
