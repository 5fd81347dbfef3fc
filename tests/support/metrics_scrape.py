"""Reading a real process's GET /metrics in tests: prometheus_client's own parser."""

from __future__ import annotations

import aiohttp
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


async def scrape(http: aiohttp.ClientSession, url: str) -> list[Metric]:
    """The metric families `url`/metrics serves (asserting it answers as Prometheus expects)."""
    async with http.get(url + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=")
        return list(text_string_to_metric_families(await resp.text()))


def value(families: list[Metric], name: str, **labels: str) -> float:
    """The one sample `name` with exactly `labels` (0 when absent: a counter not yet used)."""
    found = [s.value for f in families for s in f.samples if s.name == name and s.labels == labels]
    assert len(found) <= 1, (name, labels)
    return found[0] if found else 0.0
