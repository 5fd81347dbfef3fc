"""Envoy's rate-limit service (envoy.service.ratelimit.v3.RateLimitService) on gRPC.

Each descriptor of a ShouldRateLimit request is matched against the descriptors file
(router/envoy_config.py) and checked through the same path as POST /v1/check
(`Router.check`), under a rule named after the matched config path and the limit key
`<domain>|<key>=<value>|...` of the request's entries (docs/envoy.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

import grpc  # type: ignore[import-untyped]
from envoy.service.ratelimit.v3 import (  # type: ignore[import-untyped]
    rls_pb2,
    rls_pb2_grpc,
)

from cluster.model import answers
from cluster.model.errors import ValidationError
from cluster.model.limits import MAX_COUNT, LimitSpec
from router.envoy_config import (
    UNIT_MS,
    DescriptorLimit,
    EnvoyConfigFile,
    Match,
    limit_key,
    match,
    scope_name,
)
from router.metrics import ENVOY_ENDPOINT
from router.requests import CheckRequest
from router.rules import make_rule
from router.service import Router

log = logging.getLogger("shardlimit.envoy")

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
MAX_UINT32 = 2**32 - 1
_UNIT_ENUM = {
    name: rls_pb2.RateLimitResponse.RateLimit.Unit.Value(name.upper()) for name in UNIT_MS
}
_ENUM_UNIT = {number: name for name, number in _UNIT_ENUM.items()}
_WINDOWS = {ms: name for name, ms in UNIT_MS.items()}
GRACE_S = 1.0  # calls in flight get this long to finish when the router stops


class InvalidRequest(ValueError):
    """A request envoyproxy/ratelimit refuses too: answered INVALID_ARGUMENT."""


def _entries(descriptor: Any) -> list[tuple[str, str]]:
    return [(entry.key, entry.value) for entry in descriptor.entries]


def _override(domain: str, descriptor: Any) -> Match:
    """The descriptor's own `limit` (requests_per_unit per unit): it replaces whatever the
    config says, as in envoyproxy/ratelimit (no shadow mode, no replaces)."""
    unit = _ENUM_UNIT.get(descriptor.limit.unit)
    if unit is None:
        raise InvalidRequest("a descriptor limit override needs a unit: SECOND..YEAR")
    count = int(descriptor.limit.requests_per_unit)
    scope = scope_name(domain, [("~override", None)])
    rule = None
    if count > 0:
        spec = LimitSpec("fixed_window", limit=count, window_ms=UNIT_MS[unit])
        rule = make_rule(scope, (spec,), "allow")
    limit = DescriptorLimit(scope, rule, blocked=count == 0, requests_per_unit=count, unit=unit)
    return Match(limit, limit_key(domain, _entries(descriptor)))


def _cost(request: Any, descriptor: Any) -> int:
    """The descriptor's hits_addend (0: check only), else the request's (0 means 1);
    capped at the largest cost a check takes, which no limit can admit either."""
    if descriptor.HasField("hits_addend"):
        return min(int(descriptor.hits_addend.value), MAX_COUNT)
    return min(max(1, int(request.hits_addend)), MAX_COUNT)


def _current_limit(
    limit: DescriptorLimit, spec: LimitSpec | None, row: answers.LimitState | None
) -> Any:
    """The RateLimit shown for a descriptor: the configured requests_per_unit and unit,
    else the reported limit's count and, when its window is one unit, that unit."""
    out = rls_pb2.RateLimitResponse.RateLimit(name=limit.name)
    if limit.requests_per_unit is not None and limit.unit is not None:
        out.requests_per_unit = limit.requests_per_unit
        out.unit = _UNIT_ENUM[limit.unit]
        return out
    out.requests_per_unit = min((row.limit if row is not None else None) or 0, MAX_UINT32)
    if spec is not None:
        unit = spec.period if spec.algorithm == "calendar" else _WINDOWS.get(spec.window_ms)
        if unit in _UNIT_ENUM and spec.algorithm not in ("token_bucket", "leaky_bucket"):
            out.unit = _UNIT_ENUM[unit]
    return out


def _reported(body: answers.Decision) -> int:
    """Which limit of a multi-limit decision a status reports: the first that denied,
    else the one with the fewest remaining."""
    if body.denied_by:
        return body.denied_by[0]
    counts = [row.remaining if row.remaining is not None else MAX_UINT32 for row in body.limits]
    return counts.index(min(counts))


def _status(limit: DescriptorLimit, specs: tuple[LimitSpec, ...], body: answers.Decision) -> Any:
    index = _reported(body)
    row = body.limits[index]
    over = not body.allowed
    status = rls_pb2.RateLimitResponse.DescriptorStatus(
        code=OVER_LIMIT if over and not limit.shadow_mode else OK,
        current_limit=_current_limit(limit, specs[index], row),
        limit_remaining=min(row.remaining or 0, MAX_UINT32),
    )
    if row.reset_after_ms is not None:
        status.duration_until_reset.FromMilliseconds(row.reset_after_ms)
    return status


