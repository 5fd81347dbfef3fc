"""All-or-nothing holds: a batch whose router dies before committing is given back."""

from __future__ import annotations

import time
from typing import Any

import orjson
import redis
from aiohttp import web

from cluster import wire
from cluster.model.keys import hold_id
from node.app import STATE
from node.state import NodeState
from node.store.counter_store import HOLDS_KEY
from tests.conftest import ADMIN, CLUSTER, Cluster, eventually, node_batch
from tests.system.test_resharding import big_cluster, wait_migration_done

__all__ = ["big_cluster"]  # a fixture shared with test_resharding.py

FW = {"algorithm": "fixed_window", "limit": 10, "window": "1h"}
MONEY = {"algorithm": "calendar", "period": "day", "timezone": "UTC", "max_amount": "100.00"}


LIMITS: list[list[Any]] = [
    ["fixed_window", 10, 3_600_000, 0, "", "", None, 2],
    ["calendar", None, 0, 0, "day", "UTC", 10_000, 2],
]


def held_check(key: str, request_id: str, hold_ms: int, **extra: Any) -> wire.Op:
    return wire.Op(
        "check",
        key,
        "~inline",
        LIMITS,
        [0, 2500],
        cost=3,
        request_id=request_id,
        record_ttl_ms=60_000,
        hold_ms=hold_ms,
        **extra,
    )


async def test_uncommitted_hold_is_given_back_by_the_node(cluster: Cluster) -> None:
    key = "hold:1"
    node = cluster.router.view.owner(key)
    # Phase one of an all-or-nothing batch, then the router "dies": no commit.
    [result] = await node_batch(cluster, node, [held_check(key, "aon-1", hold_ms=2000)])
    assert isinstance(result, wire.Checked) and result.allowed is True
    _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
    assert body["limits"][0]["remaining"] == 7 and body["limits"][1]["amount_remaining"] == "75.00"

    async def given_back() -> bool:
        _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
        return bool(body["limits"][0]["remaining"] == 10)

    await eventually(given_back, within=10)
    _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
    assert body["limits"][1]["amount_remaining"] == "100.00"
    index = int(node[1:]) - 1
    direct = redis.Redis(port=cluster.redis[index].port)
    assert direct.zcard(HOLDS_KEY) == 0
    direct.close()
    # A replay of the given-back request answers "denied" and consumes nothing.
    [replay] = await node_batch(cluster, node, [held_check(key, "aon-1", hold_ms=2000)])
    assert isinstance(replay, wire.Checked)
    assert replay.allowed is False and replay.replayed is True


async def test_committed_hold_stays(cluster: Cluster) -> None:
    key = "hold:2"
    node = cluster.router.view.owner(key)
    await node_batch(cluster, node, [held_check(key, "aon-2", hold_ms=5000)])
    commit = wire.Op("commit", key, "~inline", LIMITS, [0, 0], request_id="aon-2")
    [done] = await node_batch(cluster, node, [commit])
    assert done == wire.Committed(True)
    [again] = await node_batch(cluster, node, [commit])
    assert again == wire.Committed(False)  # committing twice is not a second commit
    index = int(node[1:]) - 1
    direct = redis.Redis(port=cluster.redis[index].port)

    assert direct.zcard(HOLDS_KEY) == 0  # the commit removed its sweeper entry
    direct.close()
    _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
    assert body["limits"][0]["remaining"] == 7 and body["limits"][1]["amount_remaining"] == "75.00"


def decision_keys(cluster: Cluster) -> dict[str, int]:
    """Every decision record and pending-holds set of the cluster -> its PTTL."""
    found: dict[str, int] = {}
    for server in cluster.redis:
        direct = redis.Redis(port=server.port, decode_responses=True)
        for name in direct.scan_iter(match="sl|d*", count=1000):
            found[name] = direct.pttl(name)
        direct.close()
    return found


def hold_count(cluster: Cluster) -> int:
    total = 0
    for server in cluster.redis:
        direct = redis.Redis(port=server.port)
        total += direct.zcard(HOLDS_KEY)
        direct.close()
    return total


def run_out_now(cluster: Cluster) -> None:
    """Every hold of the cluster runs out now: the tests hold long, so nothing runs out
    before they say so, however slow the machine."""
    for server in cluster.redis:
        direct = redis.Redis(port=server.port, decode_responses=True)
        if members := holds_of(direct):
            direct.zadd(HOLDS_KEY, dict.fromkeys(members, 0), xx=True)
        direct.close()


