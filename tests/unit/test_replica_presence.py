"""Which replicas INFO replication shows as able to acknowledge a WAIT now, and which
as still taking the dataset."""

from __future__ import annotations

import pytest

from node.store.replica_presence import live_replicas, needed_of, syncing_replicas

pytestmark = pytest.mark.timeout(5)


INFO = {
    "role": "master",
    "connected_slaves": 5,
    "slave0": {"ip": "127.0.0.1", "port": 7101, "state": "online", "offset": 9, "lag": 0},
    "slave1": {"ip": "127.0.0.1", "port": 7102, "state": "online", "offset": 9, "lag": 1},
    "slave2": {"ip": "127.0.0.1", "port": 7103, "state": "online", "offset": 3, "lag": 7},
    "slave3": {"ip": "127.0.0.1", "port": 7104, "state": "wait_bgsave", "lag": 0},
    "slave4": {"ip": "127.0.0.1", "port": 7105, "state": "send_bulk", "lag": 0},
    "master_repl_offset": 9,
}


def test_online_replicas_that_acknowledged_within_a_second_are_live() -> None:
    assert live_replicas(INFO) == 2


def test_replicas_not_yet_online_are_taking_the_dataset() -> None:
    assert syncing_replicas(INFO) == {"127.0.0.1:7104", "127.0.0.1:7105"}


def test_no_replica_listed_is_none_live() -> None:
    assert live_replicas({"role": "master", "connected_slaves": 0}) == 0
    assert syncing_replicas({"role": "master", "connected_slaves": 0}) == set()


def test_a_wait_asks_for_the_replicas_the_sentinels_wait_for_less_those_syncing() -> None:
    known = {f"127.0.0.1:{port}": True for port in (7101, 7104, 7105)} | {
        "127.0.0.1:7106": False  # not promotable, or its link was down when last read
    }
    assert needed_of(known, INFO) == 1  # 7104 and 7105 take the dataset
    assert needed_of(known, {}) == 3  # the primary did not answer: the Sentinels' count
    assert needed_of({"127.0.0.1:7104": True}, INFO) == 1  # at least one
