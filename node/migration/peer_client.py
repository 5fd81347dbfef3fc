"""Node-to-node control calls (HTTP, JSON, the cluster token): migrations, hold settles and
hand-overs, and coordinators' decisions. Every failure becomes a PeerError."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from cluster import wire
from node.errors import PeerError

__all__ = ["PeerClient"]


class PeerClient:
    def __init__(
        self, session_factory: Callable[[], aiohttp.ClientSession], cluster_token: str | None
    ) -> None:
        self._session_factory = session_factory  # the node's one session, made when needed
        self._redis_addresses: dict[str, tuple[str, int, int]] = {}
        # Per node URL: whether its shard has replicas, as its LANDED_PATH answer said
        # (node/migration/durable.py); unknown until then. Forgotten with its address.
        self.replicated: dict[str, bool] = {}
        self.headers = {"Content-Type": "application/json"}
        if cluster_token:
            self.headers["Authorization"] = f"Bearer {cluster_token}"

    async def post(self, url: str, payload: Any, timeout_s: float = 10.0) -> Any:
        """One node-to-node call with the cluster token; every failure becomes PeerError."""
        session = self._session_factory()
        try:
            async with session.post(
                url,
                data=orjson.dumps(payload),
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                body = await response.read()
                if response.status != 200:
                    raise PeerError(
                        f"{url} answered {response.status}: {body[:200]!r}", response.status
                    )
                return orjson.loads(body)
        except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError) as exc:
            raise PeerError(f"{url}: {type(exc).__name__} {exc}") from exc

    def forget_redis(self, node_url: str) -> None:
        """A MIGRATE to the node's Redis address failed (a failover moved its primary, or
        it is down): the next redis_address() asks its stats again."""
        self._redis_addresses.pop(node_url, None)
        self.replicated.pop(node_url, None)

    async def redis_address(self, node_url: str) -> tuple[str, int, int] | None:
        """(host, port, db) of a node's Redis primary as its stats say (kept per node
        until forget_redis()), or None when it cannot be learned now."""
        address = self._redis_addresses.get(node_url)
        if address is None:
            session = self._session_factory()
            try:
                async with session.get(
                    node_url + wire.STATS_PATH,
                    headers=self.headers,
                    timeout=aiohttp.ClientTimeout(total=5),
                ) as response:
                    info = orjson.loads(await response.read())
                redis_info = info.get("redis") or {}
                address = (str(redis_info["host"]), int(redis_info["port"]), int(redis_info["db"]))
            except (aiohttp.ClientError, TimeoutError, OSError, KeyError, ValueError, TypeError):
                return None
            self._redis_addresses[node_url] = address
        return address
