"""Steady checks of a few keys, run in their own process (never in the pytest process):

    python -m tests.support.check_load --url http://127.0.0.1:8080 --rule stock \\
        --keys sku:1,sku:2 --workers 8 --seconds 10

Each of `workers` asyncio tasks checks the keys in turn, one check at a time, for
`seconds`, with a pause of `--pause-ms` between two checks, each with a request_id of its
own. It prints one JSON object: every answer as [sent at, answered at (both
CLOCK_MONOTONIC, shared by every process of the host), key, allowed (0/1), degraded
(0/1), request_id], and any error. A test compares the admitted checks of each key with
what the cluster holds for it afterwards, once `admitted` sent each degraded check again
under its request_id, as a client would: a check that did reach its counter before its
node was lost is replayed, one that did not is decided now.

Tests start it with `start_checks` and read its report with `checks_report`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[2]


async def _worker(
    http: aiohttp.ClientSession, args: argparse.Namespace, offset: int, answers: list[list[Any]]
) -> None:
    keys = args.keys.split(",")
    until = time.monotonic() + args.seconds
    turn = offset
    while time.monotonic() < until:
        key = keys[turn % len(keys)]
        turn += 1
        request_id = f"{os.getpid()}-{offset}-{turn}"
        sent = time.monotonic()
        check = {"key": key, "rule": args.rule, "request_id": request_id}
        async with http.post(args.url + "/v1/check", json=check) as resp:
            body = await resp.json()
        if resp.status not in (200, 429, 503):
            raise AssertionError(f"check of {key}: {resp.status} {body}")
        allowed, degraded = int(bool(body["allowed"])), int(bool(body.get("degraded")))
        answers.append([sent, time.monotonic(), key, allowed, degraded, request_id])
        await asyncio.sleep(args.pause_ms / 1000)  # the load's pace


async def main(args: argparse.Namespace) -> dict[str, Any]:
    answers: list[list[Any]] = []
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        outcomes = await asyncio.gather(
            *(_worker(http, args, offset, answers) for offset in range(args.workers)),
            return_exceptions=True,
        )
    errors = [repr(o) for o in outcomes if isinstance(o, BaseException)]
    return {"answers": answers, "errors": errors[:5]}


async def start_checks(
    url: str, rule: str, keys: list[str], *, workers: int, seconds: float, pause_ms: float = 5
) -> asyncio.subprocess.Process:
    """This module in a child process (never in the caller's), its report on stdout."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.check_load",
        *("--url", url, "--rule", rule, "--keys", ",".join(keys)),
        *("--workers", str(workers), "--seconds", str(seconds), "--pause-ms", str(pause_ms)),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def checks_report(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise AssertionError(err.decode()[-3000:])
    report: dict[str, Any] = orjson.loads(out)
    return report


async def admitted(
    http: aiohttp.ClientSession, url: str, rule: str, answers: list[list[Any]]
) -> Counter[str]:
    """Admissions per key: the load's normal ones, and each degraded check sent again
    under its request_id now that its node answers (replayed if it had been applied)."""
    found: Counter[str] = Counter(a[2] for a in answers if a[3] and not a[4])
    for _, _, key, _, degraded, request_id in answers:
        if not degraded:
            continue
        check = {"key": key, "rule": rule, "request_id": request_id}
        async with http.post(url + "/v1/check", json=check) as resp:
            body = await resp.json()
        if body.get("degraded"):
            raise AssertionError(f"{key} still answered degraded: {body}")
        found[key] += int(bool(body["allowed"]))
    return found


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.support.check_load")
    parser.add_argument("--url", required=True, help="the router, e.g. http://127.0.0.1:8080")
    parser.add_argument("--rule", required=True)
    parser.add_argument("--keys", required=True, help="comma-separated")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--pause-ms", type=float, default=5)
    return parser.parse_args(argv)


if __name__ == "__main__":
    report = asyncio.run(main(parse(sys.argv[1:])))
    sys.stdout.buffer.write(orjson.dumps(report))
