"""Tests for cluster.model.partition: hash tags, CRC16 slots vs real Redis, ring and slot layouts."""

from __future__ import annotations

import json
import os
import random
import socket
import string
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cluster.local.redis_proc import redis_server_binary
from cluster.model.nodes import NodeSpec
from cluster.model.partition import (
    HASH_SLOTS,
    Move,
    Partitioner,
    RingPartitioner,
    SlotPartitioner,
    key_slot,
    new_partitioner,
    partitioner_from_dict,
    routing_part,
)
from cluster.model.topology import Topology


def _nodes(*ids: str, weights: dict[str, int] | None = None) -> list[NodeSpec]:
    weights = weights or {}
    return [
        NodeSpec(id=i, url=f"http://127.0.0.1:{7001 + n}", weight=weights.get(i, 1))
        for n, i in enumerate(ids)
    ]


def _keys(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [
        f"user:{rng.getrandbits(48):x}:{rng.choice(['login', 'pay', 'ocr'])}" for _ in range(count)
    ]


def _owners(part: Partitioner, keys: list[str]) -> list[str]:
    return [part.owner(k) for k in keys]


def _roundtrip(part: Partitioner) -> Partitioner:
    return partitioner_from_dict(json.loads(json.dumps(part.to_dict())))


# --- hash tags and CRC16 -------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("{user:7}:login", "user:7"),
        ("{user:7}:pay", "user:7"),
        ("{}x", "{}x"),
        ("x{}y", "x{}y"),
        ("a{b}{c}", "b"),
        ("{{a}}", "{a"),
        ("no tag", "no tag"),
        ("open{only", "open{only"),
        ("close}only", "close}only"),
        ("}{x}", "x"),
        ("", ""),
    ],
)
def test_routing_part(key: str, expected: str) -> None:
    assert routing_part(key) == expected


def test_hash_tag_shares_slot_and_ring_owner() -> None:
    ring = RingPartitioner(_nodes("a", "b", "c", "d", "e"))
    slots = SlotPartitioner(_nodes("a", "b", "c", "d", "e"))
    for i in range(200):
        login, pay = f"{{user:{i}}}:login", f"{{user:{i}}}:pay"
        assert key_slot(login) == key_slot(pay) == key_slot(f"user:{i}")
        assert ring.owner(login) == ring.owner(pay)
        assert slots.owner(login) == slots.owner(pay)
    assert key_slot("{{a}}") == key_slot("{a") != key_slot("a")
    assert key_slot("a{b}{c}") == key_slot("b")


def test_known_redis_slots() -> None:
    assert key_slot("foo") == 12182
    assert key_slot("bar") == 5061
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    assert key_slot("") == 0
    assert key_slot("123456789") == 0x31C3 & (HASH_SLOTS - 1)  # CRC16/XMODEM check value


