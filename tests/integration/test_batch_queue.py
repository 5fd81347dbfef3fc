"""A client batch's checks for one node join that node's queue together."""

from __future__ import annotations

from tests.conftest import Cluster

WINDOW = {"algorithm": "fixed_window", "limit": 100, "window": "1m"}


async def test_batch_beyond_a_full_queue_answers_overloaded_and_consumes_nothing(
    cluster: Cluster,
) -> None:
    """A client batch's checks for one node join its queue together: those that fit are
    decided, the rest answered at once with on_failure, reason `overloaded`."""
    for channel in cluster.router.view.clients.values():
        channel.queue_max = 3
    key = "burst:batch"
    checks = [{"key": key, "limits": [WINDOW]} for _ in range(10)]
    status, body = await cluster.post("/v1/check/batch", {"checks": checks})
    assert status == 200
    decided = [b for b in body["results"] if not b["degraded"]]
    overloaded = [b for b in body["results"] if b["degraded"]]
    assert len(decided) == 3 and len(overloaded) == 7
    assert {b["degraded_reason"].split(":")[0] for b in overloaded} == {"overloaded"}
    assert all(not b["degraded"] for b in body["results"][:3])  # in order: the first fit
    owner = cluster.router.view.owner(key)
    assert cluster.router.view.clients[owner].overloaded == 7
    for channel in cluster.router.view.clients.values():
        channel.queue_max = 1000
    status, one = await cluster.check({"key": key, "limits": [WINDOW], "cost": 0})
    assert status == 200 and one["limits"][0]["remaining"] == 100 - 3
