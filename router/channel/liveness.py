"""Is a node's process answering? The liveness probe of the router's client of one node.

Nodes answer liveness probes on a port of their own (node/health/liveness.py), from a
thread that answers however busy their event loop is. The port is announced in each
batch answer, in their /healthz and in their stats; until it is known, probes go to the
main port, where only a refusal counts (a busy event loop is no proof).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import urlsplit

from cluster.wire import HEALTH_PATH
from router.channel.control_client import HttpPool

# A probe gets PROBE_TIMEOUT_S, stretched to a few times the slowest recent batch round
# trip, so a node that is merely busy (or a router whose own loop is saturated) is never
# taken for a hung one.
PROBE_TIMEOUT_S = 0.2
RTT_FACTOR = 3
OWN_STALL_S = 0.05  # a probe timeout handled this late reflects our own stall
RTT_DECAY = 0.9  # per batch: how fast the remembered slowest round trip fades


class LivenessProbe:
    """When the node was last heard from, how slow its batches have been, and the probe."""

    def __init__(self, url: str, pool: HttpPool, ssl_context: ssl.SSLContext | None) -> None:
        self.url = url
        self.pool = pool  # the node's main port
        self.ssl_context = ssl_context
        self.last_heard = 0.0  # loop time
        self.rtt_peak = 0.0  # slowest recent batch round trip, decaying
        self.live_port: int | None = None
        self.live_pool: HttpPool | None = None

    def heard(self) -> None:
        self.last_heard = asyncio.get_running_loop().time()

    def answered(self, started: float) -> float:
        """A batch sent at loop time `started` was answered now: its round trip."""
        self.last_heard = asyncio.get_running_loop().time()
        round_trip = self.last_heard - started
        self.rtt_peak = max(round_trip, self.rtt_peak * RTT_DECAY)
        return round_trip

    @property
    def timeout_s(self) -> float:
        return max(PROBE_TIMEOUT_S, RTT_FACTOR * self.rtt_peak)

    def learn_port(self, port: Any) -> None:
        """The node's liveness port, as it announced it. The port speaks what the main
        port speaks: TLS (same certificate) for an https node."""
        if not isinstance(port, int) or port == self.live_port or not 0 < port < 65536:
            return
        self.live_port = port
        url = urlsplit(self.url)
        self.live_pool = HttpPool(
            f"{url.scheme}://{url.hostname}:{port}", {}, ssl_context=self.ssl_context
        )

    async def probe(self) -> bool:
        """A liveness probe on a connection of its own: is the node process answering?

        A refused liveness port may only mean the node restarted on a new one: then
        the main port's /healthz decides.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        timeout = self.timeout_s
        live_pool = self.live_pool
        if live_pool is not None:
            try:
                status, _ = await live_pool.request("GET", "/", None, timeout, fresh=True)
            except TimeoutError:
                # Proof of a hang only if nothing was heard meanwhile and this router's own
                # loop kept time: a timeout that fired late says this process was stalled
                # (its connect or read callbacks queued behind other work), not the node.
                late = loop.time() - (started + timeout)
                return self.last_heard > started or late > OWN_STALL_S
            except OSError:
                live_pool.close()
                if self.live_pool is live_pool:  # another probe may have forgotten it first
                    self.live_pool = self.live_port = None
            else:
                self.heard()
                return status == 200
        try:
            status, _ = await self.pool.request("GET", HEALTH_PATH, None, timeout, fresh=True)
        except TimeoutError:
            return True  # the main port queues behind the node's event loop: inconclusive
        except OSError:
            return False
        self.heard()
        return status == 200

    def close(self) -> None:
        if self.live_pool is not None:
            self.live_pool.close()
