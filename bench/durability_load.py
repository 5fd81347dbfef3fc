"""The load of `bench.durability`'s failovers: checks from a process of its own.

Closed loop, paced: `--connections` keep-alive HTTP/1.1 connections to the router (asyncio
streams, uvloop when importable), each sending `POST /v1/check` for the next key of the
spec round robin and waiting for its answer, at most `--rate` checks/s in all. The spec
file (JSON) names classes of keys, each with its rule:

    {"replica": {"rule": "dur-fo-replica", "keys": ["a:1", ...]}, "primary": {...}}

The driver talks to it over stdin and stdout, one line each way:

    in:  kill <t>        t: time.monotonic() of a SIGKILL (CLOCK_MONOTONIC, shared by
                         every process of the machine)
    out: recovered <n> <class> <seconds>
                         the first answer that was not degraded, to a check of that class
                         *sent* at or after kill n's t, came <seconds> after t (each class
                         once per kill; a check sent before the kill and answered normally
                         after it proves nothing about the failover)
    in:  stop            send nothing more; once the answers in flight are in:
    out: result {...}    per key: admitted (allowed, not degraded), degraded, denied,
                         unknown (no answer: timed out or the connection failed, so the
                         counter may or may not hold it); per class and kill: degraded
                         answers between the kill and the first normal one; degraded
                         answers by class and reason

    python -m bench.durability_load --router URL --spec FILE [--connections 16] [--rate 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit


@dataclass
class Watch:
    """One kill: when, and which classes answered normally since."""

    number: int
    at: float
    recovered: dict[str, float] = field(default_factory=dict)
    degraded: Counter[str] = field(default_factory=Counter)


@dataclass
class Tally:
    admitted: Counter[str] = field(default_factory=Counter)
    degraded: Counter[str] = field(default_factory=Counter)
    denied: Counter[str] = field(default_factory=Counter)
    unknown: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, Counter[str]] = field(default_factory=dict)  # class -> reason -> n
    errors: list[str] = field(default_factory=list)
    answered: int = 0
    watches: list[Watch] = field(default_factory=list)

    def error(self, key: str, text: str) -> None:
        self.unknown[key] += 1
        if len(self.errors) < 10:
            self.errors.append(text[:300])


class Loader:
    def __init__(self, router: str, spec: dict[str, Any], connections: int, rate: float) -> None:
        parts = urlsplit(router)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        per_class: list[list[tuple[str, str, bytes]]] = []
        for name, entry in spec.items():
            per_class.append([])
            for key in entry["keys"]:
                body = json.dumps({"key": key, "rule": entry["rule"]}).encode()
                head = (
                    f"POST /v1/check HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                )
                per_class[-1].append((name, key, head.encode() + body))
        # (class, key, HTTP request), the classes interleaved: key i of each in turn.
        self.checks = [c for row in itertools.zip_longest(*per_class) for c in row if c]
        self.connections = connections
        self.interval = connections / rate if rate > 0 else 0.0
        self.timeout = 10.0
        self.next = 0
        self.running = True
        self.tally = Tally()

    def _claim(self) -> tuple[str, str, bytes] | None:
        if not self.running:
            return None
        check = self.checks[self.next % len(self.checks)]
        self.next += 1
        return check

    async def _slot(self) -> None:
        stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while (check := self._claim()) is not None:
            started = time.monotonic()
            name, key, payload = check
            try:
                if stream is None:
                    stream = await asyncio.wait_for(
                        asyncio.open_connection(self.host, self.port), self.timeout
                    )
                sent = time.monotonic()
                stream[1].write(payload)
                status, body = await asyncio.wait_for(_answer(stream[0]), self.timeout)
                self._answer(name, key, sent, status, body)
            except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
                self.tally.error(key, f"{type(exc).__name__}: {exc}")
                if stream is not None:
                    stream[1].close()
                stream = None
                await asyncio.sleep(0.05)
            pause = self.interval - (time.monotonic() - started)
            if pause > 0:
                await asyncio.sleep(pause)
        if stream is not None:
            stream[1].close()

    def _answer(self, name: str, key: str, sent: float, status: int, body: bytes) -> None:
        now = time.monotonic()
        self.tally.answered += 1
        if status not in (200, 429):
            self.tally.error(key, f"status {status}: {body[:200]!r}")
            return
        decision = json.loads(body)
        if decision.get("degraded"):
            self.tally.degraded[key] += 1
            reason = str(decision.get("degraded_reason") or "")[:80]
            self.tally.reasons.setdefault(name, Counter())[reason] += 1
            for watch in self.tally.watches:
                if sent >= watch.at and name not in watch.recovered:
                    watch.degraded[name] += 1
            return
        if decision.get("allowed"):
            self.tally.admitted[key] += 1
        else:
            self.tally.denied[key] += 1
        for watch in self.tally.watches:
            if sent >= watch.at and name not in watch.recovered:
                watch.recovered[name] = round(now - watch.at, 4)
                _say(f"recovered {watch.number} {name} {watch.recovered[name]}")

    def command(self, line: str) -> None:
        words = line.split()
        if words[:1] == ["kill"] and len(words) == 2:
            watch = Watch(len(self.tally.watches), float(words[1]))
            self.tally.watches.append(watch)
        elif words[:1] == ["stop"] or not words:
            self.running = False

    async def _commands(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while self.running:
            line = await reader.readline()
            self.command(line.decode() if line else "stop")

    async def run(self) -> dict[str, Any]:
        commands = asyncio.create_task(self._commands())
        started = time.monotonic()
        await asyncio.gather(*(self._slot() for _ in range(self.connections)))
        commands.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await commands
        t = self.tally
        return {
            "elapsed_s": round(time.monotonic() - started, 2),
            "answered": t.answered,
            "admitted": dict(t.admitted),
            "degraded": dict(t.degraded),
            "denied": dict(t.denied),
            "unknown": dict(t.unknown),
            "degraded_reasons": {name: dict(c.most_common()) for name, c in t.reasons.items()},
            "error_samples": t.errors,
            "kills": [
                {"recovered_s": w.recovered, "degraded_before_recovery": dict(w.degraded)}
                for w in t.watches
            ],
        }


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    return status, await reader.readexactly(length)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _runner() -> Callable[[Any], Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return cast(Callable[[Any], Any], uvloop.run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.durability_load", description=__doc__)
    parser.add_argument("--router", required=True)
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rate", type=float, default=1000.0, help="checks/s at most, in all")
    args = parser.parse_args(argv)
    loader = Loader(args.router, json.loads(args.spec.read_text()), args.connections, args.rate)
    result = _runner()(loader.run())
    _say("result " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
