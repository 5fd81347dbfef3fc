"""Draw docs/ui.png: the /ui page of a real 3-node ring cluster growing to 4 nodes.

    .venv/bin/python -m tests.support.ui_screenshot [--out docs/ui.png] [--partitioner ring|slots]

Starts four redis-server processes, four nodes and a router on free ports (as the test
fixtures do), loads keys, adds the 4th node with a slowed-down copy so the migration is
caught in flight, captures the page over CDP and stops everything.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

from cluster.local.redis_proc import RedisProcess, free_port
from node.app import create_app as create_node_app
from node.config import NodeConfig
from tests.conftest import ADMIN, CLUSTER, PINNED_MS, _start, start_cluster, stop_cluster
from tests.support.cdp import launch

KEYS = 24_000
STEP_KEYS = 25  # keys per copy step while the picture is taken (the default is larger)


async def shoot(partitioner: str = "ring") -> bytes:
    """A PNG of the page of a fresh cluster, taken while its 4th node's keys move in."""
    with tempfile.TemporaryDirectory(prefix="shardlimit-ui-") as tmp:
        servers = [
            RedisProcess(port=free_port(), data_dir=Path(tmp) / f"redis{i}", aof=False)
            for i in range(4)
        ]
        for server in servers:
            server.start()
        try:
            return await _shoot(partitioner, servers, Path(tmp))
        finally:
            for server in servers:
                server.stop()


async def _shoot(partitioner: str, servers: list[RedisProcess], tmp: Path) -> bytes:
    cluster = await start_cluster(servers[:3], tmp, partitioner=partitioner)
    try:
        runner, port = await _start(
            create_node_app(NodeConfig("n4", servers[3].url, CLUSTER, test_mode=True))
        )
        cluster.runners.insert(3, runner)
        fourth = f"http://127.0.0.1:{port}"
        await cluster.set_time(PINNED_MS, extra_nodes=(fourth,))
        rng = random.Random(15)
        window = {"algorithm": "fixed_window", "limit": 1000, "window": "1h"}
        for start in range(0, KEYS, 1000):
            checks = [
                {"key": f"user:{i}", "limits": [window], "cost": rng.randint(1, 5)}
                for i in range(start, start + 1000)
            ]
            status, _ = await cluster.post("/v1/check/batch", {"checks": checks})
            assert status == 200
        cluster.router.resharder.step_keys = STEP_KEYS
        async with launch() as browser:
            page = await browser.new_page(width=1280, height=760)
            await page.goto(cluster.router_url + "/ui")
            await page.wait_for("document.querySelectorAll('.node-card').length === 3")
            status, body = await cluster.post(
                "/v1/cluster/nodes", {"url": fourth, "id": "n4"}, token=ADMIN
            )
            assert status == 202, body
            # In flight: one source finished, the next one part-way through.
            await page.wait_for(
                """(() => { const m = document.getElementById('migration');
                  return m.dataset.phase === 'copying'
                    && m.querySelectorAll('tr[data-source]').length === 3
                    && m.textContent.includes('✓ done')
                    && [...m.querySelectorAll('tr[data-source] td:nth-child(2)')]
                         .some(td => td.textContent !== '0'
                               && td.nextSibling.nextSibling.textContent !== '✓ done'); })()""",
                within=120,
            )
            png = await page.screenshot()
            if page.errors:
                raise SystemExit(f"the page logged errors: {page.errors}")
            # Let the move finish before everything stops (no half-copied cluster to log).
            await page.wait_for(
                "document.getElementById('migration').dataset.phase === 'done'", within=120
            )
        return png
    finally:
        await stop_cluster(cluster)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/ui.png"))
    parser.add_argument("--partitioner", choices=["ring", "slots"], default="ring")
    args = parser.parse_args()
    png = asyncio.run(shoot(args.partitioner))
    args.out.write_bytes(png)
    print(f"wrote {args.out} ({len(png):,} bytes)")
    sys.exit(0)


if __name__ == "__main__":
    main()
