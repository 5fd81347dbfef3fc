"""Closed-loop lease pairs (acquire, then release) or plain checks, in their own process,
on the load generator's lean HTTP/1.1 connections (cluster/local/load_http.py), so both
modes pay the same client cost:

    python -m bench.lease_pairs --url http://127.0.0.1:8080 --rule bench_lease \\
        --connections 64 --seconds 4 --keys 1000 [--checks]

Pairs: each connection checks `{"key": "t:<n>", "rule": ...}`; an allowed check's lease
is released at once (`POST /v1/lease/release`); one pair is one check allowed and its
release answered 200. Checks (`--checks`): each connection only checks. It prints one
JSON object: what was done, per second, denials and errors.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import orjson

from cluster.local.load_http import HttpError, LoadConnection


def _post(host: str, path: str, body: dict[str, Any]) -> bytes:
    data = orjson.dumps(body)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


class Pairs:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        parts = urlsplit(args.url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.authority = f"{self.host}:{self.port}"
        self.checks = [
            _post(self.authority, "/v1/check", {"key": f"t:{n}", "rule": args.rule})
            for n in range(args.keys)
        ]
        self.done = 0
        self.denied = 0
        self.errors: list[str] = []
        self.deadline = 0.0

    async def _connection(self, first: int) -> None:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(LoadConnection, self.host, self.port)
        n = first
        while time.monotonic() < self.deadline:
            n = (n + self.args.connections) % self.args.keys
            status, body, _ = await conn.request(self.checks[n])
            if status == 429:
                self.denied += 1
                continue
            if status != 200:
                self.errors.append(f"check {status}: {body[:200]!r}")
                continue
            if not self.args.checks:
                lease = orjson.loads(body)["lease"]
                release = {"key": f"t:{n}", "rule": self.args.rule, "lease_id": lease["id"]}
                payload = _post(self.authority, "/v1/lease/release", release)
                status, body, _ = await conn.request(payload)
                if status != 200:
                    self.errors.append(f"release {status}: {body[:200]!r}")
                    continue
            self.done += 1
        assert conn.transport is not None
        conn.transport.close()

    async def run(self) -> dict[str, Any]:
        started = time.monotonic()
        self.deadline = started + self.args.seconds
        outcomes = await asyncio.gather(
            *(self._connection(i) for i in range(self.args.connections)),
            return_exceptions=True,
        )
        elapsed = time.monotonic() - started
        for outcome in outcomes:
            if isinstance(outcome, (OSError, HttpError)):
                self.errors.append(f"{type(outcome).__name__}: {outcome}")
            elif isinstance(outcome, BaseException):
                raise outcome
        return {
            "mode": "checks" if self.args.checks else "pairs",
            "done": self.done,
            "per_s": round(self.done / elapsed, 1),
            "denied": self.denied,
            "errors": len(self.errors),
            "error_samples": self.errors[:3],
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lease_pairs", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--rule", required=True)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--checks", action="store_true", help="only check, release nothing")
    args = parser.parse_args(argv)
    report = asyncio.run(Pairs(args).run())
    sys.stdout.write(orjson.dumps(report).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
