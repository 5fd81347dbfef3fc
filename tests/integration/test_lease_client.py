"""The SDK's leases: `async with client.lease(...)` and the blocking client's `with`
acquire, renew in the background (a watchdog at a third of the TTL), release on exit
(exceptions included), tell the body when the lease is lost, and wait for a slot."""

from __future__ import annotations

import asyncio

import pytest

from cluster.sdk import (
    AsyncClient,
    Client,
    LeaseLost,
    LeaseNotHeld,
    RateLimited,
)
from tests.conftest import Cluster, cluster_with_rules, eventually

RULES = """
rules:
  exports:
    limits:
      - {algorithm: concurrency, limit: 2, lease: 30s}
  short:
    limits:
      - {algorithm: concurrency, limit: 1, lease: 600ms}
  lock:
    limits:
      - {algorithm: concurrency, limit: 1, lease: 30s}
"""
cluster = cluster_with_rules(RULES)


async def held(cluster: Cluster, key: str, rule: str) -> int:
    usage = await cluster.usage(key, rule)
    count: int = usage["limits"][0]["held"]
    return count


async def test_a_lease_is_held_while_the_block_runs_and_released_after(cluster: Cluster) -> None:
    async with AsyncClient(cluster.router_url) as client:
        async with client.lease("exports", key="tenant:1") as lease:
            assert lease.fencing == 1 and lease.ttl_ms == 30_000
            assert await held(cluster, "tenant:1", "exports") == 1
            assert not lease.lost.is_set()
        assert lease.released is not None and lease.released.fencing == 1
        assert await held(cluster, "tenant:1", "exports") == 0
        with pytest.raises(LeaseNotHeld):
            await client.release_lease("tenant:1", "exports", lease.id)


async def test_an_exception_in_the_block_still_releases_the_lease(cluster: Cluster) -> None:
    async with AsyncClient(cluster.router_url) as client:
        with pytest.raises(ZeroDivisionError):
            async with client.lease("exports", key="tenant:2"):
                assert await held(cluster, "tenant:2", "exports") == 1
                _ = 1 / 0
        assert await held(cluster, "tenant:2", "exports") == 0


async def test_the_watchdog_renews_a_lease_past_its_ttl(cluster: Cluster) -> None:
    async with AsyncClient(cluster.router_url) as client:
        async with client.lease("short", key="tenant:3") as lease:

            async def renewed_three_times() -> bool:
                return lease.renewals >= 3

            await eventually(renewed_three_times)
            # 3 renewals a third of 600 ms apart: past the lease's first 600 ms, held still.
            assert await held(cluster, "tenant:3", "short") == 1
            assert not lease.lost.is_set()
        assert await held(cluster, "tenant:3", "short") == 0


async def test_a_lost_lease_sets_lost_and_raises_at_exit(cluster: Cluster) -> None:
    async with AsyncClient(cluster.router_url) as client:
        with pytest.raises(LeaseLost) as caught:
            async with client.lease("short", key="tenant:4") as lease:
                assert lease.grant is not None
                # The node's clock jumps past the lease: the next renewal finds it gone.
                await cluster.set_time((lease.grant.acquired_at_ms or 0) + 60_000)
                await asyncio.wait_for(lease.lost.wait(), 10)
                with pytest.raises(LeaseLost):
                    lease.check()
        assert caught.value.fencing == 1 and "no longer held" in str(caught.value)
        assert await held(cluster, "tenant:4", "short") == 0


async def test_wait_checks_again_until_a_slot_frees(cluster: Cluster) -> None:
    async with AsyncClient(cluster.router_url) as client:
        first = await client.check("tenant:5", "lock")
        assert first.lease is not None and first.lease.fencing == 1
        metrics = cluster.router.metrics

        async def waiting() -> bool:
            return metrics.count("shardlimit_lease_events_total", event="denied") >= 1

        async def second_holder() -> int:
            async with client.lease("lock", key="tenant:5", wait=20) as lease:
                return lease.fencing

        task = asyncio.create_task(second_holder())
        await eventually(waiting)
        await client.release_lease("tenant:5", "lock", first.lease.id)
        assert await asyncio.wait_for(task, 20) == 2
        with pytest.raises(RateLimited) as denied:
            async with client.lease("lock", key="tenant:6"), client.lease("lock", key="tenant:6"):
                pass
        assert denied.value.retry_after_ms is not None
        assert await held(cluster, "tenant:6", "lock") == 0


def _blocking(url: str) -> tuple[int, int, int]:
    with Client(url) as client:
        with client.lease("exports", key="tenant:7") as lease:
            during = client.usage("tenant:7", "exports").limits[0].held
            fencing = lease.fencing
        after = client.usage("tenant:7", "exports").limits[0].held
    return fencing, during or 0, after or 0


