"""Lua scripts shipped as package files, assembled at load time and registered with the
node's Redis client."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from cluster.model.algorithms import ALGORITHMS, BY_CODE

__all__ = ["ScriptBook", "evalsha", "read_lua", "script_source"]


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


def evalsha(script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
    """The one command that calls `script`: EVALSHA directly rather than through
    Script.__call__, whose pipelines first ask Redis SCRIPT EXISTS (a round trip more).
    Its NOSCRIPT answer is its sender's to handle (node/store/redispy_pipe.py
    `load_scripts`)."""
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


class ScriptBook:
    """The store's scripts, registered with its client once each: the fixed ones, and
    each entry file assembled with the algorithms a call needs."""

    __slots__ = ("_assembled", "client", "commit", "decide", "settled")

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.commit = client.register_script(read_lua("commit.lua"))
        self.decide = client.register_script(read_lua("decide.lua"))
        self.settled = client.register_script(read_lua("settled.lua"))
        self._assembled: dict[tuple[str, tuple[int, ...]], AsyncScript] = {}

    def assembled(self, entry: str, algorithm_codes: Iterable[int]) -> AsyncScript:
        """`entry` with the algorithms of `algorithm_codes` (script_source)."""
        codes = tuple(sorted(set(algorithm_codes)))
        script = self._assembled.get((entry, codes))
        if script is None:
            script = self.client.register_script(script_source(entry, codes))
            self._assembled[(entry, codes)] = script
        return script
