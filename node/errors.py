"""Every exception the node raises, in one tree under `NodeError`; importing nothing of
the node. Redis' own errors stay redis-py's: the HTTP app answers them at one boundary
(node/edge/boundary.py)."""

from __future__ import annotations

__all__ = ["BadOp", "NodeError", "PeerError", "ShardMovedOn"]


class NodeError(Exception):
    """The base of every error the node raises on purpose."""


class PeerError(NodeError):
    """A call to a peer node failed; `status` is its HTTP answer when it gave one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BadOp(NodeError, ValueError):
    """An op of a batch that cannot be run: answered as a failed result."""


class ShardMovedOn(NodeError):
    """Another endpoint of this node's shard adopted a newer topology, `epoch`, than the
    one the work was placed by: nothing of it was applied."""

    def __init__(self, epoch: int) -> None:
        super().__init__(f"the shard moved on to topology epoch {epoch}")
        self.epoch = epoch
