"""The router's OpenAPI 3.1 document (served at /openapi.json), in parts:
patterns.py (regexes shared with the server's parsers), schemas.py (request bodies; the
answers come from cluster/model/answers.py) and paths.py (the endpoints)."""

from __future__ import annotations

from functools import cache
from typing import Any

from router.api.openapi.paths import paths
from router.api.openapi.schemas import components

__all__ = ["openapi_document"]


@cache
def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "shardlimit router", "version": "1"},
        "paths": paths(),
        "components": {
            "securitySchemes": {"admin": {"type": "http", "scheme": "bearer"}},
            "schemas": components(),
        },
    }
