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


def read_lua(name: str) -> str:
    return resources.files("node").joinpath("lua", name).read_text(encoding="utf-8")


@cache
def script_source(entry: str) -> str:
    """common.lua + every algorithm + the entry file (check.lua or refund.lua)."""
    parts = [read_lua("common.lua"), *(read_lua(f) for f in ALGORITHM_FILES), read_lua(entry)]
    return "\n".join(parts)
