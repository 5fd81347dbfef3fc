"""Control calls to one node (not batches): JSON over the router's one HTTP/1.1 client
(router/channel/control_client.py). Every failure becomes NodeUnavailable."""

from __future__ import annotations

from typing import Any

import orjson

from cluster.web.problem import problem_detail
from cluster.wire import HEALTH_PATH
from router.channel.control_client import HttpPool
from router.channel.liveness import LivenessProbe
from router.errors import NodeUnavailable, Reason


class NodeControl:
    """GET and POST of JSON to one node, with a default timeout of `timeout_s`."""

    def __init__(
        self, node_id: str, pool: HttpPool, liveness: LivenessProbe, timeout_s: float
    ) -> None:
        self.node_id = node_id
        self.pool = pool
        self.liveness = liveness
        self.timeout_s = timeout_s

    async def post(
        self, path: str, payload: Any, method: str = "POST", timeout_s: float | None = None
    ) -> Any:
        return await self._request(method, path, orjson.dumps(payload), timeout_s)

    async def get(self, path: str, timeout_s: float | None = None) -> Any:
        return await self._request("GET", path, None, timeout_s)

    async def _request(
        self, method: str, path: str, data: bytes | None, timeout_s: float | None
    ) -> Any:
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        try:
            status, raw = await self.pool.request(method, path, data, timeout)
            if status != 200:
                raise NodeUnavailable(
                    f"node {self.node_id} answered {status}: {problem_detail(raw)}"
                )
            return orjson.loads(raw)
        except TimeoutError as exc:
            raise NodeUnavailable(f"node {self.node_id}: timed out", Reason.TIMEOUT) from exc
        except (orjson.JSONDecodeError, OSError, ValueError) as exc:
            raise NodeUnavailable(f"node {self.node_id}: {type(exc).__name__} {exc}") from exc

    async def channel_port(self, timeout_s: float) -> int:
        """The node's channel port, from its /healthz (which names its liveness port too).
        Raises OSError or TimeoutError, as the channel expects (router/channel/link.py)."""
        status, raw = await self.pool.request("GET", HEALTH_PATH, None, timeout_s)
        try:
            health = orjson.loads(raw) if status == 200 else None
        except orjson.JSONDecodeError:
            health = None
        port = health.get("channel") if isinstance(health, dict) else None
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ConnectionRefusedError(f"node {self.node_id} names no channel port ({status})")
        self.liveness.learn_port(health.get("live") if isinstance(health, dict) else None)
        return port
