"""Lua scripts shipped as package files and assembled at load time."""

from __future__ import annotations

from functools import cache
from importlib import resources

from cluster.model.algorithms import ALGORITHMS, BY_CODE


def read_lua(name: str) -> str:
    return resources.files("node.store").joinpath("lua", name).read_text(encoding="utf-8")


@cache
def script_source(entry: str, codes: tuple[int, ...] | None = None) -> str:
    """common.lua + the algorithms in `codes` (default: all) + the entry file.

    Redis runs a script's whole body on every EVALSHA, so a script carrying only
    the algorithms a check uses is cheaper to run than one carrying all six. Each
    algorithm file registers itself as ALG[CODE], CODE being its record's code
    (cluster/model/algorithms.py).
    """
    chosen = [a.code for a in ALGORITHMS] if codes is None else sorted(set(codes))
    algorithms = (f"local CODE = {code}\n" + read_lua(BY_CODE[code].lua_file) for code in chosen)
    return "\n".join([read_lua("common.lua"), *algorithms, read_lua(entry)])
