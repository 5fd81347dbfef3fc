"""The router's Prometheus metrics (prometheus-client), in a registry of its own.

Hot-path series (decisions, latencies, batch sizes) are lock-free children created once
per label values (cluster/web/metrics.py). Everything the router already keeps as plain
state (node clients' counters, breakers, topology, rules, migration progress) is read only
when scraped, by `_StateCollector`.

Cardinality is bounded: `rule` is a rule's name (a configured rule, an Envoy descriptor
scope, or `~inline` for inline limits), never a limit key; `node` is a node id;
`endpoint` is a route template.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cluster import wire
from cluster.model.algorithms import NONE
from cluster.web.metrics import Families
from router.channel.shard_client import ShardClient
from router.control.cluster_view import ClusterView
from router.control.resharding import Resharder
from router.requests import CheckRequest
from router.rules.book import RuleBook
from router.rules.watched_file import WatchedFile

__all__ = [
    "BATCH_OPS_BUCKETS",
    "ENVOY_ENDPOINT",
    "LATENCY_BUCKETS",
    "NEAR_LIMIT_RATIO",
    "RouterMetrics",
    "near_limit",
]

# Seconds: a check takes well under a millisecond on a healthy cluster, a degraded one
# up to the node deadline plus its margin.
LATENCY_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
BATCH_OPS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# A decision is near its limit once this share of some limit is used (envoyproxy/ratelimit's
# near_limit, same ratio).
NEAR_LIMIT_RATIO = 0.8
ENVOY_ENDPOINT = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
UNMATCHED_ENDPOINT = "unmatched"
ENVOY_STATS = {
    "total_hits": "every hit",
    "over_limit": "hits over the limit",
    "over_limit_with_local_cache": "hits over the limit answered by the denial cache",
    "near_limit": "hits over the near-limit ratio but within the limit",
    "within_limit": "hits within the limit",
    "shadow_mode": "hits over the limit answered OK by shadow_mode",
}


def _near(limit: int, left: int) -> bool:
    return limit > 0 and left != NONE and limit - left >= NEAR_LIMIT_RATIO * limit


def near_limit(rows: Sequence[wire.LimitRow]) -> bool:
    """Whether any limit of a decision (count or amount) has NEAR_LIMIT_RATIO of it used."""
    for row in rows:
        if _near(row.limit, row.remaining) or _near(row.max_amount, row.amount_remaining):
            return True
    return False


def decision_outcome(request: CheckRequest, result: wire.Checked) -> tuple[str, bool]:
    """How a node's decision is counted: its outcome label, and whether it consumed up
    to near a limit."""
    if not result.allowed:
        return "denied", False
    consumed = (request.cost > 0 or any(request.amounts)) and not request.dry_run
    rows = result.limits
    if request.rule.leases:  # a concurrency row is no count (node/store/lua/concurrency.lua)
        at = request.rule.lease_at  # a rule's only one
        rows = rows[:at] + rows[at + 1 :] if len(rows) > 1 else []
    return "allowed", consumed and not result.replayed and near_limit(rows)


def lease_outcome(request: CheckRequest, result: wire.Checked) -> str | None:
    """The lease event of a check of a rule with a concurrency limit (None: no event)."""
    if request.dry_run or request.cost == 0 or result.replayed:
        return None
    return "acquired" if result.allowed else "denied"


class DecisionTally:
    """Node decisions of one client batch, counted as RouterMetrics.checked counts them
    one by one, with one increment per rule and outcome."""

    __slots__ = ("counts", "leases")

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.leases: list[tuple[str, str]] = []

    def add(self, request: CheckRequest, result: wire.Checked) -> None:
        outcome, near = decision_outcome(request, result)
        counts = self.counts
        rule = request.rule.name
        counts[rule, outcome] = counts.get((rule, outcome), 0) + 1
        if near:
            counts[rule, ""] = counts.get((rule, ""), 0) + 1
        if request.rule.leases:
            event = lease_outcome(request, result)
            if event is not None:
                self.leases.append((rule, event))

    def count(self, metrics: RouterMetrics) -> None:
        for rule, event in self.leases:
            metrics.lease_event(rule, event)
        for (rule, outcome), count in self.counts.items():
            if outcome:
                metrics.decisions(rule, outcome).inc(count)
            else:
                metrics.near_limit(rule).inc(count)


class RouterMetrics:
    """Every series of one router. Adding a counter is one line in __init__, e.g.
    `self.cache_hits = families.counter("shardlimit_cache_hits_total", "Help.", "rule")`,
    counted with `metrics.cache_hits(rule).inc()` (no labels: `metrics.cache_hits().inc()`).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        families = Families(self.registry)
        self.decisions = families.counter(
            "shardlimit_decisions_total",
            "Check decisions by rule and outcome (allowed, denied, degraded_allowed, "
            "degraded_denied).",
            "rule",
            "outcome",
        )
        self.degraded = families.counter(
            "shardlimit_degraded_decisions_total",
            "Degraded decisions (the rule's on_failure applied) by rule and reason.",
            "rule",
            "reason",
        )
        self.near_limit = families.counter(
            "shardlimit_near_limit_decisions_total",
            "Allowed decisions that consumed and left some limit at least 80% used.",
            "rule",
        )
        self.shadow = families.counter(
            "shardlimit_shadow_decisions_total",
            "Denials answered OK because their rule (or Envoy limit) is in shadow mode.",
            "rule",
        )
        self.denial_cache_hits = families.counter(
            "shardlimit_denial_cache_hits_total",
            "Denials the router answered from its cache (cache_denials), no node call.",
            "rule",
        )
        self.leases = families.counter(
            "shardlimit_lease_events_total",
            "Leases of concurrency limits by rule and event: acquired, denied (checks), "
            "renewed, released, not_found (renewals and releases of a lease not held).",
            "rule",
            "event",
        )
        self.errors = families.counter(
            "shardlimit_error_responses_total",
            "Problem responses (status >= 400, 429 aside) by status.",
            "status",
        )
        self.request_seconds = families.histogram(
            "shardlimit_request_duration_seconds",
            "Router requests from handler start to response, by endpoint (route template).",
            LATENCY_BUCKETS,
            "endpoint",
        )
        self.node_round_trip_seconds = families.histogram(
            "shardlimit_node_round_trip_seconds",
            "Batch requests to a node, sent to answered (answers of any status).",
            LATENCY_BUCKETS,
            "node",
        )
        self.node_batch_ops = families.histogram(
            "shardlimit_node_batch_ops",
            "Ops per batch request sent to a node (coalesced checks).",
            BATCH_OPS_BUCKETS,
            "node",
        )

        # The Envoy service's per-descriptor stats, named as envoyproxy/ratelimit's
        # `ratelimit.service.rate_limit.<domain>.<key>.<stat>`: `key` is the config path
        # (`message_type_marketing.to_number`), never a request's value.
        self.envoy_stats = {
            stat: families.counter(
                f"ratelimit_service_rate_limit_{stat}_total",
                f"Envoy descriptor hits: {help_text}.",
                "domain",
                "key",
            )
            for stat, help_text in ENVOY_STATS.items()
        }
        self.envoy_global_shadow = families.counter(
            "ratelimit_service_global_shadow_mode_total",
            "Envoy requests answered OK by the global shadow mode (SHADOW_MODE).",
        )

    def attach(self, view: ClusterView, rules: RuleBook, resharder: Resharder) -> None:
        """Read the router's state at each scrape."""
        self.registry.register(_StateCollector(view, rules, resharder))

    def attach_envoy_config(self, config: WatchedFile) -> None:
        """Count the Envoy descriptors file's loads at each scrape."""
        self.registry.register(_EnvoyConfigCollector(config))

    def watch_client(self, client: ShardClient) -> None:
        """Observe a node client's batches (called for each node client a router makes)."""
        node = client.spec.id
        for endpoint in client.endpoints:
            endpoint.queue.on_batch = self.node_batch_ops(node).observe
            endpoint.outcomes.on_round_trip = self.node_round_trip_seconds(node).observe

    def checked(self, request: CheckRequest, result: wire.Checked) -> None:
        """Count a decision a node made."""
        rule = request.rule.name
        outcome, near = decision_outcome(request, result)
        self.decisions(rule, outcome).inc()
        if near:
            self.near_limit(rule).inc()
        if request.rule.leases:
            event = lease_outcome(request, result)
            if event is not None:
                self.lease_event(rule, event)

    def lease_event(self, rule: str, event: str) -> None:
        """Count a lease event of a concurrency limit (`leases`' help names them)."""
        self.leases(rule, event).inc()

    def cached_denial(self, request: CheckRequest) -> None:
        """Count a denial answered from the router's denial cache."""
        rule = request.rule.name
        self.decisions(rule, "denied").inc()
        self.denial_cache_hits(rule).inc()

    def degraded_decision(self, request: CheckRequest, reason: str, allowed: bool) -> None:
        """Count a decision made up with the rule's on_failure."""
        rule = request.rule.name
        self.decisions(rule, "degraded_allowed" if allowed else "degraded_denied").inc()
        self.degraded(rule, reason).inc()

    def responded(self, endpoint: str, status: int, seconds: float) -> None:
        self.request_seconds(endpoint).observe(seconds)
        if status >= 400 and status != 429:
            self.errors(str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def count(self, name: str, **labels: str) -> float:
        """The sum of the samples `name` whose labels include `labels` (0 if none).
        A full collection: for tests and tools, not for the hot path."""
        total = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    total += sample.value
        return total

    def served(self, endpoint: str) -> int:
        """Requests answered on `endpoint` (a route template), for tests and tools."""
        return int(self.count("shardlimit_request_duration_seconds_count", endpoint=endpoint))


def endpoint_of(request: web.Request) -> str:
    """A request's endpoint label: its route's template, never its path."""
    resource = request.match_info.route.resource
    return UNMATCHED_ENDPOINT if resource is None else resource.canonical


# Per node client, read at scrape time: (metric, kind, help, value).
_NODE_SERIES: tuple[tuple[str, str, str, Callable[[ShardClient], float]], ...] = (
    ("shardlimit_node_up", "gauge", "1 if the router sends the node checks (breaker closed).",
     lambda c: int(c.state == "up")),
    ("shardlimit_node_breaker_open", "gauge",
     "1 while the router's breaker for the node is open: its checks fail at once, unsent.",
     lambda c: int(c.breaker.is_open)),
    ("shardlimit_node_breaker_opened", "counter", "Times the node was marked down.",
     lambda c: c.breaker.opened),
    ("shardlimit_node_requests", "counter", "Batch requests sent to the node.",
     lambda c: c.requests),
    ("shardlimit_node_ops", "counter", "Ops sent to the node in batches.", lambda c: c.ops),
    ("shardlimit_node_failures", "counter",
     "Batches that failed: refused, reset, 503, bad answer or no answer.", lambda c: c.failures),
    ("shardlimit_node_timeouts", "counter",
     "Batches with no answer by their deadline plus the margin.", lambda c: c.timeouts),
    ("shardlimit_node_expired", "counter",
     "Ops the node answered `expired` (not applied; sent again while the node is up).",
     lambda c: c.expired),
    ("shardlimit_node_overloaded", "counter", "Checks refused because the node's queue was full.",
     lambda c: c.overloaded),
    ("shardlimit_node_late_undos", "counter",
     "Checks of answers that came after the router gave up, taken back.",
     lambda c: c.late_undos),
    ("shardlimit_node_late_undo_failures", "counter",
     "Late checks that could not be taken back (they stay consumed).",
     lambda c: c.late_undo_failures),
    ("shardlimit_node_inflight_requests", "gauge", "Batch requests in flight now.",
     lambda c: c.inflight),
    ("shardlimit_node_queued_ops", "gauge", "Ops waiting for the next batch now.",
     lambda c: c.queued),
)  # fmt: skip


_Family = CounterMetricFamily | GaugeMetricFamily


def _family(name: str, kind: str, help_text: str, labels: Sequence[str] = ()) -> _Family:
    if kind == "counter":
        return CounterMetricFamily(name, help_text, labels=labels)
    return GaugeMetricFamily(name, help_text, labels=labels)


def _single(name: str, kind: str, help_text: str, value: float) -> _Family:
    family = _family(name, kind, help_text)
    family.add_metric([], value)
    return family


def _reloads(name: str, help_text: str, watched: WatchedFile) -> Metric:
    family = CounterMetricFamily(name, help_text, labels=["result"])
    family.add_metric(["ok"], watched.reloads)
    family.add_metric(["error"], watched.reload_errors)
    return family


class _EnvoyConfigCollector(Collector):
    def __init__(self, config: WatchedFile) -> None:
        self.config = config

    def collect(self) -> Iterator[Metric]:
        yield _reloads(
            "shardlimit_envoy_config_reloads",
            "Envoy descriptors file loads (start, change) by result.",
            self.config,
        )


class _StateCollector(Collector):
    def __init__(self, view: ClusterView, rules: RuleBook, resharder: Resharder) -> None:
        self.view = view
        self.rules = rules
        self.resharder = resharder

    def collect(self) -> Iterator[Metric]:
        clients = sorted(self.view.clients.items())
        for name, kind, help_text, value in _NODE_SERIES:
            family = _family(name, kind, help_text, ["node"])
            for node_id, client in clients:
                family.add_metric([node_id], value(client))
            yield family
        view, book = self.view, self.rules
        yield _single(
            "shardlimit_topology_epoch",
            "gauge",
            "The topology epoch this router serves.",
            view.topology.epoch,
        )
        yield _single(
            "shardlimit_moved_retries",
            "counter",
            "Checks re-routed after a moved answer.",
            view.moved_retries,
        )
        yield _single("shardlimit_rules", "gauge", "Rules this router serves.", len(book.rules))
        yield _single(
            "shardlimit_rules_version",
            "gauge",
            "The cluster rules version this router serves.",
            book.version,
        )
        file_version = -1 if book.file_version is None else book.file_version
        yield _single(
            "shardlimit_rules_file_version",
            "gauge",
            "The version the rules file names (-1: none).",
            file_version,
        )
        yield _reloads(
            "shardlimit_rules_reloads", "Rules file loads (start, change, SIGHUP) by result.", book
        )
        yield from self._migration()

    def _migration(self) -> Iterator[Metric]:
        migration = self.view.topology.migration
        yield _single(
            "shardlimit_migration_in_progress",
            "gauge",
            "1 while the topology names a migration (keys moving between nodes).",
            int(migration is not None),
        )
        resharder = self.resharder
        yield _single(
            "shardlimit_migration_moved_keys",
            "counter",
            "Keys moved by migrations this router orchestrated.",
            resharder.moved_keys_total,
        )
        sources = resharder.progress.get("sources") or {}
        done = sum(1 for entry in sources.values() if entry.get("done"))
        yield _single(
            "shardlimit_migration_sources_done_ratio",
            "gauge",
            "Share of the current (or last) migration's source nodes fully copied, "
            "on the router running it.",
            done / len(sources) if sources else 0.0,
        )
        scanned = GaugeMetricFamily(
            "shardlimit_migration_scanned_keys",
            "Keys the current (or last) migration scanned on each source node.",
            labels=["node"],
        )
        for node_id, entry in sorted(sources.items()):
            scanned.add_metric([node_id], entry.get("scanned", 0))
        yield scanned
