"""A migration source's background copy: find what moves, move it, under a budget.

See docs/resharding.md ("Background copy"). One copy step (POST MIGRATE_PATH)
examines up to `count` Redis keys from a SCAN cursor and moves those whose limit
key changes owner, with three stages running at once:

- **find** (slots mode): SCAN, then one C CRC16 and one table lookup per key (a
  slot -> target table of the slots leaving this node); or, with in_redis,
  node/store/lua/scan_moving.lua SCANs inside Redis and computes each key's slot there,
  so only the names of moving keys reach this process. (ring mode): SCAN here;
  each key costs one MD5 and one bisect over the arcs of the ring that change owner
  (MovingArcs, on the digest's bytes), not two owner lookups. The next SCAN is sent
  while the names of the last one are classified;
- **move**: a chunk read here and RESTOREd straight into the target's Redis
  (node/migration/direct.py), MOVERS chunks at once, while the next ones are found;
- **budget**: the copy takes at most `busy_pct` percent of the source Redis' time, as
  that Redis counts its SCAN, DUMP and UNLINK commands (node/migration/redis_time.py):
  after using d of it, the finder and the mover wait, on one clock, until
  d * 100 / busy_pct has passed. And at most `rate` keys/s when a rate is set. Where
  Redis refuses INFO, the budget times each call here instead (the time the finder's
  and the mover's calls overlap counted once) and sends no SCAN ahead, whose time
  would then include the classifying. (A copy slowed further when live latency rises
  was tried and dropped: live checks of moving keys pay a first-touch pull until their
  key is copied, so a slower copy made them slower for longer.)
"""

from __future__ import annotations

import asyncio
import time
from binascii import crc_hqx
from bisect import bisect_right
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from hashlib import md5
from typing import Any, cast

import redis.asyncio as aioredis

from cluster.model.keys import DATA_KEYS_PATTERN, limit_key_of
from cluster.model.partition import (
    HASH_SLOTS,
    RingPartitioner,
    SlotPartitioner,
)
from cluster.wire.control import COPY_BUSY_PCT, COPY_STEP_MAX_S
from node.migration.redis_time import RedisTime
from node.store.redispy_pipe import Sender, replies_or_raise
from node.store.scripts import read_lua
from node.topology.ownership import Ownership

MOVE_CHUNK = 200  # keys per move call: read here, restored at the target, dropped here
# Moves in flight at once. Two let one chunk's RESTOREs run at the target while the next
# one's reads run here, and moved a node's removal a fifth faster (its addition 5 %), but
# on cores shared with live checks the copy then ran more at once, and their p99 during
# the moves was 0.5-1.5 ms longer (bench/README.md, `migration`): one.
MOVERS = 1
SCAN_ROUND = 1000  # SCAN COUNT per round inside scan_moving.lua
MIN_PAUSE_S = 0.001  # the shortest pause the copy takes (see Budget.after)
FIND_BATCH = 500  # names examined per find call (one Lua call or a few SCANs)
SLOT_MASK = HASH_SLOTS - 1
# Names classified between two returns to the event loop: a whole SCAN reply at once held
# up live checks, and the moves in flight, whose calls then looked longer to the budget.
YIELD_EVERY = 100
# Slots mode: find moving keys inside Redis (scan_moving.lua) rather than here. Measured
# on one host: the Lua CRC16 costs Redis ~2x the time of SCAN plus binascii.crc_hqx here,
# so it is off; it pays when the node is far from its Redis (only moving names travel).
FIND_IN_REDIS = False

Mover = Callable[[str, list[str]], Awaitable[int]]  # (target, keys) -> keys moved
Scanned = tuple[int, list[bytes], float, float]  # next cursor, names, blocked s, answered at
Chunk = Callable[[str], int]  # target -> keys per move


def _migrate_chunk(target: str) -> int:
    return MOVE_CHUNK


def _owner_at(points: list[Any], owners: list[Any], position: int) -> str:
    """RingPartitioner.owner(): the first point past `position`, wrapping to the first."""
    index = bisect_right(points, position)
    return str(owners[index] if index < len(owners) else owners[0])


