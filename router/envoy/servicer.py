"""Envoy's rate-limit service (envoy.service.ratelimit.v3.RateLimitService) on gRPC.

Each descriptor of a ShouldRateLimit request is matched against the descriptors file
(router/envoy/descriptors.py) and checked through the same path as POST /v1/check
(`Router.check`); its answer, the overall code and the response headers are built as
envoyproxy/ratelimit builds them (router/envoy/status.py), under the settings it reads
from the environment (router/envoy/settings.py). The listener also serves gRPC health
checking and, with a certificate, TLS (router/envoy/server.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

import grpc  # type: ignore[import-untyped]
import msgspec
import yaml
from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped]

from cluster.model import answers
from cluster.model.errors import ValidationError
from cluster.model.limits import MAX_COUNT
from router.envoy import status as envoy_status
from router.envoy.descriptors import (
    DescriptorLimit,
    EnvoyConfigFile,
    Match,
    ParseOptions,
    limit_key,
    match,
    parse_options,
    rate_limit_rule,
    scope_name,
)
from router.envoy.metadata import add_metadata
from router.envoy.server import GrpcServer
from router.envoy.settings import EnvoySettings
from router.envoy.status import OK, OVER_LIMIT, DescriptorOutcome
from router.envoy.yaml_checks import MAX_UINT32
from router.errors import InvalidRequest, ServiceError, SettingsError
from router.metrics import ENVOY_ENDPOINT
from router.requests import CheckRequest
from router.rules.rejection import yaml_cause
from router.service import Router

log = logging.getLogger("shardlimit.envoy")
_ENUM_UNIT = {number: name for name, number in envoy_status.UNIT_ENUM.items()}
MATCH_CACHE = 65_536  # (domain, entries) matches kept; all dropped when full


def _entries(descriptor: Any) -> list[tuple[str, str]]:
    return [(entry.key, entry.value) for entry in descriptor.entries]


def _override(domain: str, descriptor: Any, options: ParseOptions) -> Match:
    """The descriptor's own `limit` replaces whatever the config says (no shadow mode,
    no replaces), on the descriptor's own counter: the domain's scope, the entries and
    the unit's window, as envoyproxy/ratelimit's cache key."""
    unit = _ENUM_UNIT.get(descriptor.limit.unit)
    if unit is None:
        raise InvalidRequest("a descriptor limit override needs a unit: SECOND..YEAR")
    count = int(descriptor.limit.requests_per_unit)
    scope = scope_name(domain, [])
    rule = rate_limit_rule(scope, count, unit, options) if count > 0 else None
    stats_key = ".".join(entry.key for entry in descriptor.entries)
    limit = DescriptorLimit(
        scope, rule, stats_key=stats_key, blocked=count == 0, requests_per_unit=count, unit=unit
    )
    return Match(limit, limit_key(domain, _entries(descriptor)))


def _hits(request: Any, descriptor: Any) -> int:
    """The descriptor's hits_addend (0: check only), else the request's (0 means 1);
    capped at the largest cost a check takes, which no limit can admit either."""
    if descriptor.HasField("hits_addend"):
        return min(int(descriptor.hits_addend.value), MAX_COUNT)
    return min(max(1, int(request.hits_addend)), MAX_COUNT)


class RateLimitService:
    """The ShouldRateLimit handler (registered with the generated servicer adder)."""

    def __init__(self, router: Router, config: EnvoyConfigFile, settings: EnvoySettings) -> None:
        self.router = router
        self.config = config
        self.settings = settings
        self.shadow_overrides = 0  # over-limit answers turned OK by shadow_mode
        # The match of each (domain, entries) seen, for the descriptors file loaded
        # (`_domains`): a request's descriptors are looked up once, not level by level.
        self._matches: dict[tuple[str, tuple[tuple[str, str], ...]], Match | None] = {}
        self._domains: dict[str, Any] | None = None
        # Each (domain, stat key)'s counters, in STAT_NAMES' order.
        self._stats: dict[tuple[str, str], list[Any]] = {}

    async def ShouldRateLimit(self, request: Any, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return await self.decide(request)
        except ServiceError as exc:
            await context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            elapsed = time.perf_counter() - started
            self.router.metrics.request_seconds(ENVOY_ENDPOINT).observe(elapsed)

    def _limits(self, request: Any) -> list[Match | None]:
        if not request.domain:
            raise ServiceError("rate limit domain must not be empty")
        if not request.descriptors:
            raise ServiceError("rate limit descriptor list must not be empty")
        domains = self.config.domains
        if domains is not self._domains:  # (re)loaded: what was matched may differ now
            self._matches, self._domains = {}, domains
        matches = self._matches
        domain = request.domain
        found: list[Match | None] = []
        for descriptor in request.descriptors:
            if descriptor.HasField("limit") and domain in domains:
                found.append(_override(domain, descriptor, self.config.options))
                continue
            entries = tuple([(entry.key, entry.value) for entry in descriptor.entries])
            key = (domain, entries)
            if key in matches:
                found.append(matches[key])
                continue
            if len(matches) >= MATCH_CACHE:
                matches.clear()
            found.append(matches.setdefault(key, match(domains, domain, list(entries))))
        # `replaces`: a matched limit named by another matched limit's replaces is dropped.
        replaced = {name for m in found if m is not None for name in m.limit.replaces}
        return [
            None if m is not None and m.limit.name and m.limit.name in replaced else m
            for m in found
        ]

    def _check(
        self, found: Match, hits: int, status: Any
    ) -> CheckRequest | DescriptorOutcome | None:
        """The check a matched descriptor needs, its answer (written into `status`) when
        no node is asked, or None when a `rule:` names a rule since deleted (as if
        nothing matched)."""
        limit = found.limit
        if limit.blocked:
            return envoy_status.blocked(status, limit, hits)
        rule = limit.rule
        if limit.rule_ref is not None:
            named = self.router.rules.get(limit.rule_ref)
            if named is None:
                log.warning("envoy descriptor names unknown rule '%s'", limit.rule_ref)
                return None
            # The named rule under this descriptor's counter scope, options kept.
            rule = dataclasses.replace(named, name=limit.scope)
        assert rule is not None
        return CheckRequest(found.key, rule, hits, (0,) * len(rule.limits), None, False)

    async def decide(self, request: Any) -> Any:
        matches = self._limits(request)
        # Each status is made in the response and filled there (not copied into it).
        response = rls_pb2.RateLimitResponse()
        add_status = response.statuses.add
        statuses = [add_status(code=OK) for _ in matches]
        quota_modes: list[bool | None] = [False] * len(matches)
        checks: list[tuple[int, DescriptorLimit, CheckRequest]] = []
        blocked_over = False  # a requests_per_unit 0 descriptor was hit
        for index, (descriptor, found) in enumerate(zip(request.descriptors, matches, strict=True)):
            if found is None:
                continue
            limit = found.limit
            if limit.unlimited:
                statuses[index].limit_remaining = MAX_UINT32
                quota_modes[index] = None
                continue
            quota_modes[index] = limit.quota_mode
            hits = _hits(request, descriptor)
            check = self._check(found, hits, statuses[index])
            if check is None:
                continue
            if isinstance(check, DescriptorOutcome):
                self._record(request.domain, limit, check)
                blocked_over = blocked_over or check.over
            else:
                checks.append((index, limit, check))
        decided = await self._run([check for _, _, check in checks], blocked_over)
        for (index, limit, check), (body, withheld) in zip(checks, decided, strict=True):
            outcome = envoy_status.checked(
                statuses[index], limit, check.rule.limits, body, check.cost, self.settings, withheld
            )
            self._record(request.domain, limit, outcome)
            if limit.shadow_mode and outcome.over:
                self.router.metrics.shadow(check.rule.name).inc()
        code, least = envoy_status.overall(statuses, quota_modes, self.settings)
        response.overall_code = code
        if self.settings.response_headers and least is not None:
            envoy_status.add_headers(response, least, self.settings)
        if code == OVER_LIMIT and self.settings.global_shadow_mode:
            response.overall_code = OK
            self.router.metrics.envoy_global_shadow().inc()
        if self.settings.dynamic_metadata:
            passed = [
                None if m is None else m.limit.metadata
                for m, status, quota_mode in zip(matches, statuses, quota_modes, strict=True)
                if quota_mode is not None and status.code != OVER_LIMIT
            ]
            add_metadata(response, request, passed)
        return response

    async def _run(
        self, checks: list[CheckRequest], blocked_over: bool
    ) -> list[tuple[answers.Decision, bool]]:
        """The decisions of a request's checks, each with whether it was withheld. With
        STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, as upstream, a descriptor over its limit
        keeps the request's other descriptors from being counted: the checks are read
        first, and run as one all-or-nothing batch only when none is over (next to a
        requests_per_unit 0 hit, or one read over, the reads are the answer), and a
        check admitted but not counted so is withheld."""
        stop = self.settings.stop_increment_when_over_limit
        if blocked_over and stop:
            checks = [msgspec.structs.replace(check, dry_run=True) for check in checks]
        if len(checks) > 1:
            spread = any(check.rule.spread > 1 for check in checks)
            together = stop and not blocked_over and not spread
            if together:
                # Read first, as upstream does: a request with a descriptor already over
                # is answered from the reads and holds nothing. Held, its other
                # descriptors' units would deny concurrent requests until its rollback.
                reads = [msgspec.structs.replace(check, dry_run=True) for check in checks]
                read = (await self.router.batch(reads, False)).results
                if not all(body.allowed for body in read):
                    return [(body, body.allowed) for body in read]
            bodies = (await self.router.batch(checks, together)).results
        elif checks:  # one check: the path of POST /v1/check (as a batch of one decides)
            bodies = [await self.router.check(checks[0])]
        else:
            bodies = []
        return [
            (body, stop and (body.rolled_back is True or (blocked_over and body.allowed)))
            for body in bodies
        ]

    def _record(self, domain: str, limit: DescriptorLimit, outcome: DescriptorOutcome) -> None:
        """Count a descriptor's stats (domain and config key, never a value)."""
        if limit.shadow_mode and outcome.over:
            self.shadow_overrides += 1
        counters = self._stats.get((domain, limit.stats_key))
        if counters is None:  # every series exists from the first hit
            stats = self.router.metrics.envoy_stats
            counters = [stats[name](domain, limit.stats_key) for name in envoy_status.STAT_NAMES]
            self._stats[domain, limit.stats_key] = counters
        for counter, hits in zip(counters, outcome.stats, strict=True):
            if hits:
                counter.inc(hits)


