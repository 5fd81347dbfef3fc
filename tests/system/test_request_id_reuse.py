"""Scenario: a request_id reused for a different payment answered "allowed, replayed"
and counted nothing, so one id let through any number of payments. With real processes
(three Redis, three nodes, two routers): the replay needs the same request; another one
answers 409 `request-id-reused`, through either router, and consumes nothing."""

from __future__ import annotations

import pytest

from tests.system.test_rules_truth import Stack, stack  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(120)

DAY = [{"algorithm": "calendar", "period": "day", "timezone": "UTC", "max_amount": "100.00"}]


async def test_one_request_id_cannot_let_through_another_payment(stack: Stack) -> None:  # noqa: F811
    a, b = stack.router_urls["a"], stack.router_urls["b"]
    first = {"key": "merchant:1", "limits": DAY, "amount": "90.00", "request_id": "r-1"}
    status, body = await stack.request("POST", a + "/v1/check", first)
    assert (status, body["allowed"], body["limits"][0]["amount_remaining"]) == (200, True, "10.00")

    for router in (a, b):
        for other in ({"amount": "5.00"}, {"cost": 3}):
            status, body = await stack.request("POST", router + "/v1/check", {**first, **other})
            assert status == 409, body
            assert body["type"].endswith("/request-id-reused") and body["status"] == 409
        status, body = await stack.request("POST", router + "/v1/check", first)
        assert (status, body["replayed"]) == (200, True)

    read = {"key": "merchant:1", "limits": DAY, "cost": 0}
    status, body = await stack.request("POST", b + "/v1/check", read)
    assert (status, body["limits"][0]["amount_remaining"]) == (200, "10.00")
