"""ASGI middleware (Starlette, FastAPI, any ASGI app): one shardlimit check per request.

    app.add_middleware(
        RateLimitMiddleware,
        client=AsyncClient("http://127.0.0.1:8080"),
        key=lambda scope: scope["client"][0],
        rules={"/login": "login", "/items/{item_id}": "items"},
        default_rule="basic",
        exempt=["/healthz"],
    )

Denied: 429 problem+json with Retry-After and the RateLimit headers. Allowed: the app's
response with the RateLimit headers added. The key function gets the ASGI scope (wrap it in
`starlette.requests.Request(scope)` for headers, cookies...). Requests that match no rule
(no default) and exempt routes are passed through unchecked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from cluster.sdk.client import AsyncClient
from cluster.sdk.failure import OnFailure
from cluster.sdk.http_guard import HttpGuard, Verdict
from cluster.sdk.routes import RouteRules

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _raw(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()
    ]


class RateLimitMiddleware:
    """Limits HTTP requests of an ASGI app by `key(scope)` under the route's rule."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        client: AsyncClient,
        key: Callable[[Scope], str],
        rules: Mapping[str, str] | None = None,
        default_rule: str | None = None,
        exempt: Iterable[str] = (),
        on_failure: OnFailure | None = None,
        cost: int = 1,
    ) -> None:
        self.app = app
        self.key = key
        self.routes = RouteRules(rules, default_rule, exempt)
        self.guard = HttpGuard(client, on_failure, cost=cost)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rule = self.routes.rule_for(str(scope["path"]))
        if rule is None:
            await self.app(scope, receive, send)
            return
        verdict = await self.guard.check(self.key(scope), rule)
        if not verdict.allowed:
            await _deny(verdict, send)
            return
        extra = _raw(verdict.headers)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _deny(verdict: Verdict, send: Send) -> None:
    body = verdict.denied_body()
    headers = {
        **verdict.headers,
        "Content-Type": "application/problem+json",
        "Content-Length": str(len(body)),
    }
    await send({"type": "http.response.start", "status": 429, "headers": _raw(headers)})
    await send({"type": "http.response.body", "body": body})
