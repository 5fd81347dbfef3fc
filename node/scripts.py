"""Lua scripts shipped as package files and assembled at load time."""

from __future__ import annotations

from functools import cache
from importlib import resources

ALGORITHM_FILES = (
    "fixed_window.lua",
    "sliding_log.lua",
    "sliding_window.lua",
    "token_bucket.lua",
    "leaky_bucket.lua",
    "calendar.lua",
)


def _read(name: str) -> str:
    return resources.files("node").joinpath("lua", name).read_text(encoding="utf-8")


@cache
def script_source(entry: str) -> str:
    """common.lua + every algorithm + the entry file (check.lua or refund.lua)."""
    parts = [_read("common.lua"), *(_read(f) for f in ALGORITHM_FILES), _read(entry)]
    return "\n".join(parts)
