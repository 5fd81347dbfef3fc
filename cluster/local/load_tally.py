"""The load generator's count of one run: every answer, allowed, denied or degraded (by
key and reason), errors with a few samples, latencies; and the JSON summary it prints."""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from cluster.local.load_http import LoadConfig

REASON_CHARS = 80
MAX_ERROR_SAMPLES = 10


@dataclass
class Tally:
    per_key: bool
    status: Counter[int] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    by_key: Counter[str] = field(default_factory=Counter)
    latencies: array[float] = field(default_factory=lambda: array("d"))
    answered: int = 0
    allowed: int = 0
    denied: int = 0
    degraded: int = 0
    degraded_allowed: int = 0
    errors: int = 0
    samples: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.samples) < MAX_ERROR_SAMPLES:
            self.samples.append(text[:300])

    def answer(self, status: int, body: bytes, latency_s: float) -> None:
        self.answered += 1
        self.status[status] += 1
        self.latencies.append(latency_s)
        if status not in (200, 429):
            self.error(f"status {status}: {body[:200]!r}")
            return
        try:
            decision = orjson.loads(body)
            self._decision(bool(decision["allowed"]), decision)
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            self.error(f"status {status}, unreadable body ({type(exc).__name__}): {body[:200]!r}")

    def _decision(self, allowed: bool, decision: dict[str, Any]) -> None:
        degraded = bool(decision.get("degraded", False))
        if allowed:
            self.allowed += 1
        else:
            self.denied += 1
        if degraded:
            self.degraded += 1
            self.degraded_allowed += allowed
            self.reasons[str(decision.get("degraded_reason") or "")[:REASON_CHARS]] += 1
        elif allowed and self.per_key:
            self.by_key[str(decision["key"])] += 1

    def summary(self, config: LoadConfig, sent: int, elapsed_s: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": sent,
            "answered": self.answered,
            "connections": config.connections,
            "elapsed_s": round(elapsed_s, 4),
            "rate_per_s": round(self.answered / elapsed_s, 1) if elapsed_s > 0 else 0.0,
            "status": {str(code): n for code, n in sorted(self.status.items())},
            "allowed": self.allowed,
            "denied": self.denied,
            "degraded": self.degraded,
            "degraded_allowed": self.degraded_allowed,
            "degraded_reasons": dict(self.reasons.most_common()),
            "errors": self.errors,
            "error_samples": self.samples,
            "latency_ms": latency_summary(self.latencies),
        }
        if config.per_key:
            out["allowed_by_key"] = dict(sorted(self.by_key.items()))
        return out


def latency_summary(latencies: array[float]) -> dict[str, float | None]:
    ordered = sorted(latencies)

    def at(q: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {"p50": at(0.5), "p99": at(0.99), "p999": at(0.999), "max": at(1.0)}
