"""What applications import: the blocking and asyncio clients, the `limited` decorator,
and the ASGI and aiohttp middlewares.

    from cluster.sdk import AsyncClient, Client, limited, RateLimited
    from cluster.sdk import RateLimitMiddleware          # Starlette, FastAPI, any ASGI app
    async with client.lease("exports", key=tenant) as lease: ...   # docs/leases.md
    from cluster.sdk import rate_limit_middleware        # aiohttp

The SDK needs aiohttp, orjson and msgspec only; it never imports the router or a node.
"""

from cluster.sdk.aiohttp_middleware import rate_limit_middleware
from cluster.sdk.asgi import RateLimitMiddleware
from cluster.sdk.client import (
    AlreadyRefunded,
    AsyncClient,
    AsyncLease,
    BadRequest,
    CheckSpec,
    Client,
    Decision,
    GivenBack,
    Lease,
    LeaseGrant,
    LeaseLost,
    LeaseNotHeld,
    LeaseRelease,
    LeaseRenewal,
    LimitState,
    NotFound,
    QuotaAdjustment,
    RefundResult,
    RequestIdReused,
    RuleInfo,
    ShardlimitError,
    Unavailable,
)
from cluster.sdk.decorator import RateLimited, limited
from cluster.sdk.failure import OnFailure

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
    "OnFailure",
    "QuotaAdjustment",
    "RateLimitMiddleware",
    "RateLimited",
    "RefundResult",
    "RequestIdReused",
    "RuleInfo",
    "ShardlimitError",
    "Unavailable",
    "limited",
    "rate_limit_middleware",
]