class MovingArcs:
    """Ring mode: which node a key moving away from `node_id` goes to, from one MD5
    and one bisect. The ring is cut at every point of the old and new rings; each
    piece has one old and one new owner."""

    def __init__(self, node_id: str, old: RingPartitioner, new: RingPartitioner) -> None:
        old_points, old_owners = (list(x) for x in zip(*old.points(), strict=True))
        new_points, new_owners = (list(x) for x in zip(*new.points(), strict=True))
        cuts = sorted(set(old_points) | set(new_points))
        self.bounds: list[int] = []
        self.targets: list[str | None] = []
        previous: str | int | None = -1  # nothing yet
        for start in [0, *cuts]:
            before = _owner_at(old_points, old_owners, start)
            after = _owner_at(new_points, new_owners, start)
            target = after if before == node_id and after != node_id else None
            if target != previous:
                self.bounds.append(start)
                self.targets.append(target)
                previous = target
        # The bounds as a key's MD5 digest compares with them: a digest is at or past a
        # ring position (its first 8 bytes, big-endian) exactly when it is at or past that
        # position's 8 bytes followed by 8 zero bytes. So the digest is bisected as it is.
        self.digest_bounds = [bound.to_bytes(8, "big") + bytes(8) for bound in self.bounds]


@dataclass
class Budget:
    """Pacing of one source's copy (see the module docstring). Every call of the copy
    moves on one clock, `free_at`: the time before which the source Redis is left to
    live traffic; the finder and the mover both wait for it."""

    busy_pct: int = COPY_BUSY_PCT
    rate: int = 0  # keys/s, 0: no fixed rate
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    started: float | None = None  # when the first call began
    moved: int = 0
    paused_s: float = 0.0  # time the copy waited (the finder's and the mover's at once: once)
    free_at: float = 0.0
    _held_to: float = 0.0  # the end of the waiting counted in paused_s so far
    _span: tuple[float, float] = (0.0, 0.0)  # the calls counted last, merged where they overlap
    # The Redis time of the copy's commands as Redis counts it; None, or once Redis refuses
    # to tell, each call's time as timed here (`blocked_s`).
    redis_time: RedisTime | None = None

    @property
    def counted_by_redis(self) -> bool:
        return self.redis_time is not None and self.redis_time.usable

    async def after(self, blocked_s: float, moved: int = 0, ended: float | None = None) -> None:
        """A copy call that blocked Redis for `blocked_s`, answered at `ended` (now if
        None), has returned: wait, if need be, for live traffic's share of the time."""
        now = self.clock()
        ended = now if ended is None else ended
        if self.started is None:
            self.started = ended - blocked_s
        self.moved += moved
        if 0 < self.busy_pct < 100:
            if self.counted_by_redis:
                assert self.redis_time is not None
                # What the copy's commands took since the last reading, from that reading.
                reading = await self.redis_time.used()
                if reading is not None:
                    used, since = reading
                    self.free_at = max(self.free_at, since) + used * 100 / self.busy_pct
                now = self.clock()
            else:
                busy = self._not_counted(ended - blocked_s, ended)
                # The call's share of the time runs from when it began, or from the end of
                # the last one's if that was later. A gap between them of up to MIN_PAUSE_S
                # (a timer firing late) is credited, a longer one (an idle copy) is not.
                begun = max(self.free_at, ended - busy - MIN_PAUSE_S)
                self.free_at = begun + busy * 100 / self.busy_pct
        if self.rate > 0:
            self.free_at = max(self.free_at, self.started + self.moved / self.rate)
        wait = self.free_at - now
        # Timers fire in whole milliseconds (uvloop rounds a delay to the nearest one, so
        # under half of one to none): a shorter pause is carried on the clock until the
        # pauses add up to one.
        if wait >= MIN_PAUSE_S:
            await self.sleep(wait)  # the budget: give Redis back to live checks
            woke = self.clock()
            self.paused_s += max(0.0, woke - max(now, self._held_to))
            self._held_to = max(self._held_to, woke)

    def _not_counted(self, began: float, ended: float) -> float:
        """The part of [began, ended] that no call counted before covers. The finder's
        SCAN and the movers' calls run at once, and Redis runs one while the others
        wait behind it: each call's time spans that wait, which was Redis' once."""
        first, last = self._span
        if ended <= first:  # wholly before the calls counted last (answered late)
            return ended - began
        if began >= last:
            self._span = (began, ended)
            return ended - began
        self._span = (min(first, began), max(last, ended))
        return max(0.0, first - began) + max(0.0, ended - last)


