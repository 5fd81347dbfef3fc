"""An error reply from Redis -> the exception object redis-py would make of it.

Handed to hiredis as `Reader(replyError=reply_error)`, the way redis-py's own hiredis
parser does, so the reader builds the error objects itself: replies that are not errors
cost nothing more. The table is redis-py's mapping of reply prefixes (its parsers'
`EXCEPTION_CLASSES`), written out here with redis-py's public exception classes so that
the node's one Redis-error boundary (node/edge/boundary.py) sees the same exceptions from
the lean pipe (node/store/resp.py) as from redis-py's client.
"""

from __future__ import annotations

import redis.exceptions
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    BusyLoadingError,
    ClusterCrossSlotError,
    ClusterDownError,
    ExecAbortError,
    MasterDownError,
    ModuleError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["reply_error", "write_refusal"]

# A ConnectionError of its own from redis-py 8.2 on, a plain one before.
_MAX_CLIENTS: type[RedisError] = getattr(
    redis.exceptions, "MaxClientsReachedError", RedisConnectionError
)

# The "ERR ..." replies redis-py tells apart, by their text after "ERR ".
_ERR_BY_TEXT: dict[str, type[RedisError]] = {
    "max number of clients reached": _MAX_CLIENTS,
    "invalid password": AuthenticationError,
    "wrong number of arguments for 'auth' command": AuthenticationWrongNumberOfArgsError,
    "wrong number of arguments for 'AUTH' command": AuthenticationWrongNumberOfArgsError,
    "Error loading the extension. Please check the server logs.": ModuleError,
    "Error unloading module: the module exports one or more module-side data types, "
    "can't unload": ModuleError,
    "Error unloading module: no such module with that name": ModuleError,
    "Error unloading module: operation not possible.": ModuleError,
    "AUTH <password> called without any password configured for the default user. "
    "Are you sure your configuration is correct?": AuthenticationError,
    "Client sent AUTH, but no password is set": AuthenticationError,
}

# The other prefixes redis-py maps to a class of their own.
_BY_PREFIX: dict[str, type[RedisError]] = {
    "OOM": OutOfMemoryError,
    "WRONGPASS": AuthenticationError,
    "EXECABORT": ExecAbortError,
    "LOADING": BusyLoadingError,
    "NOSCRIPT": NoScriptError,
    "READONLY": ReadOnlyError,
    "NOAUTH": AuthenticationError,
    "NOPERM": NoPermissionError,
    "ASK": AskError,
    "TRYAGAIN": TryAgainError,
    "MOVED": MovedError,
    "CLUSTERDOWN": ClusterDownError,
    "CROSSSLOT": ClusterCrossSlotError,
    "MASTERDOWN": MasterDownError,
}


def reply_error(reply: str) -> RedisError:
    """The exception for one error reply, its message without a known prefix (as
    redis-py words it: "ERR unknown command" -> ResponseError("unknown command"))."""
    prefix = reply.split(" ", 1)[0]
    if prefix == "ERR":
        text = reply[4:]
        return _ERR_BY_TEXT.get(text, ResponseError)(text)
    kind = _BY_PREFIX.get(prefix)
    if kind is None:
        return ResponseError(reply)
    return kind(reply[len(prefix) + 1 :])


# What Redis says when it refuses a write, as its own reply (7.0) or inside a script
# error's text (6.2: "ERR Error running script ...: -OOM command not allowed ..."), and
# what that means for the shard. A script is refused at its first write, so a refused
# op changed nothing.
_REFUSALS: tuple[tuple[str, str], ...] = (
    (
        "command not allowed when used memory > 'maxmemory'",
        "is full (used memory over maxmemory, policy noeviction)",
    ),
    ("MISCONF", "cannot persist (its last AOF or RDB write failed)"),
)


def write_refusal(error: BaseException) -> str | None:
    """Why Redis refused to write ("is full (...)", "cannot persist (...)"), when `error`
    is such a refusal; None for any other error."""
    text = str(error)
    for needle, meaning in _REFUSALS:
        if needle in text:
            return meaning
    return None
