"""Natural calendar periods (minute ... year) in an IANA timezone.

Calendar limits count per natural period. The counter node computes period
boundaries here and hands them to a Lua script, which picks the period that
contains Redis' clock. All instants are integer milliseconds since the Unix
epoch (UTC); results are UTC instants too.

Contract:

* Periods are defined by local wall-clock time in ``tz``. Consecutive periods
  partition the timeline: every instant lies in exactly one period
  ``[start, next_start)``, and every period is non-empty.
* ``day``, ``week``, ``month`` and ``year`` begin at local midnight (weeks are
  ISO weeks starting Monday 00:00, months on the 1st, years on 1 January).
  A period's start is the first instant whose local time is at or after its
  local boundary. If local midnight does not exist (a DST gap at 00:00, as in
  America/Santiago, America/Havana or Asia/Beirut) the period starts at the
  first existing instant after it, e.g. 01:00 local. A day therefore lasts
  23, 24 or 25 hours around DST transitions (23.5/24.5 h in Lord Howe).
  When a fall-back repeats the end of a day (e.g. 00:00 -> 23:00 of the day
  before), the repeated time still belongs to the earlier day.
* ``minute`` and ``hour`` periods follow the local wall clock *and* the UTC
  offset: a period is identified by (local minute/hour, UTC offset). On a
  fall-back day the repeated local hour is two separate periods, one per
  offset. On spring-forward the skipped hour does not exist; the previous
  hour's period ends where the next existing hour begins. A transition that
  is not on an hour boundary (Lord Howe's 30-minute shift) starts a new,
  shorter period at the transition instant. Half-hour and 45-minute offset
  zones (Asia/Kolkata, Asia/Kathmandu) get hour periods aligned to their
  local clock, i.e. at :30 or :15 past the UTC hour.
* Labels (``period_label``) come from the local time at the period start:
  minute ``2026-03-29T02:05``, hour ``2026-10-25T02:00+01:00`` (with offset,
  so a repeated hour is distinguishable), day ``2026-03-29``, week
  ``2026-W53`` (ISO year and week), month ``2026-03``, year ``2026``.
* Functions are pure. Instants from 1970 up to year 2200 are supported.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import cache, lru_cache
from zoneinfo import ZoneInfo

__all__ = [
    "PERIODS",
    "boundaries",
    "load_timezone",
    "next_start",
    "period_label",
    "period_start",
]

PERIODS: tuple[str, ...] = ("minute", "hour", "day", "week", "month", "year")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_UNIT_MS = {"minute": 60_000, "hour": 3_600_000}
_DATE_PERIODS = frozenset({"day", "week", "month", "year"})
# Relative path of plain components: no '.', '..', empty parts, backslashes or NULs.
_TZ_NAME = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")
# Names valid to ZoneInfo but host-dependent: nodes would disagree on boundaries. The
# posix/ and right/ trees are copies of the zones that some hosts install (right/ counts
# leap seconds: its days end 27 s away from UTC's); tzdata's own list has neither.
_HOST_DEPENDENT = frozenset({"localtime", "posixrules"})
_HOST_TREES = ("posix/", "right/")


@cache
def load_timezone(name: str) -> ZoneInfo:
    """Return the ZoneInfo for an IANA name; ValueError if unknown or invalid."""
    if (
        not isinstance(name, str)
        or not _TZ_NAME.fullmatch(name)
        or name in _HOST_DEPENDENT
        or name.startswith(_HOST_TREES)
    ):
        raise ValueError(f"unknown timezone {name!r}")
    try:
        return ZoneInfo(name)
    except Exception as exc:  # ZoneInfoNotFoundError, ValueError, OSError, ...
        raise ValueError(f"unknown timezone {name!r}") from exc


# -- instant <-> local time helpers -------------------------------------------------


def _local(instant_ms: int, tz: ZoneInfo) -> datetime:
    """Aware local datetime (fold set) of an instant."""
    return (_EPOCH + timedelta(milliseconds=instant_ms)).astimezone(tz)


def _to_ms(dt: datetime) -> int:
    """Instant (ms) of an aware datetime."""
    return (dt - _EPOCH) // _MS


def _offset(instant_ms: int, tz: ZoneInfo) -> timedelta | None:
    return _local(instant_ms, tz).utcoffset()


def _first_true(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """Smallest x in (lo, hi] with pred(x), given pred(lo) false, pred(hi) true, monotone."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid
    return hi


@lru_cache(maxsize=8192)
def _first_at_or_after(tz: ZoneInfo, boundary: datetime) -> int:
    """First instant whose local time (naive) is at or after the naive ``boundary``."""
    ms0 = _to_ms(boundary.replace(tzinfo=tz, fold=0))
    if _local(ms0, tz).replace(tzinfo=None) == boundary:
        return ms0  # exists; fold=0 is the earlier occurrence if repeated
    # In a gap: the transition lies between the two fold interpretations.
    ms1 = _to_ms(boundary.replace(tzinfo=tz, fold=1))
    lo, hi = min(ms0, ms1), max(ms0, ms1)
    return _first_true(lo, hi, lambda ms: _local(ms, tz).replace(tzinfo=None) >= boundary)


# -- minute / hour: wall clock + offset ---------------------------------------------