def _blocked(limit: DescriptorLimit) -> Any:
    """requests_per_unit: 0: over the limit without counting, until the window ends."""
    window = UNIT_MS[limit.unit or "second"]
    status = rls_pb2.RateLimitResponse.DescriptorStatus(
        code=OK if limit.shadow_mode else OVER_LIMIT,
        current_limit=_current_limit(limit, None, None),
        limit_remaining=0,
    )
    status.duration_until_reset.FromMilliseconds(window - int(time.time() * 1000) % window)
    return status


class RateLimitService:
    """The ShouldRateLimit handler (registered with the generated servicer adder)."""

    def __init__(self, router: Router, config: EnvoyConfigFile) -> None:
        self.router = router
        self.config = config
        self.shadow_overrides = 0  # over-limit answers turned OK by shadow_mode

    async def ShouldRateLimit(self, request: Any, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return await self.decide(request)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            elapsed = time.perf_counter() - started
            self.router.metrics.request_seconds(ENVOY_ENDPOINT).observe(elapsed)

    def _limits(self, request: Any) -> list[Match | None]:
        if not request.domain:
            raise InvalidRequest("rate limit domain must not be empty")
        if not request.descriptors:
            raise InvalidRequest("rate limit descriptor list must not be empty")
        domains = self.config.domains
        found: list[Match | None] = []
        for descriptor in request.descriptors:
            if descriptor.HasField("limit") and request.domain in domains:
                found.append(_override(request.domain, descriptor))
            else:
                found.append(match(domains, request.domain, _entries(descriptor)))
        # `replaces`: a matched limit named by another matched limit's replaces is dropped.
        replaced = {name for m in found if m is not None for name in m.limit.replaces}
        return [None if m is not None and m.limit.name in replaced else m for m in found]

    async def decide(self, request: Any) -> Any:
        matches = self._limits(request)
        statuses: list[Any] = [None] * len(matches)
        checks: list[tuple[int, DescriptorLimit, CheckRequest]] = []
        for index, (descriptor, found) in enumerate(zip(request.descriptors, matches, strict=True)):
            if found is None:
                statuses[index] = rls_pb2.RateLimitResponse.DescriptorStatus(code=OK)
                continue
            limit = found.limit
            if limit.unlimited:
                statuses[index] = rls_pb2.RateLimitResponse.DescriptorStatus(
                    code=OK, limit_remaining=MAX_UINT32
                )
                continue
            if limit.blocked:
                statuses[index] = _blocked(limit)
                continue
            rule = limit.rule
            if limit.rule_ref is not None:
                named = self.router.rules.get(limit.rule_ref)
                if named is None:  # a rule since deleted: as if nothing matched
                    log.warning("envoy descriptor names unknown rule '%s'", limit.rule_ref)
                    statuses[index] = rls_pb2.RateLimitResponse.DescriptorStatus(code=OK)
                    continue
                # The named rule under this descriptor's counter scope, options kept.
                rule = dataclasses.replace(named, name=limit.scope)
            assert rule is not None
            check = CheckRequest(
                found.key, rule, _cost(request, descriptor), (0,) * len(rule.limits), None, False
            )
            checks.append((index, limit, check))
        bodies = await asyncio.gather(*(self.router.check(check) for _, _, check in checks))
        for (index, limit, check), body in zip(checks, bodies, strict=True):
            statuses[index] = _status(limit, check.rule.limits, body)
            if limit.shadow_mode and not body.allowed:
                self.shadow_overrides += 1
                self.router.metrics.shadow(check.rule.name).inc()
        over = any(status.code == OVER_LIMIT for status in statuses)
        return rls_pb2.RateLimitResponse(overall_code=OVER_LIMIT if over else OK, statuses=statuses)


class EnvoyListener:
    """The gRPC server on `grpc_port`, and the descriptors file's hot reload."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.config = EnvoyConfigFile(router.config.envoy_config)
        self.service = RateLimitService(router, self.config)
        self.port: int | None = None
        self._server: Any = None
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            self.config.load()
        except (ValidationError, ValueError, OSError) as exc:
            raise SystemExit(f"envoy config rejected: {exc}") from exc
        server = grpc.aio.server()
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(self.service, server)
        settings = self.router.config
        self.port = server.add_insecure_port(f"{settings.host}:{settings.grpc_port}")
        await server.start()
        self._server = server
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        log.info("envoy rate-limit service on %s:%s", settings.host, self.port)

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._server is not None:
            await self._server.stop(GRACE_S)
            self._server = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.router.config.rules_poll_ms / 1000)  # polling cadence
            try:
                errors = self.config.reload_errors
                if self.config.reload_if_changed() and self.config.reload_errors == errors:
                    log.info("envoy config reloaded: %d domains", len(self.config.domains))
            except OSError as exc:
                log.error("envoy config unreadable: %s", exc)
