"""The one-Redis baseline of the latency bench decides as the cluster does (the node's own
store on one redis-server), refuses bad input with a 400, and bench.cpu tells its two
processes from the cluster's."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest

from bench.cpu import below, process_table, role_of
from bench.one_redis import one_redis_server

pytestmark = pytest.mark.timeout(60)

LIMITS = [{"algorithm": "fixed_window", "limit": 2, "window": "1h"}]


def post(url: str, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        url + "/v1/check", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def check(url: str, key: str) -> tuple[int, dict[str, object]]:
    return post(url, json.dumps({"key": key, "limits": LIMITS}).encode())


def test_it_admits_up_to_the_limit_then_denies_and_refuses_bad_input() -> None:
    with one_redis_server() as url:
        answers = [check(url, "user:1") for _ in range(3)]
        assert [(status, body["allowed"]) for status, body in answers] == [
            (200, True),
            (200, True),
            (200, False),
        ]
        assert check(url, "user:2") == (200, {"allowed": True, "key": "user:2", "degraded": False})
        for bad in (b"not json", b'{"key": "user:3"}', b'{"key": "", "limits": []}', b"[]"):
            status, problem = post(url, bad)
            assert status == 400, bad
            assert problem["status"] == 400 and problem["detail"], problem
        refused = json.dumps({"key": "user:2", "limits": [{"algorithm": "fixed_window"}]})
        assert post(url, refused.encode())[0] == 400
        assert check(url, "user:2")[1]["allowed"] is True  # the 400s counted nothing
        # Other tests' Redis may run beside it (role "redis"): only its own two count.
        roles = [role_of(pid) for pid in below(os.getpid(), process_table())]
        assert roles.count("one-Redis aiohttp") == roles.count("one-Redis redis") == 1, roles
