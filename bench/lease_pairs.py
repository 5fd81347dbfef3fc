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

# Where a check's answer gives its lease id (msgspec writes a Decision's fields in order,
# a Lease's id first): the id is cut from the body, as cheap as the checks' side reads it.
LEASE_ID_AT = b'"lease":{"id":"'


def _head(host: str, path: str) -> bytes:
    """A POST's head up to its Content-Length value."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Content-Length: "
    ).encode()


def _post(host: str, path: str, body: dict[str, Any]) -> bytes:
    data = orjson.dumps(body)
    return _head(host, path) + str(len(data)).encode() + b"\r\n\r\n" + data


def lease_id_of(body: bytes) -> bytes | None:
    """The lease id of a check's answer, None when it holds none."""
    start = body.rfind(LEASE_ID_AT)  # the lease is the answer's last field
    if start < 0:
        return None
    start += len(LEASE_ID_AT)
    end = body.find(b'"', start)
    return body[start:end] if end > start else None


class Releases:
    """The release of a key's lease, from a template made once per key and length of
    lease id: only the id itself is put in."""

    def __init__(self, host: str, rule: str, keys: int) -> None:
        self.head = _head(host, "/v1/lease/release")
        # The body up to the lease id (orjson writes keys in order), per key.
        self.bodies = [
            orjson.dumps({"key": f"t:{n}", "rule": rule, "lease_id": ""})[:-2] for n in range(keys)
        ]
        # Per key, by the id's length: the request up to the id.
        self.prefixes: list[dict[int, bytes]] = [{} for _ in range(keys)]

    def request(self, n: int, lease_id: bytes) -> bytes:
        prefix = self.prefixes[n].get(len(lease_id))
        if prefix is None:
            body = self.bodies[n]
            length = str(len(body) + len(lease_id) + 2).encode()
            prefix = self.prefixes[n][len(lease_id)] = self.head + length + b"\r\n\r\n" + body
        return prefix + lease_id + b'"}'


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
        self.releases = Releases(self.authority, args.rule, args.keys)
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
                lease_id = lease_id_of(body)
                if lease_id is None:
                    self.errors.append(f"check without a lease: {body[:200]!r}")
                    continue
                status, body, _ = await conn.request(self.releases.request(n, lease_id))
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
