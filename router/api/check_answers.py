"""`POST /v1/check` and `POST /v1/check/batch`, from the raw body to the JSON answer:
the one implementation behind both the aiohttp handlers (router/api/decisions_api.py) and the lean
front (router/front/server.py). Bad bodies and refused checks raise (Problem, ValidationError),
answered by the caller through router/api/problems.py."""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from router.api.check_bodies import decode_check, decode_check_batch
from router.decide.answers import ratelimit_headers
from router.decide.request_ids import raise_if_refused
from router.service import Router

CHECK_PATH = "/v1/check"
CHECK_BATCH_PATH = "/v1/check/batch"  # the node's own batch path is cluster.wire.BATCH_PATH
MAX_BODY = 1024 * 1024


class JsonAnswer(NamedTuple):
    status: int
    body: bytes
    headers: dict[str, str] | None


async def check_answer(router: Router, raw: bytes) -> JsonAnswer:
    parsed = decode_check(raw, router.rules)
    result = await router.check(parsed)
    raise_if_refused(result)
    status = 200 if result.allowed else 429
    return JsonAnswer(status, msgspec.json.encode(result), ratelimit_headers(parsed, result))


async def batch_answer(router: Router, raw: bytes) -> JsonAnswer:
    checks, all_or_nothing = decode_check_batch(raw, router.rules)
    return JsonAnswer(200, msgspec.json.encode(await router.batch(checks, all_or_nothing)), None)