async def test_router_batches_commit_their_holds(cluster: Cluster) -> None:
    cluster.router.all_or_nothing.hold_ms = 600_000
    batch = {
        "all_or_nothing": True,
        "checks": [{"key": f"hb:{i}", "limits": [FW], "cost": 2} for i in range(12)],
    }
    status, body = await cluster.post("/v1/check/batch", batch)
    assert status == 200 and body["allowed"] is True
    # The commit record names the batch's 12 holds and has no expiry yet.
    records = decision_keys(cluster)
    [pending] = [name for name in records if name.startswith("sl|dp|")]
    [record] = [name for name in records if name.startswith("sl|d|")]
    assert records[record] == -1 and pending == "sl|dp|" + record[len("sl|d|") :]
    run_out_now(cluster)

    async def all_reported() -> bool:
        return hold_count(cluster) == 0

    # Each hold leaves its node's set when it runs out and its node reported it
    # settled to the coordinator; the last report gives the record its expiry.
    await eventually(all_reported, within=10)
    records = decision_keys(cluster)
    assert list(records) == [record] and 0 < records[record] <= 3_600_000
    _, usage = await cluster.check({"key": "hb:3", "limits": [FW], "cost": 0})
    assert usage["limits"][0]["remaining"] == 8


async def decide(cluster: Cluster, node: str, batch: str, wanted: str) -> str:
    async with cluster.http.post(
        cluster.node_urls[node] + "/node/v1/decision",
        json={"batch": batch, "decision": wanted},
        headers={"Authorization": f"Bearer {CLUSTER}"},
    ) as resp:
        assert resp.status == 200, await resp.text()
        decision: str = (await resp.json())["decision"]
        return decision


def keys_on_distinct_nodes(cluster: Cluster, prefix: str) -> tuple[str, str]:
    first = f"{prefix}:0"
    for i in range(1, 200):
        other = f"{prefix}:{i}"
        if cluster.router.view.owner(other) != cluster.router.view.owner(first):
            return first, other
    raise AssertionError("no two keys on distinct nodes")


async def test_the_first_decision_stands(cluster: Cluster) -> None:
    assert await decide(cluster, "n1", "b-first", "abort") == "abort"
    assert await decide(cluster, "n1", "b-first", "commit") == "abort"
    assert await decide(cluster, "n2", "b-second", "commit") == "commit"
    assert await decide(cluster, "n2", "b-second", "abort") == "commit"


async def test_holds_of_a_committed_batch_are_committed_by_the_sweepers(cluster: Cluster) -> None:
    """The router recorded "commit" on the coordinator, then died before committing."""
    key_a, key_b = keys_on_distinct_nodes(cluster, "dec-c")
    node_a, node_b = (cluster.router.view.owner(k) for k in (key_a, key_b))
    for key, node, rid in ((key_a, node_a, "c-a"), (key_b, node_b, "c-b")):
        op = held_check(key, rid, hold_ms=600_000, batch="b-commit", coordinator=node_a)
        [held] = await node_batch(cluster, node, [op])
        assert isinstance(held, wire.Checked) and held.allowed is True
    assert await decide(cluster, node_a, "b-commit", "commit") == "commit"
    run_out_now(cluster)

    async def settled() -> bool:
        total = 0
        for server in cluster.redis:
            direct = redis.Redis(port=server.port)
            total += direct.zcard(HOLDS_KEY)
            direct.close()
        return total == 0

    await eventually(settled, within=10)
    for key in (key_a, key_b):  # both stay consumed: cost 3 of 10, 25.00 of 100.00
        _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
        assert body["limits"][0]["remaining"] == 7, key
        assert body["limits"][1]["amount_remaining"] == "75.00", key


async def test_holds_of_an_undecided_batch_are_all_given_back(cluster: Cluster) -> None:
    """The router died before deciding: the first sweeper records "abort" for all."""
    key_a, key_b = keys_on_distinct_nodes(cluster, "dec-a")
    node_a, node_b = (cluster.router.view.owner(k) for k in (key_a, key_b))
    for key, node, rid in ((key_a, node_a, "a-a"), (key_b, node_b, "a-b")):
        op = held_check(key, rid, hold_ms=300, batch="b-undecided", coordinator=node_b)
        await node_batch(cluster, node, [op])

    async def given_back() -> bool:
        for key in (key_a, key_b):
            _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
            if body["limits"][0]["remaining"] != 10:
                return False
        return True

    await eventually(given_back, within=10)
    # A router coming back late cannot commit any more.
    assert await decide(cluster, node_b, "b-undecided", "commit") == "abort"


