"""A node's breaker: up or down, as the router's client of that node sees it."""

from __future__ import annotations

import time

from router.errors import NodeUnavailable, Reason

CIRCUIT_OPEN = "circuit open"


def down(node_id: str) -> NodeUnavailable:
    """The error a check gets while its node is marked down (nothing was sent)."""
    return NodeUnavailable(f"node {node_id} is down ({CIRCUIT_OPEN})", Reason.DOWN)


class Breaker:
    """Up or down. Opened by proof that the node cannot answer; closed by any answer."""

    def __init__(self) -> None:
        self.open_since: float | None = None
        self.opened = 0  # times it opened

    @property
    def is_open(self) -> bool:
        return self.open_since is not None

    def success(self) -> None:
        self.open_since = None

    def trip(self) -> bool:
        """Open it; True if it was closed."""
        if self.open_since is not None:
            return False
        self.open_since = time.monotonic()
        self.opened += 1
        return True
