"""The baselines the router is compared with: a trivial aiohttp JSON handler, a bare Redis.

The trivial handler is what an aiohttp service on this machine can do at best: one
process, uvloop (served by `cluster.web.serve.run_app`, exactly like the router), parse the
JSON body, answer a small JSON decision. `python -m bench.peers --port P` serves it.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson
from aiohttp import web

from bench.env import python_env
from cluster.local.procs import ChildProcess, python_module
from cluster.local.redis_proc import RedisProcess, free_port


async def trivial_check(request: web.Request) -> web.Response:
    body = orjson.loads(await request.read())
    answer = {"allowed": True, "key": body.get("key"), "node": "trivial", "degraded": False}
    return web.Response(body=orjson.dumps(answer), content_type="application/json")


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def trivial_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/check", trivial_check)
    app.router.add_get("/healthz", healthz)
    return app


@contextlib.contextmanager
def handler_process(role: str, module: str, *args: str) -> Iterator[str]:
    """`python -m module --port P args` (an aiohttp app with /healthz) on a free port,
    until the block ends; yields its base URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = python_module(module, "--port", str(port), *args)
    with ChildProcess(role, command, env=python_env(), ready_url=url + "/healthz"):
        yield url


def trivial_server() -> contextlib.AbstractContextManager[str]:
    """A trivial handler process on a free port; yields its base URL."""
    return handler_process("trivial aiohttp", "bench.peers")


@contextlib.contextmanager
def bare_redis(*, aof: bool = False, host: str = "127.0.0.1") -> Iterator[RedisProcess]:
    """A redis-server (the same binary the cluster uses) on a free port of `host`; with
    `aof`, the cluster's persistence (fsync every second), else none."""
    with tempfile.TemporaryDirectory(prefix="sl-bench-redis-") as tmp:
        server = RedisProcess(port=free_port(host), data_dir=Path(tmp), aof=aof, host=host)
        try:
            server.start()
            yield server
        finally:
            server.stop()


def main() -> None:
    from cluster.web.serve import run_app

    parser = argparse.ArgumentParser(description="a trivial aiohttp JSON handler")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    run_app(trivial_app(), args.host, args.port)


if __name__ == "__main__":
    main()
