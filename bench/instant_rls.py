"""A rate-limit service that answers every ShouldRateLimit with OK at once: what Envoy's
rate-limit call costs with nothing behind it (bench/gateway.py's third Envoy).

It serves the same lean HTTP/2 listener as the router (router/envoy/lean_server.py), on
uvloop, with one prebuilt answer: no matching, no counter, no node. The gap between
Envoy with it and Envoy alone is the price of the filter's call itself; the gap between
it and Envoy with shardlimit is what shardlimit adds to that call.

    .venv/bin/python -m bench.instant_rls --port P
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
from collections.abc import Iterator
from functools import partial
from typing import Any

from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped]
from grpc_health.v1 import health  # type: ignore[import-untyped]

from bench.env import python_env
from cluster.local.ports import free_port, listening
from cluster.local.procs import ChildProcess, python_module
from router.envoy.lean_server import LeanGrpcServer

_OK = rls_pb2.RateLimitResponse.Code.OK


class InstantService:
    """ShouldRateLimit: OK for the request and for each of its descriptors."""

    def __init__(self) -> None:
        self._answers: dict[int, Any] = {}  # by descriptor count

    async def ShouldRateLimit(self, request: Any, context: Any) -> Any:
        count = len(request.descriptors)
        answer = self._answers.get(count)
        if answer is None:
            statuses = [rls_pb2.RateLimitResponse.DescriptorStatus(code=_OK)] * count
            answer = rls_pb2.RateLimitResponse(overall_code=_OK, statuses=statuses)
            self._answers[count] = answer
        return answer


@contextlib.contextmanager
def instant_service() -> Iterator[int]:
    """The instant service in its own process on a free port, until the block ends;
    yields its port."""
    port = free_port()
    command = python_module("bench.instant_rls", "--port", str(port))
    with ChildProcess(
        "instant rate-limit service",
        command,
        env=python_env(),
        probe=partial(listening, port, "127.0.0.1"),
    ):
        yield port


async def serve(port: int) -> None:
    server = LeanGrpcServer("127.0.0.1", port, InstantService(), health.aio.HealthServicer(), 0, 0)
    await server.start()
    await asyncio.Event().wait()  # until the parent stops this process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    from cluster.web.serve import install_fast_loop

    install_fast_loop()
    gc.freeze()
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
