"""The live cluster page served at `GET /ui`: static HTML, JS and CSS shipped in the package.

No build step, no CDN: the page polls `/v1/cluster` and `/v1/cluster/ring` from the router
that served it, and its Content-Security-Policy allows nothing else.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["HEADERS", "asset"]

_TYPES = {"index.html": "text/html", "ui.js": "text/javascript", "ui.css": "text/css"}

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
"""Headers of every page asset: same-origin only, revalidated on each load."""


@cache
def asset(name: str) -> tuple[bytes, str] | None:
    """The bytes and content type of the page file `name`, None if there is no such file."""
    content_type = _TYPES.get(name)
    if content_type is None:
        return None
    return resources.files(__name__).joinpath(name).read_bytes(), content_type