async def test_bad_decisions_are_refused(cluster: Cluster) -> None:
    bad: list[Any] = [{"batch": "b", "decision": "maybe"}, {"batch": "a|b", "decision": "x"}, []]
    for body in bad:
        async with cluster.http.post(
            cluster.node_urls["n1"] + "/node/v1/decision",
            json=body,
            headers={"Authorization": f"Bearer {CLUSTER}"},
        ) as resp:
            assert resp.status == 400, body
    op = held_check("k", "r", hold_ms=300, batch="b")  # no coordinator
    [result] = await node_batch(cluster, "n1", [op])
    assert isinstance(result, wire.Failed) and "coordinator" in result.detail


def holds_of(server: redis.Redis) -> list[str]:
    """The members of a node's holds set (a client that decodes responses)."""
    return [str(m) for m in server.zrange(HOLDS_KEY, 0, -1)]


def node_state(cluster: Cluster, node: str) -> NodeState:
    index = list(cluster.node_urls).index(node)
    return cluster.runners[index].app[STATE]


async def decide_with_holds(
    cluster: Cluster, node: str, batch: str, holds: list[str], wanted: str = "commit"
) -> str:
    """What a router does once every check of its batch was allowed."""
    async with cluster.http.post(
        cluster.node_urls[node] + "/node/v1/decision",
        json={"batch": batch, "decision": wanted, "holds": holds},
        headers={"Authorization": f"Bearer {CLUSTER}"},
    ) as resp:
        assert resp.status == 200, await resp.text()
        decision: str = (await resp.json())["decision"]
        return decision


async def test_a_commit_outlives_its_coordinator_being_away_longer_than_its_ttl(
    cluster: Cluster,
) -> None:
    """The router recorded "commit" and died; the coordinator is then unreachable for
    longer than a decision record's TTL. The other node still learns "commit"."""
    ttl_ms = 1000
    for node in cluster.node_urls:
        node_state(cluster, node).store.decision_ttl_ms = ttl_ms
    key_a, key_b = keys_on_distinct_nodes(cluster, "away")
    node_a, node_b = (cluster.router.view.owner(k) for k in (key_a, key_b))
    for key, node, rid in ((key_a, node_a, "w-a"), (key_b, node_b, "w-b")):
        op = held_check(key, rid, hold_ms=600_000, batch="b-away", coordinator=node_a)
        [held] = await node_batch(cluster, node, [op])
        assert isinstance(held, wire.Checked) and held.allowed is True
    # The coordinator (node_a) goes away for node_b: its listener closes, and node_b's
    # open connections to it with it.
    runner_a = cluster.runners[list(cluster.node_urls).index(node_a)]
    [site] = list(runner_a.sites)
    port_a = int(cluster.node_urls[node_a].rsplit(":", 1)[1])
    holds = [hold_id("w-a", key_a), hold_id("w-b", key_b)]
    assert await decide_with_holds(cluster, node_a, "b-away", holds) == "commit"
    await site.stop()
    state_b = node_state(cluster, node_b)
    if state_b._session is not None:
        await state_b._session.close()
        state_b._session = None
    away_since = time.monotonic()
    direct_b = redis.Redis(port=cluster.redis[int(node_b[1:]) - 1].port)
    run_out_now(cluster)  # while the coordinator is away

    async def away_longer_than_the_ttl() -> bool:
        # Still unsettled on node_b (it cannot ask), for 3 TTLs of the record.
        return bool(
            direct_b.zcard(HOLDS_KEY) == 1 and time.monotonic() - away_since > 3 * ttl_ms / 1000
        )

    await eventually(away_longer_than_the_ttl, within=15)
    records = decision_keys(cluster)
    assert records["sl|d|b-away"] == -1  # no expiry while a hold is unsettled
    await web.TCPSite(runner_a, "127.0.0.1", port_a).start()

    async def settled() -> bool:
        return hold_count(cluster) == 0

    await eventually(settled, within=10)
    direct_b.close()
    for key in (key_a, key_b):  # both committed: cost 3 of 10, 25.00 of 100.00
        _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
        assert body["limits"][0]["remaining"] == 7, key
        assert body["limits"][1]["amount_remaining"] == "75.00", key
    # Every hold reported: the record got its expiry, and the pending set is gone.
    records = decision_keys(cluster)
    assert "sl|dp|b-away" not in records
    assert records.get("sl|d|b-away", 1) > 0


