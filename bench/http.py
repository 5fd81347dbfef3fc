"""One blocking HTTP call to a router, for the pieces' set-up and read-back (not load)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def request(url: str, method: str = "GET", body: Any = None, token: str | None = None) -> Any:
    """The answer decoded: JSON when it is an object or array, else text."""
    data = json.dumps(body).encode() if body is not None else None
    call = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - our router
    call.add_header("Content-Type", "application/json")
    if token:
        call.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(call, timeout=30) as response:  # noqa: S310
        raw: bytes = response.read()
    return json.loads(raw) if raw.startswith((b"{", b"[")) else raw.decode()
