"""The hot-path channel speaks TLS, and mutual TLS, exactly when the node's HTTP
listener does: a router with the cluster's client certificate gets its batches answered;
a client without one, or without TLS, gets no `Welcome`."""

from __future__ import annotations

import asyncio
import time

import orjson

from cluster import wire
from cluster.model.errors import Problems
from cluster.model.limits import parse_limit
from node.app import create_app as create_node_app
from node.config import NodeConfig
from router.channel.control_client import HttpPool
from router.channel.link import NodeLink
from tests.system.test_tls import CLUSTER_TOKEN, Pki, TlsRedis, _serve_tls, pki, tls_redis

__all__ = ["pki", "tls_redis"]  # fixtures, imported for this module's tests

LIMIT = {"algorithm": "fixed_window", "limit": 5, "window": "1h"}


def _check(key: str) -> wire.Op:
    spec = parse_limit(LIMIT, "limits[0]", Problems())
    assert spec is not None
    return wire.Op("check", key, "~inline", [spec.to_wire()], [0], cost=1)


async def _outcome(link: NodeLink, key: str) -> wire.Reply | BaseException:
    answer: asyncio.Future[wire.Reply | BaseException] = asyncio.get_running_loop().create_future()
    link.send(int(time.time() * 1000) + 5000, [_check(key)], 5.0, answer.set_result)
    return await asyncio.wait_for(answer, 10)


async def test_the_channel_is_mutual_tls_when_the_node_is(
    pki: Pki, tls_redis: list[TlsRedis]
) -> None:
    redis_url = tls_redis[2].url_for(6)
    server_ssl, client_ssl = pki.node_server(), pki.client("node")
    app = create_node_app(
        NodeConfig("n1", redis_url, CLUSTER_TOKEN, server_ssl=server_ssl, client_ssl=client_ssl)
    )
    runner, port = await _serve_tls(app, pki.node_server())
    url = f"https://127.0.0.1:{port}"
    pool = HttpPool(url, {}, ssl_context=pki.client("router"))
    try:
        status, raw = await pool.request("GET", wire.HEALTH_PATH, None, 5.0)
        assert status == 200
        channel_port = orjson.loads(raw)["channel"]

        async def discover(_timeout: float) -> int:
            return int(channel_port)

        with_cert = NodeLink(url, CLUSTER_TOKEN, discover, ssl_context=pki.client("router"))
        reply = await _outcome(with_cert, "tls:1")
        assert isinstance(reply, wire.Reply) and reply.status == 200 and reply.reply is not None
        # No topology was pushed to this node: it owns nothing, and says so.
        assert reply.reply.results == [wire.Moved(0)] and reply.reply.node == "n1"
        assert with_cert.connects == 1
        with_cert.close()

        for context in (pki.client(None), pki.client("rogue")):
            refused = NodeLink(url, CLUSTER_TOKEN, discover, ssl_context=context)
            assert isinstance(await _outcome(refused, "tls:2"), OSError)
            assert refused.connects == 0
            refused.close()

        plain_url = f"http://127.0.0.1:{port}"
        plain = NodeLink(plain_url, CLUSTER_TOKEN, discover, connect_timeout_s=2.0)
        outcome = await _outcome(plain, "tls:3")
        assert isinstance(outcome, OSError | TimeoutError) and plain.connects == 0
        plain.close()
    finally:
        pool.close()
        await runner.cleanup()
