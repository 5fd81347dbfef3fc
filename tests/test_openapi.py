"""The served OpenAPI document is a valid OpenAPI 3.1 document."""

from __future__ import annotations

from typing import Any

from openapi_spec_validator import validate

from tests.conftest import Cluster


async def test_served_document_is_valid_openapi(cluster: Cluster) -> None:
    status, document = await cluster.get("/openapi.json")
    assert status == 200
    spec: Any = document
    validate(spec)
