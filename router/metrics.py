"""A few Prometheus counters, kept as plain ints on the hot path."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


class Metrics:
    def __init__(self) -> None:
        self.decisions: Counter[str] = Counter()  # allowed / denied / degraded_allowed / ...
        self.requests: Counter[str] = Counter()  # endpoint
        self.errors: Counter[int] = Counter()  # problem status
        self.moved_retries = 0

    def render(self, node_lines: Iterable[str], extra: Iterable[str] = ()) -> str:
        lines = [
            "# HELP shardlimit_decisions_total Check decisions by outcome.",
            "# TYPE shardlimit_decisions_total counter",
        ]
        for outcome, count in sorted(self.decisions.items()):
            lines.append(f'shardlimit_decisions_total{{outcome="{outcome}"}} {count}')
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
