"""Node-to-node control calls (HTTP, JSON, the cluster token): migrations, hold settles and
hand-overs, and coordinators' decisions. Every failure becomes a PeerError.

A peer is a shard, addressed by its endpoints (NodeSpec.urls: node processes on the
shard's one Redis, any of which serves any call). A call tries them in order, starting
with the one that answered last, and moves on past one it cannot reach (connection
refused or reset, or no answer in time); an endpoint that answers, even with an error,
is the shard's answer. Every call here is safe to send again (reads, or writes that act
once: first-wins records, ZADD NX, imports marked per migration, settles of held
decisions), so a call that timed out on one endpoint may go to the next.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from cluster import wire
from cluster.web.problem import problem_detail
from node.errors import PeerError

__all__ = ["Endpoints", "PeerClient", "RedisAddress"]

Endpoints = tuple[str, ...]  # a shard's node URLs, its first endpoint first (NodeSpec.urls)
RedisAddress = tuple[str, int, int]  # (host, port, db) of a shard's Redis primary


class _Unreachable(Exception):
    """This endpoint could not be reached: the call goes to the shard's next one."""


class PeerClient:
    def __init__(
        self, session_factory: Callable[[], aiohttp.ClientSession], cluster_token: str | None
    ) -> None:
        self._session_factory = session_factory  # the node's one session, made when needed
        # Per shard: its Redis primary's address and run_id, as its stats said.
        self._redis: dict[Endpoints, tuple[RedisAddress, str]] = {}
        # Per shard: whether it has replicas, as its LANDED_PATH answer said
        # (node/migration/durable.py); unknown until then. Forgotten with its address.
        self.replicated: dict[Endpoints, bool] = {}
        # Per shard of several endpoints: the one that answered last (tried first).
        self._answering: dict[Endpoints, str] = {}
        self.headers = {"Content-Type": "application/json"}
        if cluster_token:
            self.headers["Authorization"] = f"Bearer {cluster_token}"

    async def post(
        self, endpoints: Endpoints, path: str, payload: Any, timeout_s: float = 10.0
    ) -> Any:
        """POST `path` to the shard with the cluster token; its JSON answer. Raises
        PeerError (with the HTTP status when an endpoint answered one)."""
        return await self._call(endpoints, "POST", path, orjson.dumps(payload), timeout_s)

    async def get(self, endpoints: Endpoints, path: str, timeout_s: float = 5.0) -> Any:
        return await self._call(endpoints, "GET", path, None, timeout_s)

    def order(self, endpoints: Endpoints) -> Endpoints:
        """The shard's endpoints in the order a call tries them."""
        first = self._answering.get(endpoints)
        if first is None or first == endpoints[0]:
            return endpoints
        return (first, *(url for url in endpoints if url != first))

    async def _call(
        self, endpoints: Endpoints, method: str, path: str, data: bytes | None, timeout_s: float
    ) -> Any:
        if not endpoints:
            raise PeerError("a peer without endpoints")
        failures: list[str] = []
        for url in self.order(endpoints):
            try:
                answer = await self._once(method, url + path, data, timeout_s)
            except _Unreachable as exc:
                failures.append(str(exc))
                continue
            if len(endpoints) > 1:
                self._answering[endpoints] = url
            return answer
        raise PeerError("; ".join(failures))

    async def _once(self, method: str, url: str, data: bytes | None, timeout_s: float) -> Any:
        """One endpoint's answer. Raises _Unreachable, or PeerError for an answer that is
        not a 200 with JSON."""
        session = self._session_factory()
        try:
            async with session.request(
                method,
                url,
                data=data,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                body = await response.read()
                if response.status != 200:
                    raise PeerError(
                        f"{url} answered {response.status}: {problem_detail(body)}",
                        response.status,
                    )
                return orjson.loads(body)
        except (aiohttp.ClientConnectionError, TimeoutError, OSError) as exc:
            raise _Unreachable(f"{url}: {type(exc).__name__} {exc}") from exc
        except (aiohttp.ClientError, orjson.JSONDecodeError) as exc:
            raise PeerError(f"{url}: {type(exc).__name__} {exc}") from exc

    def forget_redis(self, endpoints: Endpoints) -> None:
        """A call to the shard's Redis address failed or found no primary there (a failover
        moved it, or it is down): the next redis_identity() asks its stats again."""
        self._redis.pop(endpoints, None)
        self.replicated.pop(endpoints, None)

    async def redis_identity(self, endpoints: Endpoints) -> tuple[RedisAddress, str] | None:
        """((host, port, db), run_id) of a shard's Redis primary as its stats say (kept per
        shard until forget_redis(); run_id "" from a node that does not say it), or None
        when it cannot be learned now. node/migration/peer_redis.py checks that the
        address reaches that Redis from here."""
        identity = self._redis.get(endpoints)
        if identity is None:
            try:
                info = await self.get(endpoints, wire.STATS_PATH)
                redis_info = info.get("redis") or {}
                address = (str(redis_info["host"]), int(redis_info["port"]), int(redis_info["db"]))
                identity = (address, str(redis_info.get("run_id") or ""))
            except (PeerError, AttributeError, KeyError, ValueError, TypeError):
                return None
            self._redis[endpoints] = identity
        return identity
