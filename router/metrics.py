"""A few Prometheus counters, kept as plain ints on the hot path."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from router.dispatch import NodeChannel

# Per node channel: (metric, type, help, attribute of NodeChannel).
_CHANNEL_SERIES = (
    ("shardlimit_node_up", "gauge", "1 if the router's circuit to the node is closed.", "up"),
    ("shardlimit_node_requests_total", "counter", "Batch requests sent to the node.", "requests"),
    ("shardlimit_node_ops_total", "counter", "Ops sent to the node in batches.", "ops"),
    ("shardlimit_node_failures_total", "counter",
     "Batches that failed: refused, reset, 503, bad answer or no answer.", "failures"),
    ("shardlimit_node_timeouts_total", "counter",
     "Batches with no answer by their deadline plus the margin.", "timeouts"),
    ("shardlimit_node_expired_total", "counter",
     "Ops the node answered `expired` (not applied; sent again while the node is up).",
     "expired"),
    ("shardlimit_node_overloaded_total", "counter",
     "Checks refused because the node's queue was full.", "overloaded"),
    ("shardlimit_node_late_undos_total", "counter",
     "Checks of answers that came after the router gave up, taken back.", "late_undos"),
    ("shardlimit_node_late_undo_failures_total", "counter",
     "Late checks that could not be taken back (they stay consumed).", "late_undo_failures"),
    ("shardlimit_node_breaker_opened_total", "counter", "Times the node was marked down.",
     "breaker_opened"),
    ("shardlimit_node_inflight_requests", "gauge", "Batch requests in flight now.", "inflight"),
    ("shardlimit_node_queued_ops", "gauge", "Ops waiting for the next batch now.", "queued"),
)  # fmt: skip


def _channel_value(channel: NodeChannel, attribute: str) -> int:
    if attribute == "up":
        return int(channel.state == "up")
    if attribute == "breaker_opened":
        return channel.breaker.opened
    value: int = getattr(channel, attribute)
    return value


def channel_lines(channels: Mapping[str, NodeChannel]) -> list[str]:
    """Prometheus lines for every node channel of the router."""
    lines: list[str] = []
    for name, kind, help_text, attribute in _CHANNEL_SERIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for node_id, channel in sorted(channels.items()):
            lines.append(f'{name}{{node="{node_id}"}} {_channel_value(channel, attribute)}')
    return lines


class Metrics:
    def __init__(self) -> None:
        self.decisions: Counter[str] = Counter()  # allowed / denied / degraded_allowed / ...
        self.requests: Counter[str] = Counter()  # endpoint
        self.errors: Counter[int] = Counter()  # problem status
        self.degraded: Counter[str] = Counter()  # degraded decisions by Reason
        self.moved_retries = 0

    def render(self, node_lines: Iterable[str], extra: Iterable[str] = ()) -> str:
        lines = [
            "# HELP shardlimit_decisions_total Check decisions by outcome.",
            "# TYPE shardlimit_decisions_total counter",
        ]
        for outcome, count in sorted(self.decisions.items()):
            lines.append(f'shardlimit_decisions_total{{outcome="{outcome}"}} {count}')
        lines += [
            "# HELP shardlimit_degraded_total Degraded decisions (on_failure applied) by reason.",
            "# TYPE shardlimit_degraded_total counter",
        ]
        for reason, count in sorted(self.degraded.items()):
            lines.append(f'shardlimit_degraded_total{{reason="{reason}"}} {count}')
        lines += [
            "# HELP shardlimit_requests_total Router API requests by endpoint.",
            "# TYPE shardlimit_requests_total counter",
        ]
        for endpoint, count in sorted(self.requests.items()):
            lines.append(f'shardlimit_requests_total{{endpoint="{endpoint}"}} {count}')
        lines += [
            "# HELP shardlimit_client_errors_total Problem responses by status.",
            "# TYPE shardlimit_client_errors_total counter",
        ]
        for status, count in sorted(self.errors.items()):
            lines.append(f'shardlimit_client_errors_total{{status="{status}"}} {count}')
        lines += [
            "# HELP shardlimit_moved_retries_total Checks re-routed after a moved answer.",
            "# TYPE shardlimit_moved_retries_total counter",
            f"shardlimit_moved_retries_total {self.moved_retries}",
        ]
        lines += list(node_lines)
        lines += list(extra)
        return "\n".join(lines) + "\n"
