"""Sentinel's +switch-master announcements, read for the node's own master name."""

from __future__ import annotations

import pytest

from node.store.primary_watch import promotion_of, switch_of

pytestmark = pytest.mark.timeout(5)


def test_the_new_primary_of_the_nodes_master_is_read() -> None:
    assert switch_of(b"n1 127.0.0.1 7001 127.0.0.1 7101", "n1") == ("127.0.0.1", 7101)
    assert switch_of("n1 10.0.0.1 6379 redis-n1-1.redis 6379", "n1") == (
        "redis-n1-1.redis",
        6379,
    )


@pytest.mark.parametrize(
    "message",
    [
        b"n2 127.0.0.1 7001 127.0.0.1 7101",  # another shard's
        b"n10 127.0.0.1 7001 127.0.0.1 7101",  # a name that only starts like ours
        b"n1 127.0.0.1 7001 127.0.0.1",  # cut short
        b"n1 127.0.0.1 7001 127.0.0.1 port",
        b"",
    ],
)
def test_anything_else_is_not_a_switch_of_ours(message: bytes) -> None:
    assert switch_of(message, "n1") is None


def test_the_replica_being_promoted_for_the_nodes_master_is_read() -> None:
    message = b"slave 127.0.0.1:7101 127.0.0.1 7101 @ n1 127.0.0.1 7001"
    assert promotion_of(message, "n1") == ("127.0.0.1", 7101)
    assert promotion_of(message, "n2") is None
    assert promotion_of(b"master n1 127.0.0.1 7001 @ n1 127.0.0.1 7001", "n1") is None
    assert promotion_of(b"slave 127.0.0.1:7101 127.0.0.1 port @ n1 127.0.0.1 7001", "n1") is None
