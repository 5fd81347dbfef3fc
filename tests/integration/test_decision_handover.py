"""A coordinator leaving the cluster hands its all-or-nothing decision records over,
fenced against a late decision: no committed batch is ever aborted."""

from __future__ import annotations

import redis

from cluster import wire
from cluster.model.keys import hold_id
from node.store.counter_store import HOLDS_KEY
from tests.conftest import ADMIN, CLUSTER, Cluster, eventually, node_batch
from tests.integration.test_holds import (
    FW,
    MONEY,
    decide_with_holds,
    held_check,
    hold_count,
    holds_of,
)
from tests.system.test_resharding import wait_migration_done


async def test_removing_a_coordinator_keeps_its_commits(cluster: Cluster) -> None:
    view = cluster.router.view
    # Keys that stay where they are (not on n2, which leaves), in batches n2 coordinates.
    keys = [k for k in (f"aon:{i}" for i in range(200)) if view.owner(k) != "n2"][:40]
    batches = [keys[i : i + 2] for i in range(0, len(keys), 2)]
    committed: set[str] = set()
    for number, members in enumerate(batches):
        for key in members:
            rid, batch = f"h{key[4:]}", f"b{number}"
            op = held_check(key, rid, hold_ms=600_000, batch=batch, coordinator="n2")
            [held] = await node_batch(cluster, view.owner(key), [op])
            assert isinstance(held, wire.Checked) and held.allowed is True
        if number % 2 == 0:  # recorded "commit", then the router died; odd: undecided
            holds = [hold_id(f"h{key[4:]}", key) for key in members]
            assert await decide_with_holds(cluster, "n2", f"b{number}", holds) == "commit"
            committed.update(members)
    assert hold_count(cluster) == len(keys)

    async with cluster.http.delete(
        cluster.router_url + "/v1/cluster/nodes/n2", headers={"Authorization": f"Bearer {ADMIN}"}
    ) as resp:
        assert resp.status == 202, await resp.text()
    await wait_migration_done(cluster)
    assert dict(view.topology.successors) == {"n2": "n1"}
    # The fence: n2 records nothing more, neither a late abort nor a late commit.
    for batch, wanted in (("b0", "abort"), ("b1", "commit"), ("b-new", "abort")):
        async with cluster.http.post(
            cluster.node_urls["n2"] + wire.DECISION_PATH,
            json={"batch": batch, "decision": wanted},
            headers={"Authorization": f"Bearer {CLUSTER}"},
        ) as resp:
            body = await resp.json()
            assert resp.status == 409 and body["type"].endswith("/decisions-handed-over"), body
    # Every hold runs out now: the sweepers ask n1, which holds n2's records.
    servers = [redis.Redis(port=server.port, decode_responses=True) for server in cluster.redis]
    assert holds_of(servers[1]) == []  # n2 held none
    for server in (servers[0], servers[2]):
        server.zadd(HOLDS_KEY, dict.fromkeys(holds_of(server), 0), xx=True)

    async def settled() -> bool:
        return hold_count(cluster) == 0

    await eventually(settled, within=30)
    for key in keys:
        _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
        if key in committed:  # committed once: cost 3 of 10, 25.00 of 100.00
            assert body["limits"][0]["remaining"] == 7, key
            assert body["limits"][1]["amount_remaining"] == "75.00", key
        else:  # never decided: given back
            assert body["limits"][0]["remaining"] == 10, key
            assert body["limits"][1]["amount_remaining"] == "100.00", key
    # The committed batches' holds reported to n1: no pending set is left there.
    assert not list(servers[0].scan_iter(match="sl|dp|*"))
    for server in servers:
        server.close()
