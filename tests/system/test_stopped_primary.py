"""A primary stopped (SIGSTOP) for longer than Sentinel's down-after is failed over
while checks flow from another process; once continued (SIGCONT) it is a demoted
process, and it never serves a decision: a decision it served would be lost when
Sentinel turns it into a replica, so every admission the clients saw, also of a
`durability: primary` rule, is in the counter at the end."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import pytest

from cluster.local.cluster import scratch_cluster
from cluster.local.loadgen import start_loadgen
from cluster.local.sentinel_proc import sentinel_master, wait_for
from tests.conftest import eventually
from tests.system.replication import (
    Served,
    caught_up,
    check,
    is_linked_replica,
    key_on,
    replication,
)

pytestmark = [pytest.mark.system, pytest.mark.timeout(150)]
ADMIN = "stopped-primary-admin-token"
LIMIT = 1_000_000
RATE = [{"algorithm": "fixed_window", "limit": LIMIT, "window": "1d"}]  # durability primary


async def test_a_stopped_primary_never_serves_once_it_is_continued(tmp_path: Any) -> None:
    with scratch_cluster(2, admin_token=ADMIN, data_dir=tmp_path / "c", replicas=2) as local:
        assert local.replication is not None
        sentinels = local.replication.sentinels
        primary = local.redis[0]
        async with aiohttp.ClientSession() as http:
            key = await key_on(http, local.router_url, "n1", "api")
            for _ in range(10):
                answer = await check(http, local.router_url, key, RATE)
                assert answer["allowed"] is True and not answer.get("degraded"), answer
            written = int(replication(primary)["master_repl_offset"])
            wait_for(lambda: caught_up(primary, written, 2), 10, "both replicas caught up")

            served = Served(http, local.router_url, key, RATE)
            body = json.dumps({"key": key, "limits": RATE})
            load = await start_loadgen(
                local.router_url + "/v1/check", connections=8, body=body, per_key=True
            )
            try:
                await eventually(served, within=20)
                primary.pause()
                stopped = time.monotonic()
                try:
                    wait_for(
                        lambda: sentinel_master(sentinels, "n1") != (primary.host, primary.port),
                        30,
                        "a replica promoted",
                    )
                    await eventually(served, within=30)
                    print(f"served again {time.monotonic() - stopped:.2f} s after SIGSTOP")
                finally:
                    primary.resume()
                # The window that matters: the old primary answers again and still
                # believes it is the primary, until Sentinel demotes it.
                wait_for(lambda: is_linked_replica(primary), 30, "the old primary a replica")
                await eventually(served, within=20)
            finally:
                tally = await load.stop()
            admitted_by_load = tally["allowed_by_key"].get(key, 0)
            assert admitted_by_load > 0, tally
            final = await check(http, local.router_url, key, RATE)
            assert final["allowed"] is True and not final.get("degraded"), final
            held = LIMIT - final["limits"][0]["remaining"]
            admitted = 10 + admitted_by_load + served.count + 1
            assert held == admitted, (held, admitted, tally)
