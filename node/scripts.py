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
def script_source(entry: str, codes: tuple[int, ...] | None = None) -> str:
    """common.lua + the algorithms in `codes` (default: all) + the entry file.

    Redis runs a script's whole body on every EVALSHA, so a script carrying only
    the algorithms a check uses is cheaper to run than one carrying all six.
    """
    chosen = range(1, len(ALGORITHM_FILES) + 1) if codes is None else sorted(set(codes))
    algorithms = (read_lua(ALGORITHM_FILES[code - 1]) for code in chosen)
    return "\n".join([read_lua("common.lua"), *algorithms, read_lua(entry)])
