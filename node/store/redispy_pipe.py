"""The general way to send the store's commands: redis-py's client, for connections the
lean pipe (node/store/resp.py) does not speak (TLS). It answers as RespPipe.execute does:
replies in order, an error reply as its exception object in its slot."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from node.store.resp import Arg, Command, RespPipe
from node.store.scripts import evalsha

__all__ = [
    "RedisPyPipe",
    "Sender",
    "load_scripts",
    "own_sender",
    "replies_or_raise",
    "run_script",
]


class RedisPyPipe:
    __slots__ = ("client",)

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client

    async def execute(self, commands: Sequence[Command]) -> list[Any]:
        if len(commands) == 1:
            # The common case (a batch of checks only): one command, no pipeline object.
            try:
                # redis-py leaves Redis.execute_command untyped
                return [await self.client.execute_command(*commands[0])]  # type: ignore[no-untyped-call]
            except ResponseError as exc:  # a script error (NOSCRIPT too) goes in its slot
                return [exc]
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    async def close(self) -> None:
        """Nothing: the client is its owner's, shared with other users."""


# How the store's commands reach one Redis: the lean pipe where it can go, else this.
Sender = RespPipe | RedisPyPipe


def own_sender(client: aioredis.Redis, *, lean: bool = True) -> Sender:
    """A connection of its own to `client`'s server, database and user: the lean pipe
    where it can go (and `lean`), else redis-py's `client` itself."""
    pipe = RespPipe.for_client(client) if lean else None
    return pipe if pipe is not None else RedisPyPipe(client)


def replies_or_raise(replies: list[Any]) -> list[Any]:
    """A Sender's `replies`, once none of them is an error reply: the first one is raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


async def run_script(
    sender: Sender, script: AsyncScript, keys: Sequence[Arg], args: Sequence[Arg]
) -> Any:
    """One call of `script` through `sender`: its reply, or its error reply raised. Loaded
    and called once more when this Redis does not hold it (a restart, SCRIPT FLUSH)."""
    call = evalsha(script, keys, args)
    (reply,) = await sender.execute([call])
    if isinstance(reply, NoScriptError):
        await load_scripts(sender, [script])
        (reply,) = await sender.execute([call])
    return replies_or_raise([reply])[0]


async def load_scripts(sender: Sender, scripts: Iterable[AsyncScript]) -> None:
    """Load `scripts` into the sender's Redis, which answered NOSCRIPT for them (it lost
    its script cache: a restart, a failover to a replica, SCRIPT FLUSH)."""
    sources = [script.script for script in scripts]
    loads = [("SCRIPT", "LOAD", bytes(s) if isinstance(s, memoryview) else s) for s in sources]
    replies_or_raise(await sender.execute(loads))