class EnvoyListener:
    """The gRPC server on `grpc_port`, and the descriptors file's hot reload."""

    def __init__(self, router: Router) -> None:
        self.router = router
        try:
            self.settings = EnvoySettings.from_env()
        except SettingsError as exc:
            raise SettingsError(f"envoy settings rejected: {exc}") from exc
        self.config = EnvoyConfigFile(router.config.envoy_config, parse_options(self.settings))
        router.metrics.attach_envoy_config(self.config)
        self.service = RateLimitService(router, self.config, self.settings)
        self.server = GrpcServer(router.config, self.settings, self.service)
        self.port: int | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            self.config.load()
        except yaml.YAMLError as exc:
            assert self.config.path is not None  # only a file read can fail to parse
            raise SettingsError(
                f"envoy config rejected: {yaml_cause(self.config.path, exc)}"
            ) from exc
        except (ValidationError, ValueError, OSError) as exc:
            raise SettingsError(f"envoy config rejected: {exc}") from exc
        self.port = await self.server.start(len(self.config.domains))
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        host = self.router.config.host
        log.info("envoy rate-limit service on %s:%s%s", host, self.port, self.server.describe())

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self.server.stop()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.router.config.rules_poll_ms / 1000)  # polling cadence
            try:
                errors = self.config.reload_errors
                if self.config.reload_if_changed() and self.config.reload_errors == errors:
                    log.info("envoy config reloaded: %d domains", len(self.config.domains))
                    await self.server.config_loaded(len(self.config.domains))
            except OSError as exc:
                log.error("envoy config unreadable: %s", exc)
