"""Every exception the router raises, in one tree under `RouterError` (as httpx keeps its
exceptions in one module that imports nothing). The rooms raise these; the API room maps
them to HTTP in one table (router/api/problems.py), the Envoy room to gRPC codes. This
module imports nothing of the router."""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "AdjustRefused",
    "InvalidRequest",
    "JoinRefused",
    "LeaseNotFound",
    "MigrationBlocked",
    "NodeUnavailable",
    "PreconditionFailed",
    "ProtocolError",
    "Reason",
    "ReplayMismatch",
    "ReshardError",
    "RouterError",
    "RulesConflict",
    "RulesUnavailable",
    "ServiceError",
    "SettingsError",
    "UnknownRule",
    "WouldDelete",
]


class RouterError(Exception):
    """The base of every error the router raises on purpose."""


class Reason(StrEnum):
    """Why a node could not decide: the `reason` label of degraded answers."""

    DOWN = "down"  # the node is known down: nothing was sent
    UNAVAILABLE = "unavailable"  # refused, reset or 503 on this batch
    TIMEOUT = "timeout"  # no answer by the deadline plus the margin
    EXPIRED = "expired"  # the node refused to apply past the deadline, every time
    UNREPLICATED = "unreplicated"  # durability replica: no replica held it in time
    OVERLOADED = "overloaded"  # the node's queue in this router was full
    REFUSED = "refused"  # the node's Redis refused to write (full, or cannot persist)
    ERROR = "error"  # the node answered, but not with a usable result


class NodeUnavailable(RouterError):
    """The node could not decide; `reason` says why."""

    def __init__(
        self, message: str, reason: Reason = Reason.UNAVAILABLE, *, endpoint_down: bool = False
    ) -> None:
        super().__init__(message)
        self.reason = reason
        # A timeout of an endpoint already marked down: it may have applied the op and
        # hung before answering, so the op is not sent again to another endpoint.
        self.endpoint_down = endpoint_down


class ProtocolError(RouterError, ConnectionError):
    """The node's answer was not HTTP/1.1 we understand."""


class RulesConflict(RouterError):
    """The cluster's rules are at another version than the writer expected."""

    def __init__(self, current: int) -> None:
        super().__init__(f"the cluster's rules are at version {current}")
        self.current = current


class PreconditionFailed(RouterError):
    """A write's If-Match: * or If-None-Match: * does not hold for the rule it names."""


class UnknownRule(RouterError, LookupError):
    """A change named a rule the cluster does not hold; `hint` names the nearest it holds
    ("; did you mean 'basic'?", or "")."""

    def __init__(self, name: str, hint: str = "") -> None:
        super().__init__(name)
        self.hint = hint


class RulesUnavailable(RouterError):
    """The rules could not be read or stored on a majority of the nodes."""


class WouldDelete(RouterError):
    """A rules file would delete rules the cluster holds (needs `rules apply --prune`)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(", ".join(names))
        self.names = names


class ReplayMismatch(RouterError):
    """A replayed decision (same key and request_id) was made for other limits."""


class ReshardError(RouterError):
    """A topology change that cannot start or go on; `slug` names its problem type, and
    `unavailable` says the cluster could not take it now (the lock node not answering)
    rather than refused it."""

    def __init__(
        self, detail: str, slug: str = "reshard-refused", *, unavailable: bool = False
    ) -> None:
        super().__init__(detail)
        self.slug = slug
        self.unavailable = unavailable


class MigrationBlocked(RouterError):
    """The topology changed, but the migration cannot go on: `blocked` says where."""

    def __init__(self, message: str, blocked: dict[str, str] | None) -> None:
        super().__init__(message)
        self.blocked = blocked


class JoinRefused(RouterError):
    """Why a node may not join; `kind` is the problem type."""

    def __init__(self, kind: str, status: int, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.status = status


class AdjustRefused(RouterError):
    """The node refused: `kind` is "request-id-reused" or "quota-over"."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class LeaseNotFound(RouterError, LookupError):
    """A lease renewal or release named a lease that is not held (expired, released or
    never granted)."""


class SettingsError(RouterError, ValueError):
    """A setting's value cannot be read: the router refuses to start, naming it."""


class ServiceError(RouterError, ValueError):
    """A request envoyproxy/ratelimit refuses with a service error: gRPC UNKNOWN, as
    its Go error reaches clients, with the same message."""


class InvalidRequest(RouterError, ValueError):
    """A request shardlimit cannot check: INVALID_ARGUMENT."""
