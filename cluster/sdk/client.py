"""Python client SDK for the shardlimit router: `Client` (blocking, cluster/sdk/sync_client.py)
and `AsyncClient` (aiohttp, cluster/sdk/async_client.py), with what their calls return and
raise.

Both clients describe every API call as a `_Call` and hand the answer to one function,
`_result` (cluster/sdk/calls.py), which turns (status, body bytes) into a typed result or
an exception. Transport failures are turned into `Unavailable` at each client's single
send method.
"""

from __future__ import annotations

from cluster.sdk.async_client import AsyncClient
from cluster.sdk.async_lease import AsyncLease
from cluster.sdk.calls import CheckSpec
from cluster.sdk.decisions import Decision, LeaseGrant, LimitState
from cluster.sdk.errors import (
    AlreadyRefunded,
    BadRequest,
    LeaseLost,
    LeaseNotHeld,
    NotFound,
    RequestIdReused,
    ShardlimitError,
    Unavailable,
)
from cluster.sdk.lease_calls import LeaseRelease, LeaseRenewal
from cluster.sdk.results import GivenBack, QuotaAdjustment, RefundResult, RuleInfo
from cluster.sdk.sync_client import Client
from cluster.sdk.sync_lease import Lease

__all__ = [
    "AlreadyRefunded",
    "AsyncClient",
    "AsyncLease",
    "BadRequest",
    "CheckSpec",
    "Client",
    "Decision",
    "GivenBack",
    "Lease",
    "LeaseGrant",
    "LeaseLost",
    "LeaseNotHeld",
    "LeaseRelease",
    "LeaseRenewal",
    "LimitState",
    "NotFound",
    "QuotaAdjustment",
    "RefundResult",
    "RequestIdReused",
    "RuleInfo",
    "ShardlimitError",
    "Unavailable",
]