async def test_the_blocking_client_holds_a_lease_with_a_with_block(cluster: Cluster) -> None:
    assert await asyncio.to_thread(_blocking, cluster.router_url) == (1, 1, 0)


class Gate:
    """A TCP relay to the router that can stop passing requests on (a router that hangs:
    `held` counts the requests it swallowed, which then wait for the client's timeout),
    drop every connection it holds (`cut`) and close the next `refuse` ones as soon as
    they open (a router or node briefly gone)."""

    def __init__(self, router_url: str) -> None:
        self.target = router_url.rsplit(":", 1)[1]
        self.frozen = False
        self.held = 0
        self.refuse = 0
        self.refused = 0
        self.server: asyncio.Server | None = None
        self.url = ""
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def cut(self) -> None:
        for writer in self.writers:
            writer.close()
        self.writers.clear()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse > 0:
            self.refuse -= 1
            self.refused += 1
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(self.target))
        self.writers += [writer, up_writer]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, out: bool) -> None:
            while data := await src.read(65536):
                if out and self.frozen:
                    self.held += 1
                    continue
                dst.write(data)
                await dst.drain()

        try:
            await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))
        except ConnectionError:
            pass
        finally:
            writer.close()
            up_writer.close()

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def _blocking_hang(url: str, gate: Gate) -> tuple[bool, str | None, int]:
    """The blocking client's lease through `gate`, frozen once held (a timeout of 5 s
    against a lease of 600 ms): whether `lost` was set, why, and the requests held."""
    figures: tuple[bool, str | None, int] | None = None
    client = Client(url, timeout=5)
    with client, pytest.raises(LeaseLost), client.lease("short", key="tenant:9") as lease:
        gate.frozen = True
        figures = (lease.lost.wait(10), lease.lost_why, gate.held)
    assert figures is not None
    return figures


async def test_a_router_that_hangs_loses_the_lease_when_it_runs_out_not_at_the_timeout(
    cluster: Cluster,
) -> None:
    """A 600 ms lease, renewals that hang (the client's timeout is 30 s): `lost` is set while
    a renewal still waits, not once its call gives up."""
    gate = Gate(cluster.router_url)
    await gate.start()
    try:
        async with AsyncClient(gate.url, timeout=30) as client:
            with pytest.raises(LeaseLost) as caught:
                async with client.lease("short", key="tenant:8") as lease:
                    gate.frozen = True
                    await asyncio.wait_for(lease.lost.wait(), 10)
                    assert gate.held >= 1  # the renewal sent is still unanswered
                    gate.frozen = False
            assert "no renewal got through before it ran out" in str(caught.value)
        gate.frozen = False
        lost, why, held_then = await asyncio.to_thread(_blocking_hang, gate.url, gate)
        assert lost and why == "no renewal got through before it ran out" and held_then >= 1
    finally:
        gate.frozen = False
        await gate.close()


async def test_the_exit_sends_its_release_again_until_it_gets_through(cluster: Cluster) -> None:
    """The router unreachable for the exit's first releases (a node restarting, a
    failover): the exit keeps sending it, and the slot is free once the block is left."""
    door = Gate(cluster.router_url)
    await door.start()
    try:
        async with AsyncClient(door.url) as client:
            async with client.lease("exports", key="tenant:10") as lease:
                door.cut()
                door.refuse = 3
            assert door.refused == 3
            assert lease.released is not None and lease.unreleased_why is None
        assert await held(cluster, "tenant:10", "exports") == 0

        def blocking() -> tuple[object, str | None, int]:
            with Client(door.url) as client, client.lease("exports", key="tenant:11") as lease:
                door.cut()
                door.refuse = 3
            return lease.released, lease.unreleased_why, door.refused

        released, why, refused = await asyncio.to_thread(blocking)
        assert released is not None and why is None and refused == 6
        assert await held(cluster, "tenant:11", "exports") == 0
    finally:
        await door.close()


async def test_an_exit_that_cannot_release_gives_up_when_the_lease_runs_out(
    cluster: Cluster,
) -> None:
    """Never reachable again: the exit stops sending at the lease's end (600 ms), says
    why on `unreleased_why`, and raises nothing; the slot frees by itself."""
    door = Gate(cluster.router_url)
    await door.start()
    try:
        async with AsyncClient(door.url) as client:
            async with client.lease("short", key="tenant:12") as lease:
                door.cut()
                door.refuse = 1_000_000
            assert lease.released is None and lease.unreleased_why is not None
            assert door.refused >= 2  # sent again before giving up
    finally:
        await door.close()
    await eventually(lambda: _free(cluster, "tenant:12", "short"), within=10)


async def _free(cluster: Cluster, key: str, rule: str) -> bool:
    return await held(cluster, key, rule) == 0