async def test_holds_follow_their_key_when_a_node_is_added(
    big_cluster: tuple[Cluster, str],
) -> None:
    """Held batches, some committed, some never decided; a node joins while they are
    held; every hold is settled exactly once, on the node its key lives on."""
    cluster, n4_url = big_cluster
    view = cluster.router.view
    keys = [f"mv:{i}" for i in range(90)]
    before = {key: view.owner(key) for key in keys}
    batches = [keys[i : i + 3] for i in range(0, len(keys), 3)]
    committed: set[str] = set()
    for number, members in enumerate(batches):
        batch, coordinator = f"mvb{number}", before[members[0]]
        for key in members:
            # A long hold: the test makes them run out once the node has joined.
            op = held_check(
                key, f"h{key[3:]}", hold_ms=600_000, batch=batch, coordinator=coordinator
            )
            [held] = await node_batch(cluster, before[key], [op])
            assert isinstance(held, wire.Checked) and held.allowed is True
        if number % 2 == 0:  # the router decided "commit" and died; odd ones: undecided
            holds = [hold_id(f"h{key[3:]}", key) for key in members]
            assert await decide_with_holds(cluster, coordinator, batch, holds) == "commit"
            committed.update(members)
    assert hold_count(cluster) == 90

    status, started = await cluster.post("/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, ADMIN)
    assert status == 202, started
    await wait_migration_done(cluster)
    after = {key: view.owner(key) for key in keys}
    moved = [key for key in keys if after[key] != before[key]]
    assert moved and all(after[key] == "n4" for key in moved)
    servers = [redis.Redis(port=server.port, decode_responses=True) for server in cluster.redis]
    # The holds of keys that moved went with them (nothing was settled yet).
    assert servers[3].zcard(HOLDS_KEY) == len(moved)
    assert sum(s.zcard(HOLDS_KEY) for s in servers) == 90
    # A lost hand-over acknowledgement: the old owner still has some of those holds
    # too. Its sweeper must settle them where the key lives, where it is a no-op.
    for key in moved[:5]:
        [member] = [m for m in holds_of(servers[3]) if f'|{key}"' in m]
        deadline = servers[3].zscore(HOLDS_KEY, member)
        assert deadline is not None
        servers[int(before[key][1:]) - 1].zadd(HOLDS_KEY, {member: deadline})
    # The router commits some committed batches' holds itself, after the move.
    for key in sorted(committed)[::4]:
        commit = wire.Op("commit", key, "~inline", LIMITS, [0, 0], request_id=f"h{key[3:]}")
        node, result = await view.execute(key, commit)
        assert node == after[key] and result == wire.Committed(True)
    for server in servers:  # every hold runs out now
        server.zadd(HOLDS_KEY, dict.fromkeys(holds_of(server), 0), xx=True)

    async def settled() -> bool:
        return hold_count(cluster) == 0

    await eventually(settled, within=30)
    for key in keys:
        _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
        if key in committed:  # applied once: cost 3 of 10, 25.00 of 100.00
            assert body["limits"][0]["remaining"] == 7, key
            assert body["limits"][1]["amount_remaining"] == "75.00", key
        else:  # given back completely
            assert body["limits"][0]["remaining"] == 10, key
            assert body["limits"][1]["amount_remaining"] == "100.00", key
    # Every committed batch's holds reported themselves: no pending set is left.
    assert not [name for name in decision_keys(cluster) if name.startswith("sl|dp|")]
    for server in servers:
        server.close()


async def test_bad_hold_settles_and_hand_overs_are_refused(cluster: Cluster) -> None:
    url = cluster.node_urls["n1"]
    headers = {"Authorization": f"Bearer {CLUSTER}"}
    good = {"k": ["r|~inline|x|k", "cAAAAAAAA|k"], "a": [1] * 8}
    mixed = {"k": ["r|~inline|x|k", "cAAAAAAAA|other"], "a": [1] * 8}  # two limit keys
    bad: list[tuple[str, Any]] = [
        ("/node/v1/holds/settle", {"holds": [[good, "maybe"]]}),
        ("/node/v1/holds/settle", {"holds": [[mixed, "abort"]]}),
        ("/node/v1/holds/settle", {"holds": "nope"}),
        ("/node/v1/holds/adopt", {"holds": [["{not json", 1]]}),
        ("/node/v1/holds/adopt", {"holds": [[orjson.dumps(good).decode(), "soon"]]}),
        ("/node/v1/decision", {"batch": "b", "settled": "x"}),
        ("/node/v1/decision", {"batch": "b", "decision": "commit", "holds": [1]}),
    ]
    for path, body in bad:
        async with cluster.http.post(url + path, json=body, headers=headers) as resp:
            assert resp.status == 400, (path, body, await resp.text())
    direct = redis.Redis(port=cluster.redis[0].port)
    assert direct.zcard(HOLDS_KEY) == 0
    direct.close()
