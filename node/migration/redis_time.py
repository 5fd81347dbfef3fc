"""The source Redis' time a copy used, as that Redis counts it (INFO commandstats).

A copy call timed from the node spans more than the Redis time it took: the round trip
to Redis, the wait behind live commands, and the wait for the node's event loop to read
the reply, which grows when the finder sends its next SCAN while it classifies the last
one's names. Redis counts each command's own time (`usec`), so the budget charges that:
the copy's commands are SCAN, DUMP and UNLINK, which no live script calls (SCAN inside
a script is the copy's own scan_moving.lua). The copy's PTTL, which live scripts call
too, is not counted: under a microsecond a key moved.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError

from node.store.redispy_pipe import Sender, replies_or_raise

log = logging.getLogger("shardlimit.node")

COPY_COMMANDS = ("scan", "dump", "unlink")
READ_EVERY_S = 0.005  # an INFO commandstats costs Redis about 25 µs
# A command running at a reading is counted whole in the next one, so a window may hold
# a little more Redis time than its own length.
STRADDLE_S = 0.1


class RedisTime:
    """Reads the copy commands' time from one Redis, at most every READ_EVERY_S.
    `usable` turns false for good when Redis refuses INFO (an ACL user without it): the
    budget then times the copy's calls itself."""

    def __init__(self, sender: Sender, clock: Callable[[], float] = time.monotonic) -> None:
        self.sender = sender  # the copy's own connection to the source Redis
        self.clock = clock
        self.usable = True
        self._total: float | None = None  # the copy commands' seconds at the last reading
        self._read_at = 0.0

    async def used(self) -> tuple[float, float] | None:
        """(seconds the copy's commands took since the last reading, when that was), or
        None: not due yet, the first reading, or a Redis whose counts started over."""
        now = self.clock()
        since = self._read_at
        if now - since < READ_EVERY_S:
            return None
        self._read_at = now  # before the call: the finder and the mover share one reading
        try:
            total = await self.total()
        except ResponseError as exc:  # refused (ACL, a renamed command); a lost Redis raises
            self.usable = False
            log.warning("copy budget times its calls: INFO commandstats refused (%s)", exc)
            return None
        previous, self._total = self._total, total
        if previous is None:
            return None
        used = total - previous
        # Less than before: counts reset (CONFIG RESETSTAT, a restart). Far more than the
        # time that passed: another Redis answers now (a failover). Either way, a new start.
        if not 0 <= used <= self.clock() - since + STRADDLE_S:
            return None
        return used, since

    async def total(self) -> float:
        """Seconds the copy commands have taken in this Redis since its counts began."""
        (reply,) = replies_or_raise(await self.sender.execute([("INFO", "commandstats")]))
        return copy_usec(reply) / 1e6


def copy_usec(info: bytes | dict[str, Any]) -> int:
    """The copy commands' `usec` in an INFO commandstats reply: the lean pipe's text, of
    which its few lines are read alone rather than every command's parsed into a dict
    (twice a millisecond of the copy's own CPU, a reading every 5 ms); or the dict
    redis-py parsed it into."""
    if isinstance(info, dict):
        return sum(int(info.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in COPY_COMMANDS)
    usec = 0
    for line in info.split(b"\r\n"):
        name, _, fields = line.partition(b":")
        if name[:8] == b"cmdstat_" and name[8:].decode() in COPY_COMMANDS:
            for field in fields.split(b","):
                key, _, value = field.partition(b"=")
                if key == b"usec":
                    usec += int(value)
    return usec