class Finder:
    """Finds the Redis keys of one source that move, grouped by target."""

    def __init__(
        self,
        client: aioredis.Redis,
        ownership: Ownership,
        sender: Sender,
        *,
        in_redis: bool = FIND_IN_REDIS,
    ) -> None:
        self.client = client
        self.sender = sender  # the copy's own connection to the same Redis, for its SCANs
        self.in_redis = in_redis
        self.ownership = ownership
        self.node_id = ownership.node_id
        self.scan_script = client.register_script(read_lua("scan_moving.lua"))
        new, old = ownership.topology.partitioner, ownership.previous
        self.slot_table: tuple[str, ...] | None = None
        self.slot_targets: list[str | None] | None = None  # slot -> where it moves
        self.bitmap = b""
        self.arcs: MovingArcs | None = None
        if isinstance(new, SlotPartitioner) and isinstance(old, SlotPartitioner):
            self.slot_table = new.table
            self.slot_targets = [None] * HASH_SLOTS
            bits = bytearray(HASH_SLOTS // 8)
            for slot, (before, after) in enumerate(zip(old.table, new.table, strict=True)):
                if before == self.node_id and after != self.node_id:
                    bits[slot >> 3] |= 1 << (slot & 7)
                    self.slot_targets[slot] = after
            self.bitmap = bytes(bits)
        elif isinstance(new, RingPartitioner) and isinstance(old, RingPartitioner):
            self.arcs = MovingArcs(self.node_id, old, new)
        self.blocked_s = 0.0  # how long the last find call kept Redis busy
        self.answered_at: float | None = None  # and when it was answered
        self._ahead: tuple[tuple[int, int], asyncio.Future[Scanned]] | None = None
        # Nothing leaves this node (it only gains, or the change is elsewhere): no SCAN.
        # Removing a node otherwise had every staying node scan all its keys for none.
        self.loses_nothing = (self.slot_targets is not None and not any(self.slot_targets)) or (
            self.arcs is not None and not any(self.arcs.targets)
        )

    async def find(
        self, cursor: int, examine: int, ahead: int = 0
    ) -> tuple[int, int, dict[str, list[str]]]:
        """(next cursor, names examined, target -> Redis keys). `ahead`: the names the
        caller may still examine, this call's included; while it wants more, the next
        SCAN is sent before this one's names are classified (only where the budget
        counts Redis' own time: timed here, a SCAN sent ahead also spans the classifying)."""
        if self.loses_nothing:
            return 0, 0, {}
        if self.slot_table is not None and self.in_redis:
            began = time.monotonic()
            reply = await self.scan_script(keys=[], args=[cursor, SCAN_ROUND, examine, self.bitmap])
            self.answered_at = time.monotonic()
            self.blocked_s = self.answered_at - began
            found: dict[str, list[str]] = {}
            table = self.slot_table
            for i in range(2, len(reply), 2):
                raw = reply[i]
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
                found.setdefault(table[int(reply[i + 1])], []).append(name)
            return int(reply[0]), int(reply[1]), found
        next_cursor, names = await self._scanned(cursor, examine, ahead)
        found = {}
        if self.slot_targets is None and self.arcs is None:
            for raw in names:
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
                limit_key = limit_key_of(name)
                target = self.ownership.moving_away(limit_key) if limit_key else None
                if target is not None:
                    found.setdefault(target, []).append(name)
            return int(next_cursor), len(names), found
        # The hot loop of a copy: bytes as Redis gave them (cluster.model.keys.limit_key_of
        # and cluster.model.partition.routing_part on bytes; "{", "}" and "|" are ASCII, so
        # UTF-8 bytes split where the str would); only moving names are decoded.
        slots, arcs = self.slot_targets, self.arcs
        bounds, targets = (arcs.digest_bounds, arcs.targets) if arcs is not None else ([], [])
        for index, raw in enumerate(names):
            if index and not index % YIELD_EVERY:
                await asyncio.sleep(0)
            if raw[:1] == b"c":
                if raw[9:10] != b"|":
                    continue
                part = raw[10:]
            elif raw[:2] == b"r|":
                pieces = raw.split(b"|", 3)
                if len(pieces) != 4:
                    continue
                part = pieces[3]
            else:
                continue
            start = part.find(b"{")
            if start != -1:
                end = part.find(b"}", start + 1)
                if end > start + 1:
                    part = part[start + 1 : end]
            if slots is not None:
                target = slots[crc_hqx(part, 0) & SLOT_MASK]
            else:
                target = targets[
                    bisect_right(bounds, md5(part, usedforsecurity=False).digest()) - 1
                ]
            if target is not None:
                found.setdefault(target, []).append(raw.decode())
        return int(next_cursor), len(names), found

    async def _scanned(self, cursor: int, examine: int, ahead: int) -> tuple[int, list[bytes]]:
        """One SCAN's reply: the one sent ahead for `cursor`, else one sent now; and,
        while `ahead` wants more names, the next SCAN sent at once."""
        sent, self._ahead = self._ahead, None
        if sent is not None and sent[0] == (cursor, examine):
            scanned = await sent[1]
        else:  # none sent, or not for this call (it finishes unread)
            scanned = await self._scan(cursor, examine)
        next_cursor, names, self.blocked_s, self.answered_at = scanned
        if next_cursor and len(names) < ahead:
            following = asyncio.ensure_future(self._scan(next_cursor, examine))
            following.add_done_callback(_seen)
            self._ahead = ((next_cursor, examine), following)
        return next_cursor, names

    async def _scan(self, cursor: int, examine: int) -> Scanned:
        began = time.monotonic()
        command = ("SCAN", cursor, "MATCH", DATA_KEYS_PATTERN, "COUNT", examine)
        ((next_cursor, names),) = replies_or_raise(await self.sender.execute([command]))
        answered = time.monotonic()
        raws = cast(list[bytes], names)  # neither client decodes
        return int(next_cursor), raws, answered - began, answered


class MovesInFlight:
    """The time during which at least one of the movers' calls was in flight."""

    def __init__(self) -> None:
        self.count = 0
        self.since = 0.0

    def begin(self) -> float:
        now = time.monotonic()
        if not self.count:
            self.since = now
        self.count += 1
        return now

    def end(self) -> float:
        """The time to add to the moves' total: all of it once none is left in flight."""
        self.count -= 1
        return 0.0 if self.count else time.monotonic() - self.since


def _seen(sent: asyncio.Future[Scanned]) -> None:
    """A SCAN sent ahead may end up unread (its step stopped): its error, if any, is
    marked retrieved here, and still raised to whoever awaits it."""
    if not sent.cancelled():
        sent.exception()


async def copy_step(
    finder: Finder,
    move: Mover,
    cursor: int,
    count: int,
    budget: Budget,
    *,
    chunk: Chunk = _migrate_chunk,
    max_s: float | None = None,
) -> dict[str, Any]:
    """Examine up to `count` keys from `cursor` (fewer once `max_s`, by default
    COPY_STEP_MAX_S, has passed: the answer's cursor goes on from there); move those
    that change owner, up to `chunk(target)` keys per move. Finding the next keys
    overlaps with moving the previous ones."""
    queue: asyncio.Queue[tuple[str, list[str]] | None] = asyncio.Queue(maxsize=4)
    totals = {"scanned": 0, "moved": 0, "restored": 0}
    timing = {"find_s": 0.0, "move_s": 0.0, "paused_s": budget.paused_s}
    started = time.monotonic()
    in_flight = MovesInFlight()

    async def mover() -> None:
        while (item := await queue.get()) is not None:
            target, keys = item
            began = in_flight.begin()
            try:
                restored = await move(target, keys)
            finally:
                timing["move_s"] += in_flight.end()
            totals["moved"] += len(keys)
            totals["restored"] += restored
            await budget.after(time.monotonic() - began, len(keys))

    loop = asyncio.get_running_loop()
    movers = [loop.create_task(mover()) for _ in range(MOVERS)]
    moving = asyncio.gather(*movers)
    pending: dict[str, list[str]] = {}

    async def put(item: tuple[str, list[str]] | None) -> None:
        putting = asyncio.ensure_future(queue.put(item))
        either: set[asyncio.Future[Any]] = {putting, moving}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not putting.done():  # the mover stopped on an error: raise it
            putting.cancel()
            await moving

    try:
        while True:
            began = time.monotonic()
            ahead = count - totals["scanned"] if budget.counted_by_redis else 0
            cursor, examined, found = await finder.find(cursor, min(FIND_BATCH, count), ahead)
            timing["find_s"] += time.monotonic() - began
            totals["scanned"] += examined
            for target, keys in found.items():
                buffer = pending.setdefault(target, [])
                buffer += keys
                size = chunk(target)
                while len(buffer) >= size:
                    await put((target, buffer[:size]))
                    del buffer[:size]
            if moving.done():
                break  # the mover failed: its exception is raised below
            if cursor == 0 or totals["scanned"] >= count:
                break
            if time.monotonic() - started >= (COPY_STEP_MAX_S if max_s is None else max_s):
                break  # the names found so far are moved below; the next step goes on
            # Only the Redis call counts: not the classifying here, nor waiting for the mover
            # (which counted its own calls), both of which the budget paid for.
            await budget.after(finder.blocked_s, ended=finder.answered_at)
        for target, buffer in pending.items():
            if buffer:
                await put((target, buffer))
        for _ in movers:
            await put(None)
        await moving
    finally:
        for task in movers:
            if not task.done():
                task.cancel()
        await asyncio.gather(*movers, return_exceptions=True)
    timing["paused_s"] = budget.paused_s - timing["paused_s"]
    timing["seconds"] = time.monotonic() - started
    return {"cursor": cursor, **totals, **{k: round(v, 4) for k, v in timing.items()}}
