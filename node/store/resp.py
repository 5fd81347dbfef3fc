"""One pipelined Redis connection for the node's hot path: script calls.

redis-py's generic client costs a node more per script call than Redis spends
running the script (a pool checkout, per-argument encoding, a stream write and a
read per command). The node's counter scripts need none of that: commands are
packed by hiredis, written in one call, and their replies are parsed by hiredis
and handed back in order, so any number of batches share one connection the way
Redis pipelining intends (Redis runs them one after the other anyway).

Errors are redis-py's, so the node's one Redis-error boundary (node/edge/boundary.py)
sees the same exceptions from either client: hiredis' reader builds an error reply as
the `ResponseError` subclass redis-py would have raised (NoScriptError, ...;
node/store/reply_errors.py) in its command's slot; a lost or refused connection raises
`ConnectionError`.

There is no read timeout, on purpose: see `NodeState.counters` in node/state.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast, overload

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from cluster.web.connect import connect
from node.store.reply_errors import reply_error

Arg = str | bytes | int | float
Command = Sequence[Arg]

log = logging.getLogger("shardlimit.node")

_pack_command = cast(Callable[[tuple[Arg, ...]], bytes], hiredis.pack_command)


Replied = Callable[[list[Any] | Exception], None]


class EachKey(Sequence[Command]):
    """The same commands for each of many keys, in order: EachKey(("PTTL", "DUMP"), keys)
    is PTTL k1, DUMP k1, PTTL k2, DUMP k2, ... The lean pipe packs them in one pass over
    the keys, in about a third of hiredis' time a command (a copy reads thousands of
    keys a second); any other sender reads them as the commands they are."""

    __slots__ = ("keys", "verbs")

    def __init__(self, verbs: Sequence[str], keys: Sequence[str]) -> None:
        self.verbs = tuple(verbs)
        self.keys = keys

    def __len__(self) -> int:
        return len(self.verbs) * len(self.keys)

    @overload
    def __getitem__(self, index: int) -> Command: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Command]: ...

    def __getitem__(self, index: int | slice) -> Command | Sequence[Command]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        key, verb = divmod(index, len(self.verbs))
        return (self.verbs[verb], self.keys[key])

    def __iter__(self) -> Iterator[Command]:
        for key in self.keys:
            for verb in self.verbs:
                yield (verb, key)

    def packed(self) -> bytes:
        """The commands in RESP, as hiredis would pack them one by one."""
        template = b"".join(
            b"*2\r\n$%d\r\n%b\r\n$%%d\r\n%%b\r\n" % (len(verb), verb.encode())
            for verb in self.verbs
        )
        width = len(self.verbs)
        return b"".join(
            template % ((len(raw), raw) * width) for raw in (key.encode() for key in self.keys)
        )


class _Pending:
    __slots__ = ("future", "left", "replied", "replies")

    def __init__(
        self, future: asyncio.Future[list[Any]] | None, count: int, replied: Replied | None = None
    ) -> None:
        self.future = future  # awaited by execute() ...
        self.replied = replied  # ... or called by send_now()'s caller, from data_received
        self.left = count
        self.replies: list[Any] = []

    def settle(self, outcome: list[Any] | Exception) -> None:
        if self.replied is not None:
            try:
                self.replied(outcome)
            except Exception:  # a bug in the caller must not stall the other replies
                log.exception("handling a Redis reply failed")
        elif self.future is not None and not self.future.done():
            if isinstance(outcome, Exception):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)


class _RespProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader(protocolError=InvalidResponse, replyError=reply_error)
        self.pending: deque[_Pending] = deque()
        self.lost: Exception | None = None
        self.corked: list[bytes] | None = None  # writes held for one write (cork/uncork)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}")
        while self.pending:
            self.pending.popleft().settle(self.lost)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            try:
                reply = self.reader.gets()
            except InvalidResponse as exc:
                assert self.transport is not None
                self.transport.close()  # connection_lost fails every waiter
                self.lost = RedisConnectionError(f"Redis protocol error: {exc}")
                return
            if reply is False:
                return
            if not self.pending:
                continue  # an answer to a request whose waiter is gone (cancelled)
            head = self.pending[0]
            head.replies.append(reply)
            head.left -= 1
            if head.left == 0:
                self.pending.popleft()
                head.settle(head.replies)

    def send(self, payload: bytes, count: int) -> asyncio.Future[list[Any]]:
        assert self.transport is not None
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.pending.append(_Pending(future, count))
        self._write(payload)
        return future

    def send_calling(self, payload: bytes, count: int, replied: Replied) -> None:
        assert self.transport is not None
        self.pending.append(_Pending(None, count, replied))
        self._write(payload)

    def _write(self, payload: bytes) -> None:
        # In order with `pending` either way: held writes keep their order.
        if self.corked is not None:
            self.corked.append(payload)
        else:
            assert self.transport is not None
            self.transport.write(payload)

    def uncork(self) -> None:
        held, self.corked = self.corked, None
        if held and self.transport is not None and self.lost is None:
            self.transport.write(b"".join(held))


class RespPipe:
    """Commands in, replies (or error objects) out, in order, on one connection that
    is opened on first use and again after it was lost."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        connect_timeout_s: float = 2.0,
    ) -> None:
        self.host, self.port, self.path = host, port, path
        self.connect_timeout_s = connect_timeout_s
        self._hello: list[Command] = []
        if password is not None:
            self._hello.append(("AUTH", username, password) if username else ("AUTH", password))
        if db:
            self._hello.append(("SELECT", db))
        self._protocol: _RespProtocol | None = None
        self._connecting: asyncio.Lock | None = None

    @classmethod
    def for_client(cls, client: aioredis.Redis, connect_timeout_s: float = 2.0) -> RespPipe | None:
        """A pipe to the same server, database and user as `client`; None when its
        connections are of a kind this pipe does not speak (TLS)."""
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        common: dict[str, Any] = {
            "db": int(kwargs.get("db") or 0),
            "username": kwargs.get("username"),
            "password": kwargs.get("password"),
            "connect_timeout_s": connect_timeout_s,
        }
        if pool.connection_class is UnixDomainSocketConnection:
            return cls(path=kwargs["path"], **common)
        if pool.connection_class is Connection:
            return cls(
                host=kwargs.get("host", "localhost"), port=int(kwargs.get("port", 6379)), **common
            )
        return None

    async def _connect(self) -> _RespProtocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if self.path is not None:
                    _, protocol = await loop.create_unix_connection(_RespProtocol, self.path)
                else:
                    protocol = await connect(_RespProtocol, self.host, self.port)
        except TimeoutError as exc:
            raise RedisTimeoutError(f"connecting to Redis timed out: {exc}") from exc
        except OSError as exc:
            raise RedisConnectionError(f"cannot connect to Redis: {exc}") from exc
        if self._hello:
            replies = await protocol.send(self._pack(self._hello), len(self._hello))
            for reply in replies:
                if isinstance(reply, Exception):
                    assert protocol.transport is not None
                    protocol.transport.close()
                    raise reply
        return protocol

    async def _open(self) -> _RespProtocol:
        if self._protocol is not None and self._protocol.lost is None:
            return self._protocol
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._protocol is None or self._protocol.lost is not None:
                self._protocol = await self._connect()
            return self._protocol

    @staticmethod
    def _pack(commands: Sequence[Command]) -> bytes:
        if isinstance(commands, EachKey):
            return commands.packed()
        if len(commands) == 1:  # the common case: one script call
            command = commands[0]
            return _pack_command(command if isinstance(command, tuple) else tuple(command))
        return b"".join(_pack_command(tuple(command)) for command in commands)

    async def execute(self, commands: Sequence[Command]) -> list[Any]:
        """The replies of `commands`, in order; an error reply is its ResponseError
        object in its slot. Raises redis ConnectionError when the connection is lost
        before every reply came."""
        if not commands:
            return []  # no reply would ever come to end a wait for none
        protocol = await self._open()
        return await protocol.send(self._pack(commands), len(commands))

    def send_now(self, commands: Sequence[Command], replied: Replied) -> bool:
        """execute() without awaiting, when the connection is open now (else False: then
        execute() opens it). `replied` gets the replies, or the ConnectionError that lost
        them, called from the protocol itself: no future, no extra loop turn."""
        protocol = self._protocol
        if protocol is None or protocol.lost is not None:
            return False
        protocol.send_calling(self._pack(commands), len(commands), replied)
        return True

    def cork(self) -> None:
        """Hold send_now()'s writes until uncork(): pipelines started together (say,
        every frame of one channel read) reach Redis in one write."""
        protocol = self._protocol
        if protocol is not None and protocol.lost is None and protocol.corked is None:
            protocol.corked = []

    def uncork(self) -> None:
        protocol = self._protocol
        if protocol is not None:
            protocol.uncork()

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()


__all__ = ["EachKey", "RespPipe", "ResponseError"]
