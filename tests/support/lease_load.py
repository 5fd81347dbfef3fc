"""Concurrent lease acquirers, run in their own process (never in the pytest process):

    python -m tests.support.lease_load --url http://127.0.0.1:8080 --rule exports \\
        --key tenant:1 --workers 300 --rounds 2

Each of `workers` asyncio tasks takes a lease `rounds` times: it checks until a check is
allowed (a denied one waits a random 100-400 ms and checks again), holds the lease a random
1-5 ms, and releases it. It prints one JSON object: every lease with its fencing value, the
node clock's acquisition time (the decision's `lease.acquired_at_ms`) and release time
(the release answer's `released_at_ms`; for a release that answered 503 during an outage,
from sending it again: `_release_again`), the number of denials, and any error.

Tests start it with `start_load` and read its report with `report_of`; `most_held_at_once`
counts the overlap of the leases it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[2]


async def _worker(
    http: aiohttp.ClientSession, args: argparse.Namespace, leases: list[dict[str, Any]]
) -> int:
    denials = 0
    check = {"key": args.key, "rule": args.rule}
    for _ in range(args.rounds):
        while True:
            async with http.post(args.url + "/v1/check", json=check) as resp:
                body = await resp.json()
            if resp.status == 200:
                break
            if resp.status != 429 and not args.through_outage:
                raise RuntimeError(f"check answered {resp.status}: {body}")
            denials += 1
            await asyncio.sleep(random.uniform(0.1, 0.4))  # back off, then check again
        lease = body["lease"]
        await asyncio.sleep(random.uniform(0.001, 0.005))  # the work the lease protects
        release = {"key": args.key, "rule": args.rule, "lease_id": lease["id"]}
        async with http.post(args.url + "/v1/lease/release", json=release) as resp:
            released = await resp.json()
        if resp.status == 200:
            released_at_ms, was_released = released["released_at_ms"], True
        elif args.through_outage and resp.status == 503:
            unanswered_at_ms = int(time.time() * 1000)
            released_at_ms, was_released = await _release_again(http, args, release, lease)
            if released_at_ms is None:  # the first release was applied, not answered
                released_at_ms = unanswered_at_ms
        else:
            raise RuntimeError(f"release answered {resp.status}: {released}")
        leases.append(
            {
                "fencing": lease["fencing"],
                "acquired_at_ms": lease["acquired_at_ms"],
                "released_at_ms": released_at_ms,
                "released": was_released,
            }
        )
    return denials


async def _release_again(
    http: aiohttp.ClientSession,
    args: argparse.Namespace,
    release: dict[str, Any],
    lease: dict[str, Any],
) -> tuple[int | None, bool]:
    """A release that answered 503 may have been applied all the same (the node lost its
    Redis after writing, before answering). It is sent again until it answers: 200, the
    lease was held until then; 404 before the lease's expiry, the first release was
    applied (None: no later than its 503 came back); 404 after it, the lease expired then
    (or was released before: counted as held to its end, the cautious side). With whether
    it counts as released rather than expired."""
    expires_at_ms = lease["acquired_at_ms"] + lease["ttl_ms"]
    while True:
        await asyncio.sleep(random.uniform(0.1, 0.4))
        async with http.post(args.url + "/v1/lease/release", json=release) as resp:
            answer = await resp.json()
        if resp.status == 200:
            return answer["released_at_ms"], True
        if resp.status == 404:
            if time.time() * 1000 < expires_at_ms:
                return None, True
            return expires_at_ms, False
        if resp.status != 503:
            raise RuntimeError(f"release answered {resp.status}: {answer}")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    leases: list[dict[str, Any]] = []
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as http:
        outcomes = await asyncio.gather(
            *(_worker(http, args, leases) for _ in range(args.workers)), return_exceptions=True
        )
    errors = [repr(o) for o in outcomes if isinstance(o, BaseException)]
    denials = sum(o for o in outcomes if isinstance(o, int))
    seconds = round(time.monotonic() - started, 3)
    return {"leases": leases, "denials": denials, "errors": errors[:5], "seconds": seconds}


async def start_load(
    url: str, rule: str, key: str, workers: int, rounds: int, *, through_outage: bool = False
) -> asyncio.subprocess.Process:
    """This module in a child process (never in the caller's), its report on stdout."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.lease_load",
        *("--url", url, "--rule", rule, "--key", key),
        *("--workers", str(workers), "--rounds", str(rounds)),
        *(["--through-outage"] if through_outage else []),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def report_of(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise AssertionError(err.decode()[-3000:])
    report: dict[str, Any] = orjson.loads(out)
    return report


def most_held_at_once(leases: list[dict[str, Any]]) -> int:
    """The most leases whose [acquired, released) intervals on the node's clock overlap.
    At the same millisecond a release counts before an acquisition (half-open intervals:
    Redis' clock has millisecond steps here, so a slot freed and taken again within one
    millisecond is not an overlap)."""
    events = sorted(
        [(lease["acquired_at_ms"], 1) for lease in leases]
        + [(lease["released_at_ms"], -1) for lease in leases]
    )
    most = held = 0
    for _, step in events:
        held += step
        most = max(most, held)
    return most


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.support.lease_load")
    parser.add_argument("--url", required=True, help="the router, e.g. http://127.0.0.1:8080")
    parser.add_argument("--rule", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--workers", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--through-outage",
        action="store_true",
        help="a check answered 503 is a denial, and a release answered 503 leaves the lease "
        "held until it expires (its node's Redis failing over), instead of an error",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    report = asyncio.run(main(parse(sys.argv[1:])))
    sys.stdout.buffer.write(orjson.dumps(report))
