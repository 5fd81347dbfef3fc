"""RFC 9457 problem+json responses, shared by router and node."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from cluster.model.errors import FieldError
from cluster.web import exact_json

PROBLEM_TYPE = "https://shardlimit.dev/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"
CLIENT_CLOSED = 499  # a request whose client went away before it was whole (nginx's code)
# How long a request's body may take to arrive, as the router's front gives a request
# (its keep-alive timeout) before closing the connection.
BODY_WAIT_S = 75.0
_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    412: "Precondition Failed",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


def json_response(
    data: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON answer from a msgspec Struct or plain data."""
    return web.Response(
        body=json_bytes(data), status=status, content_type="application/json", headers=headers
    )


def json_bytes(data: Any) -> bytes:
    """The JSON of a msgspec Struct or plain data."""
    return msgspec.json.encode(data) if isinstance(data, msgspec.Struct) else orjson.dumps(data)


class Problem(Exception):
    """Raised anywhere in a request to answer with this problem+json (problem_middleware
    renders it); domain errors are translated to it in one table per service."""

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        errors: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.detail = detail
        self.errors = errors
        self.headers = headers

    def response(self) -> web.Response:
        return problem(self.status, self.slug, self.detail, self.errors, self.headers)

    def body(self) -> bytes:
        return problem_body(self.status, self.slug, self.detail, self.errors)


def invalid(errors: list[FieldError]) -> Problem:
    """A 400 validation problem naming each field, each problem once (two limits may
    find the same fault in one field)."""
    unique = list({(e.path, e.message): e for e in errors}.values())
    detail = "; ".join(f"{e.path}: {e.message}" for e in unique[:5])
    return Problem(400, "validation", detail, unique)


def version_not_supported(version: str) -> Problem:
    """The answer to a request line naming an HTTP version other than 1.0 and 1.1 (RFC
    9110, 15.6.6). The HTTP ports speak HTTP/1.x only (HTTP/2 is the gRPC port's)."""
    return Problem(
        505, "http-version-not-supported", f"HTTP/{version} is not served here: use HTTP/1.1"
    )


def problem(
    status: int,
    slug: str,
    detail: str,
    errors: list[FieldError] | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=status,
        body=problem_body(status, slug, detail, errors),
        content_type=PROBLEM_CONTENT_TYPE,
        headers=headers,
    )


def problem_body(
    status: int, slug: str, detail: str, errors: list[FieldError] | None = None
) -> bytes:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE + slug,
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if errors:
        body["errors"] = [e.to_dict() for e in errors]
    return orjson.dumps(body)


def problem_detail(raw: bytes) -> str:
    """What a peer's error answer says: a problem's `detail`, else its first 200 bytes."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode(errors="replace")
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)[:200]


def internal_error() -> Problem:
    """The answer to an error nothing translates (logged where it is caught)."""
    return Problem(500, "internal", "internal error; the request may be retried")


# The content codings a body may come in (aiohttp decodes them); one at most.
CONTENT_CODINGS = frozenset({"identity", "gzip", "x-gzip", "deflate"})


def unsupported_coding(request: web.BaseRequest) -> Problem | None:
    """A 415 for a body in a content coding not served here, or in several (RFC 9110,
    15.5.16); None when it can be read."""
    given = ",".join(request.headers.getall("Content-Encoding", ()))
    codings = [c.strip().lower() for c in given.split(",") if c.strip()]
    if len(codings) <= 1 and set(codings) <= CONTENT_CODINGS:
        return None
    return Problem(
        415,
        "unsupported-content-encoding",
        f"Content-Encoding {given!r} is not served: send the body as is, or in one of "
        "gzip or deflate",
        headers={"Accept-Encoding": "gzip, deflate"},
    )


async def _body_in_time(request: web.Request) -> bool:
    """Read the body whole within BODY_WAIT_S (aiohttp would wait for it for ever); the
    handler's own read then takes it from memory. False when it did not arrive."""
    try:
        async with asyncio.timeout(BODY_WAIT_S):
            await request.read()
    except TimeoutError:
        return False
    return True


def _too_large(limit: int) -> web.Response:
    return problem(413, "body-too-large", f"request body exceeds {limit // 1024 // 1024} MiB")


@web.middleware
async def problem_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every error leaves as problem+json; nothing escapes as an HTML page or a bare 500."""
    if request.version.major != 1:  # llhttp reads HTTP/0.9 and HTTP/2.0 request lines too
        version = request.version
        return version_not_supported(f"{version.major}.{version.minor}").response()
    refused = unsupported_coding(request)
    if refused is not None:
        return refused.response()
    limit = request.client_max_size  # the app's: a body declared larger is not waited for
    declared = request.content_length
    if declared is not None and declared > limit:
        answer = _too_large(limit)
        answer.force_close()  # the body is never read
        return answer
    try:
        if request.body_exists and not await _body_in_time(request):
            late = f"the request body did not arrive whole in {BODY_WAIT_S:g} s"
            answer = problem(408, "request-timeout", late)
            answer.force_close()
            return answer
        response: web.StreamResponse = await handler(request)
        return response
    except Problem as exc:
        return exc.response()
    except web.HTTPRequestEntityTooLarge:
        return _too_large(limit)
    except web.RequestPayloadError as exc:  # e.g. Content-Encoding: gzip on a body that is not
        cause = exc.__cause__
        reason = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
        return problem(400, "unreadable-body", f"the request body cannot be read: {reason}")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # Keep what the status promises, e.g. `Allow` on a 405.
        kept = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "www-authenticate")}
        return problem(exc.status, "http", exc.reason or exc.text or "error", headers=kept)
    except ConnectionResetError:
        # The client closed the connection before its request was whole: no one to
        # answer, and no fault here. Counted as nginx logs it, 499; never delivered.
        return web.Response(status=CLIENT_CLOSED)
    except Exception:
        request.app.logger.exception("unhandled error on %s %s", request.method, request.path)
        return internal_error().response()


async def json_body(request: web.Request) -> Any:
    """A public request's JSON body, numbers exact (cluster/web/exact_json.py: amounts
    may be in it). Raises Problem (400) if it is not JSON."""
    try:
        return exact_json.loads(await request.read())
    except exact_json.JSONDecodeError as exc:
        raise Problem(400, "malformed-json", f"body is not valid JSON: {exc}") from None


async def read_json(request: web.Request) -> tuple[Any, web.Response | None]:
    """Parse an internal JSON body (a topology: its numbers are floats, and stored as
    such); a problem response instead if it is not JSON."""
    raw = await request.read()
    try:
        return orjson.loads(raw), None
    except orjson.JSONDecodeError as exc:
        return None, problem(400, "malformed-json", f"body is not valid JSON: {exc}")