def _floor_unit(period: str, naive: datetime) -> datetime:
    if period == "hour":
        return naive.replace(minute=0, second=0, microsecond=0)
    return naive.replace(second=0, microsecond=0)


def _clock_start(period: str, tz: ZoneInfo, instant_ms: int) -> int:
    local = _local(instant_ms, tz)
    off = local.utcoffset()
    naive = local.replace(tzinfo=None)
    candidate = instant_ms - (naive - _floor_unit(period, naive)) // _MS
    if _offset(candidate, tz) == off:
        return candidate
    # The offset changed inside this local unit: the period starts at the transition.
    return _first_true(candidate, instant_ms, lambda ms: _offset(ms, tz) == off)


def _clock_next(period: str, tz: ZoneInfo, instant_ms: int) -> int:
    local = _local(instant_ms, tz)
    off = local.utcoffset()
    naive = local.replace(tzinfo=None)
    end = instant_ms + (_floor_unit(period, naive) - naive) // _MS + _UNIT_MS[period]
    if end - 1 <= instant_ms or _offset(end - 1, tz) == off:
        return end
    # A transition before the wall-clock boundary starts a new period.
    return _first_true(instant_ms, end - 1, lambda ms: _offset(ms, tz) != off)


# -- day / week / month / year: local midnights -------------------------------------


def _date_boundary(period: str, naive: datetime) -> datetime:
    """Naive local boundary of the date period containing ``naive``."""
    day = naive.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    return day.replace(month=1, day=1)


def _shift(period: str, boundary: datetime, steps: int) -> datetime:
    """Move a naive local boundary by ``steps`` periods."""
    if period == "day":
        return boundary + timedelta(days=steps)
    if period == "week":
        return boundary + timedelta(weeks=steps)
    if period == "month":
        months = boundary.year * 12 + boundary.month - 1 + steps
        return boundary.replace(year=months // 12, month=months % 12 + 1)
    return boundary.replace(year=boundary.year + steps)


def _date_start(period: str, tz: ZoneInfo, instant_ms: int) -> int:
    boundary = _date_boundary(period, _local(instant_ms, tz).replace(tzinfo=None))
    start = _first_at_or_after(tz, boundary)
    while start > instant_ms:  # defensive: local time jumped back over a boundary
        boundary = _shift(period, boundary, -1)
        start = _first_at_or_after(tz, boundary)
    following = _first_at_or_after(tz, _shift(period, boundary, 1))
    while following <= instant_ms:  # empty periods, or a fall-back repeating a day's end
        boundary = _shift(period, boundary, 1)
        start = following
        following = _first_at_or_after(tz, _shift(period, boundary, 1))
    return start


def _date_next(period: str, tz: ZoneInfo, instant_ms: int) -> int:
    boundary = _date_boundary(period, _local(instant_ms, tz).replace(tzinfo=None))
    following = _first_at_or_after(tz, _shift(period, boundary, 1))
    while following <= instant_ms:
        boundary = _shift(period, boundary, 1)
        following = _first_at_or_after(tz, _shift(period, boundary, 1))
    return following


# -- public API ---------------------------------------------------------------------


def _check_period(period: str) -> None:
    if period not in PERIODS:
        raise ValueError(f"unknown period {period!r}; expected one of {', '.join(PERIODS)}")


def period_start(period: str, tz: ZoneInfo, instant_ms: int) -> int:
    """Start (ms, UTC) of the natural period containing ``instant_ms`` in ``tz``."""
    _check_period(period)
    if period in _DATE_PERIODS:
        return _date_start(period, tz, instant_ms)
    return _clock_start(period, tz, instant_ms)


def next_start(period: str, tz: ZoneInfo, start_ms: int) -> int:
    """Start of the period following the one that starts at (or contains) ``start_ms``."""
    _check_period(period)
    if period in _DATE_PERIODS:
        return _date_next(period, tz, start_ms)
    return _clock_next(period, tz, start_ms)


def boundaries(period: str, tz: ZoneInfo, instant_ms: int, count: int = 4) -> tuple[int, ...]:
    """``count`` consecutive starts, beginning one period before the one holding the instant.

    With the default count: (previous, current, next, the one after), so that
    ``result[1] <= instant_ms < result[2]``.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    current = period_start(period, tz, instant_ms)
    starts = [period_start(period, tz, current - 1), current][:count]
    while len(starts) < count:
        starts.append(next_start(period, tz, starts[-1]))
    return tuple(starts)


def _format_offset(offset: timedelta | None) -> str:
    seconds = int((offset or timedelta()).total_seconds())
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{sign}{hours:02d}:{minutes:02d}"
    return f"{text}:{secs:02d}" if secs else text


def period_label(period: str, tz: ZoneInfo, start_ms: int) -> str:
    """Human label of the period starting at ``start_ms`` (local time at its start)."""
    _check_period(period)
    local = _local(start_ms, tz)
    if period == "minute":
        return f"{local:%Y-%m-%dT%H:%M}"
    if period == "hour":
        return f"{local:%Y-%m-%dT%H}:00{_format_offset(local.utcoffset())}"
    if period == "day":
        return local.date().isoformat()
    if period == "week":
        iso = local.date().isocalendar()
        return f"{iso.year:04d}-W{iso.week:02d}"
    if period == "month":
        return f"{local.year:04d}-{local.month:02d}"
    return f"{local.year:04d}"
