"""A node whose Redis is a Sentinel-watched primary with a replica (`redis+sentinel://`)
follows a failover with no operator step: its keys answer degraded, consuming nothing,
while the primary is down, then normally from the promoted replica, with every count
acknowledged under `durability: replica`, money amounts included. Such a check is
acknowledged only once the replica holds it: while no replica answers, it is answered
degraded and consumes nothing, and `durability: primary` rules keep being served."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import aiohttp
import pytest

from cluster.local.cluster import scratch_cluster
from cluster.local.sentinel_proc import sentinel_master, wait_for
from tests.conftest import eventually
from tests.system.replication import Served, caught_up, check, key_on, replication

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]
ADMIN = "failover-admin-token"
STOCK = [{"algorithm": "quota", "limit": 1000}]  # no window; durability replica by default
RATE = [{"algorithm": "fixed_window", "limit": 1000, "window": "3660d"}]  # durability primary
MONEY = [{"algorithm": "calendar", "period": "day", "max_amount": "1000.00"}]  # replica


async def pay(
    http: aiohttp.ClientSession, router: str, key: str, amount: float = 12.34
) -> dict[str, Any]:
    body = {"key": key, "limits": MONEY, "amount": amount, "cost": 1 if amount else 0}
    async with http.post(router + "/v1/check", json=body) as resp:
        answer: dict[str, Any] = await resp.json()
        return answer


async def test_a_killed_primary_is_followed_to_its_promoted_replica(tmp_path: Any) -> None:
    # Two replicas: after the failover the promoted one still has a replica to WAIT for.
    with scratch_cluster(2, admin_token=ADMIN, data_dir=tmp_path / "c", replicas=2) as local:
        assert local.replication is not None
        async with aiohttp.ClientSession() as http:
            key = await key_on(http, local.router_url, "n1", "sku")
            merchant = await key_on(http, local.router_url, "n1", "merchant")
            for _ in range(5):
                answer = await check(http, local.router_url, key, STOCK)
                assert answer["allowed"] is True and not answer.get("degraded"), answer
                answer = await pay(http, local.router_url, merchant)
                assert answer["allowed"] is True and not answer.get("degraded"), answer
            # Quotas and calendars are `durability: replica` by default: each of these was
            # acknowledged only once a replica held it, so nothing here waits for one.
            primary = local.redis[0]
            primary.kill()
            killed = time.monotonic()
            admitted_after = 0
            degraded = 0

            async def served() -> bool:
                nonlocal admitted_after, degraded
                answer = await check(http, local.router_url, key, STOCK)
                if answer.get("degraded"):
                    degraded += 1
                    return False
                assert answer["allowed"] is True, answer
                admitted_after += 1
                return True

            await eventually(served, within=30)
            print(f"first normal answer {time.monotonic() - killed:.2f} s after the kill")
            paid = 0

            async def paid_once() -> bool:
                nonlocal paid
                answer = await pay(http, local.router_url, merchant)
                if answer.get("degraded"):
                    return False
                assert answer["allowed"] is True, answer
                paid += 1
                return True

            await eventually(paid_once, within=30)
            answer = await pay(http, local.router_url, merchant, 0)
            spent = Decimal("12.34") * (5 + paid)
            assert answer["limits"][0]["amount_remaining"] == str(Decimal("1000.00") - spent)
            sentinels = local.replication.sentinels
            replicas = local.replication.shards["n1"]
            addresses = [(r.host, r.port) for r in replicas]
            wait_for(lambda: sentinel_master(sentinels, "n1") in addresses, 10, "the promotion")
            promoted = sentinel_master(sentinels, "n1")
            assert promoted is not None
            answer = await check(http, local.router_url, key, STOCK)
            assert answer["limits"][0]["remaining"] == 1000 - 5 - admitted_after - 1
            assert degraded >= 1  # the primary's death was seen, and consumed nothing

            async def shown() -> dict[str, Any]:
                async with http.get(local.router_url + "/v1/cluster") as resp:
                    nodes = {n["id"]: n for n in (await resp.json())["nodes"]}
                    redis: dict[str, Any] = nodes["n1"]["redis"]
                    return redis

            redis = await shown()
            assert redis["replicated"] is True and redis["role"] == "master", redis
            assert redis["primary"] == f"{promoted[0]}:{promoted[1]}", redis
            assert redis["failovers"] == 1, redis
            # The other replica comes to follow the promoted one (Sentinel reconfigures it
            # after the promotion, and lists it disconnected while it reconnects); the dead
            # primary is listed as a replica to be, down.
            others = [r for r in replicas if (r.host, r.port) != promoted]
            other = f"{others[0].host}:{others[0].port}"

            async def other_replica_up() -> bool:
                nonlocal redis
                redis = await shown()
                return any(r["addr"] == other and r["up"] for r in redis["replicas"])

            await eventually(other_replica_up, within=20)
            up = {r["addr"]: r["up"] for r in redis["replicas"]}
            assert up.get(f"{primary.host}:{primary.port}") is False, redis

            # A second kill, of the promoted primary, fails over again, to the last
            # replica. `durability: primary` checks, answered once the replica caught up.
            rate_key = await key_on(http, local.router_url, "n1", "api")
            for _ in range(5):
                answer = await check(http, local.router_url, rate_key, RATE)
                assert answer["allowed"] is True and not answer.get("degraded"), answer
            second = next(r for r in replicas if (r.host, r.port) == promoted)
            written = int(replication(second)["master_repl_offset"])
            wait_for(lambda: caught_up(second, written, 1), 10, "the last replica caught up")
            second.kill()
            killed = time.monotonic()
            rate_served = Served(http, local.router_url, rate_key, RATE)
            await eventually(rate_served, within=40)
            print(f"second kill: first normal answer {time.monotonic() - killed:.2f} s after")
            # The node followed the promotion as the Sentinels' leader began it; they all
            # name the new primary once it is confirmed.
            last = (others[0].host, others[0].port)
            wait_for(lambda: sentinel_master(sentinels, "n1") == last, 10, "the promotion")
            answer = await check(http, local.router_url, rate_key, RATE)
            assert answer["limits"][0]["remaining"] == 1000 - 5 - rate_served.count - 1, answer
            assert (await shown())["failovers"] == 2


async def test_replica_checks_wait_for_a_replica_and_primary_ones_do_not(tmp_path: Any) -> None:
    with scratch_cluster(2, admin_token=ADMIN, data_dir=tmp_path / "c", replicas=1) as local:
        assert local.replication is not None
        replica = local.replication.shards["n1"][0]
        async with aiohttp.ClientSession() as http:
            stock = await key_on(http, local.router_url, "n1", "sku")
            rate = await key_on(http, local.router_url, "n1", "api")
            answer = await check(http, local.router_url, stock, STOCK)
            assert answer["allowed"] is True and not answer.get("degraded"), answer

            replica.pause()  # SIGSTOP: connected, silent; WAIT gets no acknowledgement
            try:
                for _ in range(3):
                    answer = await check(http, local.router_url, stock, STOCK)
                    assert answer.get("degraded") is True, answer
                    assert answer["allowed"] is False, answer  # quotas fail closed
                    answer = await check(http, local.router_url, rate, RATE)
                    assert answer["allowed"] is True and not answer.get("degraded"), answer
                # A dry run (and so `usage`) writes nothing: no replica need hold it.
                body = {"key": stock, "limits": STOCK, "dry_run": True}
                async with http.post(local.router_url + "/v1/check", json=body) as resp:
                    answer = await resp.json()
                assert not answer.get("degraded") and answer["allowed"] is True, answer
                # Inline limits choose their durability as a rule does.
                body = {"key": rate, "limits": RATE, "durability": "replica"}
                async with http.post(local.router_url + "/v1/check", json=body) as resp:
                    answer = await resp.json()
                assert answer["degraded_reason"].startswith("unreplicated"), answer
                body = {"key": stock, "limits": STOCK, "durability": "primary"}
                async with http.post(local.router_url + "/v1/check", json=body) as resp:
                    answer = await resp.json()
                assert answer["allowed"] is True and not answer.get("degraded"), answer
            finally:
                replica.resume()

            served = Served(http, local.router_url, stock, STOCK)
            await eventually(served, within=30)
            replica.kill()  # no replica at all: WAIT times out as well
            # One node batch of both: the first WAIT times out, later ones are not tried
            # until a replica is live again; either way the primary check stands.
            both = {"checks": [{"key": stock, "limits": STOCK}, {"key": rate, "limits": RATE}]}
            rate_admitted = 0
            for _ in range(2):
                async with http.post(local.router_url + "/v1/check/batch", json=both) as resp:
                    on_stock, on_rate = (await resp.json())["results"]
                assert on_stock.get("degraded") is True, on_stock
                assert on_stock["degraded_reason"].startswith("unreplicated"), on_stock
                assert on_rate["allowed"] is True and not on_rate.get("degraded"), on_rate
                rate_admitted += 1
            answer = await check(http, local.router_url, rate, RATE)
            assert answer["limits"][0]["remaining"] == 1000 - 3 - rate_admitted - 1, answer
            replica.start()
            await eventually(served, within=30)
            answer = await check(http, local.router_url, stock, STOCK)
            # The degraded checks consumed nothing: 1 before, the inline primary one, the
            # served ones after, this one.
            assert answer["limits"][0]["remaining"] == 1000 - 2 - served.count - 1