def _free_cluster_port() -> int:
    """Return a free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster-mode redis-server")


@pytest.fixture
def cluster_redis(tmp_path: Path) -> Iterator[redis.Redis]:
    """A real redis-server in cluster mode on a free port (keyslot math needs no slots)."""
    binary = redis_server_binary()
    for attempt in range(3):
        workdir = tmp_path / f"redis-{attempt}"
        workdir.mkdir()
        port = _free_cluster_port()
        proc = subprocess.Popen(
            [
                binary,
                "--cluster-enabled",
                "yes",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--cluster-config-file",
                str(workdir / "nodes.conf"),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)
        try:
            deadline = time.monotonic() + 10
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    if client.ping():
                        break
                except redis.RedisError:
                    time.sleep(0.02)  # polling interval, not a wait for a fixed time
            else:
                continue  # exited (likely a port race) or never answered: next attempt
            yield client
            return
        finally:
            client.close()
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    pytest.fail("redis-server in cluster mode did not start")


def _random_key(rng: random.Random) -> str:
    printable = string.printable
    unicode_pool = "äöüßéè€漢字キー🙂🚀ßΩжщ\u00a0\u200b"

    def chunk(max_len: int) -> str:
        pool = printable if rng.random() < 0.7 else printable + unicode_pool
        return "".join(rng.choice(pool) for _ in range(rng.randint(0, max_len)))

    if rng.random() >= 0.4:
        return chunk(40)
    shape = rng.randrange(6)
    tag = chunk(12)
    if shape == 0:
        return f"{{{tag}}}{chunk(20)}"  # tag first
    if shape == 1:
        return f"{chunk(20)}{{{tag}}}"  # tag last
    if shape == 2:
        return f"{chunk(10)}{{{tag}}}{chunk(10)}"  # tag in the middle
    if shape == 3:
        return f"{chunk(10)}{{}}{chunk(5)}{{{tag}}}"  # empty tag before a real one
    if shape == 4:
        return f"{chunk(5)}{{{{{tag}}}}}{{{chunk(5)}}}"  # nested and multiple braces
    return f"{chunk(8)}{{{tag}"  # unclosed


@pytest.mark.integration  # a real redis-server in cluster mode
@pytest.mark.timeout(60)
def test_key_slot_matches_real_redis(cluster_redis: redis.Redis) -> None:
    rng = random.Random(20240517)
    keys = [_random_key(rng) for _ in range(12_000)]
    keys += ["", "{", "}", "{}", "{}{}", "{{}}", "{a}", "a{b}{c}", "{{a}}", "foo", "bar"]
    assert sum("{" in k for k in keys) > 4000
    mismatches: list[tuple[str, int, int]] = []
    for start in range(0, len(keys), 1000):
        chunk = keys[start : start + 1000]
        pipe = cluster_redis.pipeline(transaction=False)
        for key in chunk:
            pipe.execute_command("CLUSTER", "KEYSLOT", key)  # type: ignore[no-untyped-call]
        for key, answer in zip(chunk, pipe.execute(), strict=True):
            if key_slot(key) != int(answer):
                mismatches.append((key, key_slot(key), int(answer)))
    assert mismatches == []


# --- ring ------------------------------------------------------------------------------


def test_ring_weights_honoured() -> None:
    ring = RingPartitioner(_nodes("a", "b", "c", weights={"c": 2}), vnodes=160)
    counts = Counter(_owners(ring, _keys(100_000)))
    # 160 points per unit of weight leave each node's own share about +-10% off its
    # ideal, so compare against the weight-1 nodes' mean share rather than each one.
    ratio = counts["c"] / ((counts["a"] + counts["b"]) / 2)
    assert 2 * 0.85 <= ratio <= 2 * 1.15, (counts, ratio)
    assert Counter(owner for _, owner in ring.points()) == {"a": 160, "b": 160, "c": 320}
    shares = ring.shares()
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    for node_id, share in shares.items():
        assert abs(share - counts[node_id] / 100_000) < 0.01


def test_ring_vnodes_configurable() -> None:
    nodes = _nodes("a", "b", weights={"b": 3})
    ring = RingPartitioner(nodes, vnodes=7)
    points = ring.points()
    assert Counter(owner for _, owner in points) == {"a": 7, "b": 21}
    assert [p for p, _ in points] == sorted(p for p, _ in points)
    for bad in (0, 10_001):
        with pytest.raises(ValueError, match="vnodes"):
            RingPartitioner(nodes, vnodes=bad)


def test_ring_add_node_plan_matches_sampled_moves() -> None:
    old = RingPartitioner(_nodes("n1", "n2", "n3"))
    new = old.resized(_nodes("n1", "n2", "n3", "n4"))
    assert isinstance(new, RingPartitioner)
    assert new.vnodes == old.vnodes
    keys = _keys(100_000, seed=2)
    before, after = _owners(old, keys), _owners(new, keys)
    changed = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    sampled = len(changed) / len(keys)

    moves = old.plan(new)
    planned = sum(m.fraction for m in moves)
    assert abs(planned - sampled) < 0.01
    assert 0.15 <= planned <= 0.35
    assert all(m.target == "n4" and m.source != m.target for m in moves)
    assert all(m.slots == () for m in moves)
    assert moves == sorted(moves, key=lambda m: (m.source, m.target))
    assert {(b, a) for b, a in changed} <= {(m.source, m.target) for m in moves}
    assert abs(new.shares()["n4"] - planned) < 1e-9
    assert old.plan(old) == []

    back = _roundtrip(new)
    assert isinstance(back, RingPartitioner)
    assert back.to_dict() == new.to_dict()
    sample = keys[:10_000]
    assert _owners(back, sample) == after[:10_000]


def test_ring_remove_node_moves_only_its_keys() -> None:
    old = RingPartitioner(_nodes("n1", "n2", "n3", "n4"))
    new = old.resized(_nodes("n1", "n2", "n4"))
    moves = old.plan(new)
    assert {m.source for m in moves} == {"n3"}
    assert abs(sum(m.fraction for m in moves) - old.shares()["n3"]) < 1e-9


def test_ring_locate_agrees_with_owner() -> None:
    ring = RingPartitioner(_nodes("a", "b", "c"))
    for key in [*_keys(2000, seed=3), "{t}x", "{t}y"]:
        where = ring.locate(key)
        assert where["node"] == ring.owner(key)
        point = where["point"]
        assert isinstance(point, int) and 0 <= point < 2**64
    assert ring.locate("{t}x") == ring.locate("{t}y")


def test_ring_deterministic() -> None:
    keys = _keys(10_000, seed=4)
    first = RingPartitioner(_nodes("a", "b", "c", weights={"b": 2}), vnodes=100)
    second = RingPartitioner(_nodes("a", "b", "c", weights={"b": 2}), vnodes=100)
    assert _owners(first, keys) == _owners(second, keys)
    assert first.points() == second.points()
    # Fixed expectation guards against any process-dependent hashing sneaking in.
    script = (
        "from cluster.model.nodes import NodeSpec; from cluster.model.partition import RingPartitioner;"
        "r = RingPartitioner([NodeSpec('a', 'u'), NodeSpec('b', 'u', 2), NodeSpec('c', 'u')],"
        " vnodes=100); print(','.join(r.owner(f'k{i}') for i in range(200)))"
    )
    other = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        cwd=Path(__file__).resolve().parents[2],
    )
    assert other.stdout.strip().split(",") == [first.owner(f"k{i}") for i in range(200)]


# --- slots -----------------------------------------------------------------------------


def _slot_counts(part: SlotPartitioner) -> Counter[str]:
    return Counter(part.table)


def test_slots_balanced_table() -> None:
    part = SlotPartitioner(_nodes("a", "b", "c"))
    assert [_slot_counts(part)[i] for i in "abc"] == [5462, 5461, 5461]
    assert part.to_dict()["slots"] == [[0, 5461, "a"], [5462, 10922, "b"], [10923, 16383, "c"]]
    assert part.shares() == {"a": 5462 / 16384, "b": 5461 / 16384, "c": 5461 / 16384}
    weighted = SlotPartitioner(_nodes("a", "b", "c", weights={"c": 2}))
    assert [_slot_counts(weighted)[i] for i in "abc"] == [4096, 4096, 8192]
    assert weighted.locate("foo") == {"node": weighted.table[12182], "slot": 12182}
    assert weighted.owner("foo") == weighted.table[12182]


def test_slots_add_node_moves_exactly_planned_slots() -> None:
    old = SlotPartitioner(_nodes("a", "b", "c"))
    new = old.resized(_nodes("a", "b", "c", "d"))
    assert isinstance(new, SlotPartitioner)
    moves = old.plan(new)
    planned: dict[int, Move] = {slot: m for m in moves for slot in m.slots}
    old_table, new_table = old.table, new.table
    for slot in range(HASH_SLOTS):
        if slot in planned:
            assert old_table[slot] == planned[slot].source
            assert new_table[slot] == planned[slot].target
        else:
            assert old_table[slot] == new_table[slot]
    assert all(m.target == "d" for m in moves)
    assert all(list(m.slots) == sorted(m.slots) for m in moves)
    assert all(m.fraction == len(m.slots) / HASH_SLOTS for m in moves)
    assert abs(_slot_counts(new)["d"] - 4096) <= 1
    assert len(planned) == _slot_counts(new)["d"]  # minimal: only the new node's share moved
    for node_id in "abc":
        assert set(new.slots_of(node_id)) <= set(old.slots_of(node_id))
        assert abs(_slot_counts(new)[node_id] - 4096) <= 1


def test_slots_remove_node_moves_only_its_slots() -> None:
    old = SlotPartitioner(_nodes("a", "b", "c", "d"))
    new = old.resized(_nodes("a", "b", "d"))
    moves = old.plan(new)
    assert {m.source for m in moves} == {"c"}
    assert sorted(s for m in moves for s in m.slots) == old.slots_of("c")
    assert sorted(_slot_counts(new).values()) == [5461, 5461, 5462]


def test_slots_weight_change_is_minimal() -> None:
    old = SlotPartitioner(_nodes("a", "b", "c", "d"))
    new = old.resized(_nodes("a", "b", "c", "d", weights={"d": 2}))
    counts = _slot_counts(new)
    assert abs(counts["d"] - 6553) <= 1
    moves = old.plan(new)
    assert {m.target for m in moves} == {"d"}
    assert sum(len(m.slots) for m in moves) == counts["d"] - 4096
    assert old.resized(old.nodes).plan(old) == []


def test_slots_roundtrip() -> None:
    part = SlotPartitioner(_nodes("a", "b", "c")).resized(_nodes("a", "c", "d", "e"))
    data = part.to_dict()
    assert data["kind"] == "slots"
    back = _roundtrip(part)
    assert isinstance(back, SlotPartitioner)
    assert back.table == part.table
    assert back.nodes == part.nodes
    assert back.plan(part) == []


def _slot_data(ranges: list[list[object]]) -> dict[str, object]:
    return {"kind": "slots", "nodes": [n.to_dict() for n in _nodes("a", "b")], "slots": ranges}


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ([[0, 8000, "a"], [8002, 16383, "b"]], "unassigned"),
        ([[0, 8000, "a"], [8000, 16383, "b"]], "more than once"),
        ([[0, 8191, "a"], [8192, 16383, "zz"]], "unknown node id"),
        ([[0, 8191, "a"], [8192, 16384, "b"]], "start <= end"),
        ([[0, 8191, "a"], [8192, "x", "b"]], "integers"),
        ([[0, 8191, "a"], [8192, 16383]], r"\[start, end, node_id\]"),
    ],
)
def test_slots_from_dict_rejects_bad_tables(ranges: list[list[object]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        partitioner_from_dict(_slot_data(ranges))


# --- construction and validation -------------------------------------------------------


def test_new_partitioner_and_validation() -> None:
    nodes = _nodes("a", "b")
    assert isinstance(new_partitioner("ring", nodes, vnodes=10), RingPartitioner)
    assert isinstance(new_partitioner("slots", nodes), SlotPartitioner)
    with pytest.raises(ValueError, match="kind"):
        new_partitioner("modulo", nodes)
    with pytest.raises(ValueError, match="at least one node"):
        new_partitioner("slots", [])
    with pytest.raises(ValueError, match="duplicate"):
        new_partitioner("ring", [*nodes, NodeSpec("a", "http://other")])
    with pytest.raises(ValueError, match="weight"):
        new_partitioner("slots", [NodeSpec("a", "u", 0)])
    with pytest.raises(ValueError, match="kind"):
        partitioner_from_dict({"kind": "nope", "nodes": [n.to_dict() for n in nodes]})
    with pytest.raises(ValueError, match="nodes"):
        partitioner_from_dict({"kind": "ring", "nodes": []})
    with pytest.raises(ValueError, match="vnodes"):
        partitioner_from_dict({"kind": "ring", "nodes": [n.to_dict() for n in nodes], "vnodes": 0})
    with pytest.raises(ValueError, match="cannot plan"):
        new_partitioner("ring", nodes).plan(new_partitioner("slots", nodes))


@pytest.mark.parametrize("kind", ["ring", "slots"])
def test_a_layout_id_names_the_placement_not_the_epoch(kind: str) -> None:
    """Frames carry a topology's layout_id (cluster/wire/channel.py Request): it must survive the
    topology's trip as JSON to a node, ignore the epoch and the migration, and differ
    for any other placement."""
    nodes = [NodeSpec(f"n{i}", f"http://127.0.0.1:{9000 + i}") for i in range(1, 5)]
    three = new_partitioner(kind, nodes[:3])
    four = three.resized(nodes)
    first = Topology(3, three, cluster_id="c1")
    layout = first.layout_id
    assert 0 < layout < 2**63
    again = Topology.from_dict(json.loads(json.dumps(first.to_dict())))
    assert again.layout_id == layout
    assert Topology(9, new_partitioner(kind, nodes[:3]), {"id": "m"}).layout_id == layout
    assert Topology(4, four, {"id": "m", "from": three.to_dict()}).layout_id != layout
    assert Topology(3, new_partitioner(kind, nodes[1:])).layout_id != layout


def test_a_topology_carries_the_last_migration_as_json_and_refuses_a_bad_one() -> None:
    nodes = [NodeSpec(f"n{i}", f"http://127.0.0.1:{9000 + i}") for i in range(1, 4)]
    summary = {"id": "m1", "phase": "done", "epoch": 4, "keys_moved": 42, "seconds": 0.5}
    kept = Topology(4, new_partitioner("ring", nodes), last_migration=summary)
    again = Topology.from_dict(json.loads(json.dumps(kept.to_dict())))
    assert again.last_migration == summary and again.to_dict() == kept.to_dict()
    # A topology written before the field existed has none.
    older = {k: v for k, v in kept.to_dict().items() if k != "last_migration"}
    assert Topology.from_dict(older).last_migration is None
    with pytest.raises(ValueError, match="last_migration"):
        Topology.from_dict({**kept.to_dict(), "last_migration": "m1"})
