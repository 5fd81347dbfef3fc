"""The general way to send the store's commands: redis-py's client, for connections the
lean pipe (node/store/resp.py) does not speak (TLS). It answers as RespPipe.execute does:
replies in order, an error reply as its exception object in its slot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from node.store.resp import Command, RespPipe

__all__ = ["RedisPyPipe", "Sender", "replies_or_raise"]


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


# How the store's commands reach one Redis: the lean pipe where it can go, else this.
Sender = RespPipe | RedisPyPipe


def replies_or_raise(replies: list[Any]) -> list[Any]:
    """A Sender's `replies`, once none of them is an error reply: the first one is raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
