"""The live cluster page (GET /ui) in headless Chromium, driven over the DevTools protocol,
against a real cluster; and the layout endpoint it draws (GET /v1/cluster/ring)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from cluster.local.redis_proc import RedisProcess
from cluster.model.nodes import NodeSpec
from cluster.model.partition import RING_SIZE, RingPartitioner, SlotPartitioner
from cluster.model.topology import Topology
from router.api.ring_view import RingView
from tests.conftest import ADMIN, Cluster, add_spare_node, start_cluster, stop_cluster
from tests.support.cdp import Browser, Page, chromium_path, launch

WINDOW = {"algorithm": "fixed_window", "limit": 100, "window": "1h"}
KEYS = 1200

CARDS_JS = """[...document.querySelectorAll('.node-card[data-node-id]')].map(c => ({
  id: c.dataset.nodeId, state: c.dataset.state,
  keys: c.querySelector('.keys').textContent, count: c.querySelector('.count').textContent}))"""
RING_POINTS_JS = """Object.fromEntries([...document.querySelectorAll('#layout .ring-node')]
  .map(g => [g.dataset.nodeId, g.querySelectorAll('.ring-point').length]))"""
SLOTS_JS = """(() => { const out = {};
  for (const r of document.querySelectorAll('#layout .slot-node .slot-range')) {
    const id = r.parentNode.dataset.nodeId;
    out[id] = (out[id] || 0) + Number(r.dataset.end) - Number(r.dataset.start) + 1;
  }
  return out; })()"""
PHASE_JS = "document.getElementById('migration').dataset.phase"


def number(text: str) -> int:
    """A count as the page prints it ("1,234")."""
    return int(text.replace(",", ""))


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if chromium_path() is None:
        pytest.skip(
            "no chromium on PATH: the /ui tests need a headless browser "
            "(`make test-deps`, or apt-get install chromium)"
        )
    async with launch() as started:
        yield started


@pytest.fixture(params=["ring", "slots"])
async def ui_cluster(
    request: pytest.FixtureRequest,
    redis_servers: list[RedisProcess],
    fourth_redis: RedisProcess,
    tmp_path: Path,
) -> AsyncIterator[tuple[Cluster, str]]:
    """A 3-node cluster with keys on every node, and a 4th node running but not a member."""
    cluster = await start_cluster(redis_servers, tmp_path, partitioner=request.param)
    url = await add_spare_node(cluster, fourth_redis)
    try:
        await preload(cluster)
        yield cluster, url
    finally:
        await stop_cluster(cluster)


async def preload(cluster: Cluster, keys: int = KEYS) -> None:
    checks = [{"key": f"user:{i}", "limits": [WINDOW]} for i in range(keys)]
    for start in range(0, keys, 500):
        status, body = await cluster.post(
            "/v1/check/batch", {"checks": checks[start : start + 500]}
        )
        assert status == 200 and all(r["allowed"] for r in body["results"])


async def open_page(browser: Browser, cluster: Cluster, nodes: int) -> Page:
    page = await browser.new_page()
    await page.goto(cluster.router_url + "/ui")
    await page.wait_for(
        f"document.querySelectorAll('.node-card[data-node-id]').length === {nodes} && "
        "document.querySelectorAll('#legend [data-node-id]').length > 0"
    )
    return page


async def cards(page: Page) -> dict[str, dict[str, Any]]:
    listing: list[dict[str, Any]] = await page.evaluate(CARDS_JS)
    return {card["id"]: card for card in listing}


async def assert_layout_drawn(page: Page, cluster: Cluster) -> None:
    """The page draws exactly the router's current layout: every node's ring points, or
    every node's slots (the strip's ranges cover the 16384 slots once)."""
    part = cluster.router.view.topology.partitioner
    if isinstance(part, RingPartitioner):
        expected = dict(Counter(owner for _, owner in part.points()))
        assert await page.evaluate(RING_POINTS_JS) == expected
        assert sum(expected.values()) == part.vnodes * len(part.nodes)
    else:
        assert isinstance(part, SlotPartitioner)
        expected = {node_id: len(part.slots_of(node_id)) for node_id in part.node_ids}
        assert await page.evaluate(SLOTS_JS) == expected
        assert sum(expected.values()) == 16384
        ranges = await page.evaluate("document.querySelectorAll('#layout .slot-range').length")
        assert ranges == len(part.ranges())
    shown = {card["id"]: number(card["count"]) for card in (await cards(page)).values()}
    assert shown == expected


@pytest.mark.timeout(150)
async def test_page_shows_the_cluster_and_a_node_add_to_the_end(
    ui_cluster: tuple[Cluster, str], browser: Browser
) -> None:
    cluster, fourth_url = ui_cluster
    page = await open_page(browser, cluster, nodes=3)
    _, info = await cluster.get("/v1/cluster")
    shown = await cards(page)
    assert sorted(shown) == ["n1", "n2", "n3"]
    for node in info["nodes"]:
        assert shown[node["id"]]["state"] == "up"
        assert number(shown[node["id"]]["keys"]) == node["keys"]
    assert sum(number(card["keys"]) for card in shown.values()) >= KEYS
    # Each shard's Redis: here a lone primary, marked as having no replicas.
    redis_js = """[...document.querySelectorAll('.node-card[data-node-id]')].map(c =>
      [c.dataset.nodeId, c.dataset.replicas, c.querySelector('.redis').textContent])"""
    expected = sorted(
        [n["id"], "none", f"{n['redis']['primary']}, no replicas"] for n in info["nodes"]
    )
    assert sorted(await page.evaluate(redis_js)) == expected
    await assert_layout_drawn(page, cluster)
    assert await page.evaluate(PHASE_JS) == "none"
    assert await page.evaluate("document.getElementById('epoch').textContent") == "1"

    status, body = await cluster.post(
        "/v1/cluster/nodes", {"url": fourth_url, "id": "n4"}, token=ADMIN
    )
    assert status == 202, body
    await page.wait_for(
        """(() => { const m = document.getElementById('migration');
          const keys = document.querySelector('.node-card[data-node-id="n4"] .keys');
          return document.querySelectorAll('.node-card[data-node-id]').length === 4
            && (m.dataset.phase === 'none' || (m.dataset.phase === 'done'
                                               && m.dataset.running === 'false'))
            && keys !== null && Number(keys.textContent.replace(/,/g, '')) > 0; })()""",
        within=90,
    )
    _, info = await cluster.get("/v1/cluster")
    assert info["migration"]["phase"] == "done"
    await page.wait_for(
        f"document.getElementById('epoch').textContent === '{info['epoch']}'", within=10
    )
    shown = await cards(page)
    assert sorted(shown) == ["n1", "n2", "n3", "n4"]
    assert {card["state"] for card in shown.values()} == {"up"}
    await assert_layout_drawn(page, cluster)
    summary = await page.evaluate("document.querySelector('.migration-summary').textContent")
    moved = info["migration"]["keys_moved"]
    assert summary.startswith(f"Migration {info['migration']['id']} done · {moved:,} keys moved")
    assert page.errors == []


async def test_page_shows_a_node_down(cluster: Cluster, browser: Browser) -> None:
    await preload(cluster, 300)
    page = await open_page(browser, cluster, nodes=3)
    await cluster.runners[1].cleanup()  # node n2's HTTP server
    await page.wait_for(
        "document.querySelector('.node-card[data-node-id=\"n2\"]').dataset.state === 'down'"
    )
    shown = await cards(page)
    assert {node_id: card["state"] for node_id, card in shown.items()} == {
        "n1": "up",
        "n2": "down",
        "n3": "up",
    }
    assert shown["n2"]["keys"] == "\u2013"  # en dash: unknown
    assert await page.evaluate("document.getElementById('status').dataset.ok") == "true"
    await assert_layout_drawn(page, cluster)
    assert page.errors == []


async def test_page_names_a_full_redis(cluster: Cluster, browser: Browser) -> None:
    page = await open_page(browser, cluster, nodes=3)
    direct = redis.Redis(port=cluster.redis[0].port)
    try:
        used = int(direct.info("memory")["used_memory"])
        direct.config_set("maxmemory", used // 2)
        error = "document.querySelector('.node-card[data-node-id=\"n1\"] .error').textContent"
        await page.wait_for(f"{error}.startsWith('Redis: full: used_memory ')")
    finally:
        direct.config_set("maxmemory", 0)
        direct.close()
    await page.wait_for(f"{error} === ''")
    assert page.errors == []


async def test_page_files_and_headers(cluster: Cluster) -> None:
    for path, content_type in [
        ("/ui", "text/html"),
        ("/ui/ui.js", "text/javascript"),
        ("/ui/ui.css", "text/css"),
    ]:
        async with cluster.http.get(cluster.router_url + path) as resp:
            assert resp.status == 200
            assert resp.content_type == content_type
            assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
            text = await resp.text()
            assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
            assert "https://" not in text
    async with cluster.http.get(cluster.router_url + "/ui/", allow_redirects=False) as resp:
        assert resp.status == 302
        assert resp.headers["Location"] == "/ui"
    async with cluster.http.get(cluster.router_url + "/ui/secrets.txt") as resp:
        assert resp.status == 404
        assert resp.content_type == "application/problem+json"


async def test_ring_endpoint_is_the_partitioner(cluster: Cluster) -> None:
    status, body = await cluster.get("/v1/cluster/ring")
    assert status == 200
    part = cluster.router.view.topology.partitioner
    assert isinstance(part, RingPartitioner)
    assert body["epoch"] == 1
    assert body["partitioner"] == "ring"
    assert body["vnodes"] == 160
    assert body["ranges"] is None
    assert [n["id"] for n in body["nodes"]] == ["n1", "n2", "n3"]
    for node in body["nodes"]:
        raw = [point for point, owner in part.points() if owner == node["id"]]
        assert node["points"] == [(p * 10**6 // RING_SIZE) / 10**6 for p in raw]
        assert node["slots"] is None
        assert all(0 <= p < 1 for p in node["points"])


async def test_slots_endpoint_is_the_table(slots_cluster: Cluster) -> None:
    status, body = await slots_cluster.get("/v1/cluster/ring")
    assert status == 200
    assert body == {
        "epoch": 1,
        "partitioner": "slots",
        "vnodes": None,
        "nodes": [
            {"id": "n1", "points": None, "slots": 5462},
            {"id": "n2", "points": None, "slots": 5461},
            {"id": "n3", "points": None, "slots": 5461},
        ],
        "ranges": [[0, 5461, "n1"], [5462, 10922, "n2"], [10923, 16383, "n3"]],
    }


def test_layout_is_encoded_once_per_epoch() -> None:
    nodes = [NodeSpec("a", "http://127.0.0.1:1"), NodeSpec("b", "http://127.0.0.1:2", 2)]
    part = RingPartitioner(nodes, vnodes=4)
    view = RingView()
    first = view.body(Topology(epoch=3, partitioner=part))
    assert view.body(Topology(epoch=3, partitioner=part)) is first
    document = orjson.loads(first)
    assert [len(n["points"]) for n in document["nodes"]] == [4, 8]
    grown = part.resized([*nodes, NodeSpec("c", "http://127.0.0.1:3")])
    second = view.body(Topology(epoch=4, partitioner=grown))
    assert second is not first
    assert [len(n["points"]) for n in orjson.loads(second)["nodes"]] == [4, 8, 4]


OVERFLOW_JS = """(() => {
  const width = document.documentElement.clientWidth;
  const outside = [...document.querySelectorAll('.node-card[data-node-id], .panel, svg#layout')]
    .map(e => [e.dataset.nodeId || e.id || e.className, e.getBoundingClientRect()])
    .filter(([, r]) => r.left < 0 || r.right > width)
    .map(([name, r]) => `${name}: ${Math.round(r.left)}..${Math.round(r.right)}`);
  return {width, scrollWidth: document.documentElement.scrollWidth, outside};
})()"""


@pytest.mark.parametrize("width", [600, 380])
async def test_page_reflows_on_a_narrow_screen(
    cluster: Cluster, browser: Browser, width: int
) -> None:
    """At 600 px (and a phone's 380) every node card, panel and the layout lie within the
    viewport's width: nothing cut off, no sideways scrolling."""
    page = await browser.new_page(width=width, height=900)
    await page.goto(cluster.router_url + "/ui")
    await page.wait_for("document.querySelectorAll('.node-card[data-node-id]').length === 3")
    fit = await page.evaluate(OVERFLOW_JS)
    assert fit == {"width": width, "scrollWidth": width, "outside": []}
    assert page.errors == []
