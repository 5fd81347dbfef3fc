"""`@limited`: rate-limit calls of a function, sync (with `Client`) or async (`AsyncClient`).

    sl = Client("http://127.0.0.1:8080")

    @limited(rule="basic", key=lambda user_id, **_: f"user:{user_id}", client=sl)
    def export(user_id: int, fmt: str = "csv") -> bytes: ...

Each call first checks `key(*args, **kwargs)` (consuming `cost`, an int or a function of the
same arguments) under `rule`. A denial raises `RateLimited` and the function does not run.
The client is always given explicitly: a `Client` for plain functions, an `AsyncClient` for
coroutine functions (checked when decorating). When the router is unreachable the call goes
ahead or is refused per `on_failure` (default "allow", see `cluster.sdk.failure`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast

from cluster.sdk.client import (
    AsyncClient,
    Client,
    Unavailable,
)
from cluster.sdk.errors import RateLimited
from cluster.sdk.failure import OnFailure, check_on_failure, unreachable_decision

__all__ = ["RateLimited", "limited"]

P = ParamSpec("P")
R = TypeVar("R")


def _cost(cost: int | Callable[..., int], args: Any, kwargs: Any) -> int:
    return cost(*args, **kwargs) if callable(cost) else cost


def limited(
    *,
    rule: str,
    key: Callable[..., str],
    client: Client | AsyncClient,
    cost: int | Callable[..., int] = 1,
    on_failure: OnFailure | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function so that each call is checked first; denial raises RateLimited."""
    fallback = check_on_failure(on_failure)

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(fn):
            if not isinstance(client, AsyncClient):
                raise TypeError(
                    f"@limited on coroutine function {fn.__qualname__} needs an AsyncClient"
                )
            async_client = client
            async_fn = cast(Callable[P, Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                name = key(*args, **kwargs)
                try:
                    decision = await async_client.check(name, rule, cost=_cost(cost, args, kwargs))
                except Unavailable as exc:
                    decision = unreachable_decision(name, rule, fallback, exc)
                if not decision.allowed:
                    raise RateLimited(decision)
                return await async_fn(*args, **kwargs)

            return cast(Callable[P, R], async_wrapper)

        if not isinstance(client, Client):
            raise TypeError(f"@limited on function {fn.__qualname__} needs a (sync) Client")
        sync_client = client

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            name = key(*args, **kwargs)
            try:
                decision = sync_client.check(name, rule, cost=_cost(cost, args, kwargs))
            except Unavailable as exc:
                decision = unreachable_decision(name, rule, fallback, exc)
            if not decision.allowed:
                raise RateLimited(decision)
            return fn(*args, **kwargs)

        return wrapper

    return decorate
