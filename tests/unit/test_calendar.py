"""Tests for cluster.model.calendar: natural period boundaries in IANA timezones.

Expected values are computed independently: UTC literals, or
``datetime(..., tzinfo=ZoneInfo(...))`` arithmetic, never the code under test.
"""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from cluster.model.calendar import (
    PERIODS,
    boundaries,
    load_timezone,
    next_start,
    period_label,
    period_start,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOUR = 3_600_000
DAY = 24 * HOUR


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, ms: int = 0
) -> int:
    """Milliseconds of a UTC wall time."""
    dt = datetime(year, month, day, hour, minute, second, ms * 1000, tzinfo=UTC)
    return (dt - EPOCH) // timedelta(milliseconds=1)


def local(
    zone: str,
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    ms: int = 0,
    fold: int = 0,
) -> int:
    """Milliseconds of an (existing) local wall time in ``zone``."""
    dt = datetime(
        year, month, day, hour, minute, second, ms * 1000, tzinfo=ZoneInfo(zone), fold=fold
    )
    return (dt - EPOCH) // timedelta(milliseconds=1)


def to_local(zone: str, instant_ms: int) -> datetime:
    return (EPOCH + timedelta(milliseconds=instant_ms)).astimezone(ZoneInfo(zone))


def check(period: str, zone: str, instant: int, start: int, following: int) -> None:
    """Assert the period containing ``instant`` is exactly [start, following)."""
    tz = load_timezone(zone)
    assert period_start(period, tz, instant) == start
    assert period_start(period, tz, start) == start
    assert period_start(period, tz, following - 1) == start
    assert next_start(period, tz, start) == following
    assert period_start(period, tz, following) == following
    b = boundaries(period, tz, instant)
    assert b[1:3] == (start, following)


# -- load_timezone -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "Mars/Olympus",
        "",
        "../etc/passwd",
        "/etc/localtime",
        "UTC/../UTC",
        "Europe",
        "Europe/",
        "./UTC",
        "Europe\\Paris",
        "UTC\x00",
        "localtime",
        "posixrules",  # host-dependent copies some hosts install, tzdata's list has none
        "posix/Europe/Paris",
        "right/UTC",  # with leap seconds: its days end 27 s from UTC's
    ],
)
def test_load_timezone_rejects(name: str) -> None:
    with pytest.raises(ValueError, match="unknown timezone"):
        load_timezone(name)


@pytest.mark.parametrize("name", ["UTC", "Europe/Paris", "America/Argentina/Buenos_Aires"])
def test_load_timezone_accepts(name: str) -> None:
    tz = load_timezone(name)
    assert isinstance(tz, ZoneInfo)
    assert tz.key == name
    assert load_timezone(name) is tz


def test_unknown_period_rejected() -> None:
    tz = load_timezone("UTC")
    for func in (period_start, next_start, period_label):
        with pytest.raises(ValueError, match="unknown period"):
            func("fortnight", tz, 0)
    with pytest.raises(ValueError, match="unknown period"):
        boundaries("second", tz, 0)
    with pytest.raises(ValueError, match="count"):
        boundaries("day", tz, 0, count=0)


# -- days around DST -----------------------------------------------------------------


def test_paris_spring_forward_day_is_23h() -> None:
    start, following = utc(2026, 3, 28, 23), utc(2026, 3, 29, 22)
    assert following - start == 23 * HOUR
    check("day", "Europe/Paris", utc(2026, 3, 29, 12), start, following)
    assert period_label("day", load_timezone("Europe/Paris"), start) == "2026-03-29"


def test_paris_fall_back_day_is_25h() -> None:
    start, following = utc(2026, 10, 24, 22), utc(2026, 10, 25, 23)
    assert following - start == 25 * HOUR
    check("day", "Europe/Paris", utc(2026, 10, 25, 1, 30), start, following)
    assert period_label("day", load_timezone("Europe/Paris"), start) == "2026-10-25"


def test_lord_howe_dst_days() -> None:
    # DST starts 2026-10-04 02:00 +10:30 -> 02:30 +11:00 (a 23.5 h day).
    start, following = utc(2026, 10, 3, 13, 30), utc(2026, 10, 4, 13)
    assert start == local("Australia/Lord_Howe", 2026, 10, 4)
    assert following == local("Australia/Lord_Howe", 2026, 10, 5)
    assert following - start == 23 * HOUR + 30 * 60_000
    check("day", "Australia/Lord_Howe", utc(2026, 10, 3, 15, 30), start, following)
    # DST ends 2026-04-05 02:00 +11:00 -> 01:30 +10:30 (a 24.5 h day).
    start, following = utc(2026, 4, 4, 13), utc(2026, 4, 5, 13, 30)
    assert following - start == 24 * HOUR + 30 * 60_000
    check("day", "Australia/Lord_Howe", utc(2026, 4, 4, 15), start, following)


# -- hours around DST ----------------------------------------------------------------


def test_paris_fall_back_repeated_hour_is_two_periods() -> None:
    tz = load_timezone("Europe/Paris")
    cest = utc(2026, 10, 25, 0)  # 02:00+02:00
    cet = utc(2026, 10, 25, 1)  # 02:00+01:00
    assert cest == local("Europe/Paris", 2026, 10, 25, 2, fold=0)
    assert cet == local("Europe/Paris", 2026, 10, 25, 2, fold=1)
    check("hour", "Europe/Paris", cest + 30 * 60_000, cest, cet)
    check("hour", "Europe/Paris", cet + 30 * 60_000, cet, utc(2026, 10, 25, 2))
    assert period_label("hour", tz, cest) == "2026-10-25T02:00+02:00"
    assert period_label("hour", tz, cet) == "2026-10-25T02:00+01:00"
    assert period_label("hour", tz, utc(2026, 10, 25, 2)) == "2026-10-25T03:00+01:00"
    assert boundaries("hour", tz, cest) == (
        utc(2026, 10, 24, 23),
        cest,
        cet,
        utc(2026, 10, 25, 2),
    )


def test_paris_spring_forward_skips_hour() -> None:
    tz = load_timezone("Europe/Paris")
    one = utc(2026, 3, 29, 0)  # 01:00+01:00
    three = utc(2026, 3, 29, 1)  # 03:00+02:00
    check("hour", "Europe/Paris", one + 59 * 60_000, one, three)
    check("hour", "Europe/Paris", three, three, utc(2026, 3, 29, 2))
    assert period_label("hour", tz, one) == "2026-03-29T01:00+01:00"
    assert period_label("hour", tz, three) == "2026-03-29T03:00+02:00"
    assert boundaries("hour", tz, one) == (
        utc(2026, 3, 28, 23),
        one,
        three,
        utc(2026, 3, 29, 2),
    )
    # Minutes are continuous across the gap: 01:59 CET is followed by 03:00 CEST.
    assert next_start("minute", tz, three - 60_000) == three
    assert period_label("minute", tz, three - 60_000) == "2026-03-29T01:59"
    assert period_label("minute", tz, three) == "2026-03-29T03:00"


def test_lord_howe_half_hour_shift_hours() -> None:
    tz = load_timezone("Australia/Lord_Howe")
    # Fall back 02:00+11:00 -> 01:30+10:30 at 15:00Z: hour 01 exists twice.
    check(
        "hour",
        "Australia/Lord_Howe",
        utc(2026, 4, 4, 14, 10),
        utc(2026, 4, 4, 14),
        utc(2026, 4, 4, 15),
    )
    check(
        "hour",
        "Australia/Lord_Howe",
        utc(2026, 4, 4, 15, 10),
        utc(2026, 4, 4, 15),
        utc(2026, 4, 4, 15, 30),
    )
    assert period_label("hour", tz, utc(2026, 4, 4, 14)) == "2026-04-05T01:00+11:00"
    assert period_label("hour", tz, utc(2026, 4, 4, 15)) == "2026-04-05T01:00+10:30"
    assert period_label("hour", tz, utc(2026, 4, 4, 15, 30)) == "2026-04-05T02:00+10:30"
    # Spring forward 02:00+10:30 -> 02:30+11:00 at 15:30Z.
    check(
        "hour",
        "Australia/Lord_Howe",
        utc(2026, 10, 3, 15),
        utc(2026, 10, 3, 14, 30),
        utc(2026, 10, 3, 15, 30),
    )
    check(
        "hour",
        "Australia/Lord_Howe",
        utc(2026, 10, 3, 15, 45),
        utc(2026, 10, 3, 15, 30),
        utc(2026, 10, 3, 16),
    )
    assert period_label("hour", tz, utc(2026, 10, 3, 15, 30)) == "2026-10-04T02:00+11:00"


def test_kolkata_hours_at_half_past_utc() -> None:
    tz = load_timezone("Asia/Kolkata")
    instant = utc(2026, 6, 15, 10, 10)  # 15:40 IST
    check("hour", "Asia/Kolkata", instant, utc(2026, 6, 15, 9, 30), utc(2026, 6, 15, 10, 30))
    assert period_label("hour", tz, utc(2026, 6, 15, 9, 30)) == "2026-06-15T15:00+05:30"
    check("day", "Asia/Kolkata", instant, utc(2026, 6, 14, 18, 30), utc(2026, 6, 15, 18, 30))
    assert all(b % HOUR == 30 * 60_000 for b in boundaries("hour", tz, instant))


def test_kathmandu_quarter_hour_offset() -> None:
    tz = load_timezone("Asia/Kathmandu")
    instant = utc(2026, 6, 15, 10, 10)  # 15:55 +05:45
    check("hour", "Asia/Kathmandu", instant, utc(2026, 6, 15, 9, 15), utc(2026, 6, 15, 10, 15))
    assert period_label("hour", tz, utc(2026, 6, 15, 9, 15)) == "2026-06-15T15:00+05:45"
    check("day", "Asia/Kathmandu", instant, utc(2026, 6, 14, 18, 15), utc(2026, 6, 15, 18, 15))
    check("minute", "Asia/Kathmandu", instant + 1, instant, instant + 60_000)
    assert period_label("minute", tz, instant) == "2026-06-15T15:55"


# -- months, years, weeks --------------------------------------------------------------


def test_new_york_month_end() -> None:
    tz = load_timezone("America/New_York")
    last_ms = local("America/New_York", 2026, 1, 31, 23, 59, 59, 999)
    assert last_ms == utc(2026, 2, 1, 4, 59, 59, 999)
    check("month", "America/New_York", last_ms, utc(2026, 1, 1, 5), utc(2026, 2, 1, 5))
    assert period_start("month", tz, last_ms + 1) == utc(2026, 2, 1, 5)
    assert period_label("month", tz, utc(2026, 1, 1, 5)) == "2026-01"
    assert period_label("month", tz, utc(2026, 2, 1, 5)) == "2026-02"
    # March 2026 contains the spring-forward: 31 days minus one hour.
    assert next_start("month", tz, utc(2026, 3, 1, 5)) == utc(2026, 4, 1, 4)


def test_tokyo_year_end() -> None:
    tz = load_timezone("Asia/Tokyo")
    start, following = utc(2025, 12, 31, 15), utc(2026, 12, 31, 15)
    check("year", "Asia/Tokyo", following - 1, start, following)
    assert period_label("year", tz, start) == "2026"
    assert period_label("year", tz, following) == "2027"
    assert boundaries("year", tz, following) == (
        start,
        following,
        utc(2027, 12, 31, 15),
        utc(2028, 12, 31, 15),
    )


def test_los_angeles_year_end() -> None:
    tz = load_timezone("America/Los_Angeles")
    last_ms = local("America/Los_Angeles", 2026, 12, 31, 23, 59, 59, 999)
    assert last_ms == utc(2027, 1, 1, 7, 59, 59, 999)
    check("year", "America/Los_Angeles", last_ms, utc(2026, 1, 1, 8), utc(2027, 1, 1, 8))
    assert period_label("year", tz, period_start("year", tz, last_ms + 1)) == "2027"


def test_berlin_iso_week_across_new_year() -> None:
    tz = load_timezone("Europe/Berlin")
    start = local("Europe/Berlin", 2026, 12, 28)  # Monday
    assert start == utc(2026, 12, 27, 23)
    following = utc(2027, 1, 3, 23)
    for instant in (
        local("Europe/Berlin", 2026, 12, 31, 12),
        local("Europe/Berlin", 2027, 1, 1),
        local("Europe/Berlin", 2027, 1, 3, 23, 59, 59, 999),
    ):
        check("week", "Europe/Berlin", instant, start, following)
    assert period_label("week", tz, start) == "2026-W53"
    assert period_label("week", tz, following) == "2027-W01"
    # The week containing the March DST change is 167 h long.
    mar = local("Europe/Berlin", 2026, 3, 23)
    assert next_start("week", tz, mar) - mar == 167 * HOUR


def test_leap_february_2028() -> None:
    tz = load_timezone("UTC")
    start, following = utc(2028, 2, 1), utc(2028, 3, 1)
    assert following - start == 29 * DAY
    check("month", "UTC", utc(2028, 2, 29, 12), start, following)
    check("day", "UTC", utc(2028, 2, 29, 12), utc(2028, 2, 29), utc(2028, 3, 1))
    assert period_label("day", tz, utc(2028, 2, 29)) == "2028-02-29"
    assert period_label("month", tz, start) == "2028-02"
    assert next_start("year", tz, utc(2028, 1, 1)) - utc(2028, 1, 1) == 366 * DAY


# -- skipped local midnight --------------------------------------------------------------


def first_instant_of_local_date(
    zone: str, lo: int, hi: int, year: int, month: int, day: int
) -> int:
    """Brute force: first whole minute in [lo, hi) whose local date is the given date."""
    target = datetime(year, month, day).date()
    for instant in range(lo, hi, 60_000):
        if to_local(zone, instant).date() >= target:
            return instant
    raise AssertionError("not found")


@pytest.mark.parametrize(
    ("zone", "date", "expected_start", "expected_next"),
    [
        # Chile: 2026-09-06 00:00 -04 -> 01:00 -03.
        ("America/Santiago", (2026, 9, 6), utc(2026, 9, 6, 4), utc(2026, 9, 7, 3)),
        # Cuba: 2026-03-08 00:00 -05 -> 01:00 -04.
        ("America/Havana", (2026, 3, 8), utc(2026, 3, 8, 5), utc(2026, 3, 9, 4)),
        # Lebanon: 2026-03-29 00:00 +02 -> 01:00 +03.
        ("Asia/Beirut", (2026, 3, 29), utc(2026, 3, 28, 22), utc(2026, 3, 29, 21)),
    ],
)
def test_skipped_local_midnight(
    zone: str, date: tuple[int, int, int], expected_start: int, expected_next: int
) -> None:
    tz = load_timezone(zone)
    # The installed tzdata really skips this midnight: it does not round-trip.
    midnight = datetime(*date, tzinfo=ZoneInfo(zone))
    assert midnight.astimezone(UTC).astimezone(ZoneInfo(zone)).replace(tzinfo=None) != (
        midnight.replace(tzinfo=None)
    )
    brute = first_instant_of_local_date(
        zone, expected_start - 3 * HOUR, expected_start + 3 * HOUR, *date
    )
    assert brute == expected_start
    first_local = to_local(zone, expected_start)
    assert (first_local.hour, first_local.minute) == (1, 0)
    assert to_local(zone, expected_start - 1).date() < first_local.date()

    check("day", zone, expected_start + 2 * HOUR, expected_start, expected_next)
    assert expected_next - expected_start == 23 * HOUR
    assert period_label("day", tz, expected_start) == "{:04d}-{:02d}-{:02d}".format(*date)
    # The previous day ends where the skipped midnight would have been.
    assert next_start("day", tz, expected_start - DAY) == expected_start
    assert period_start("day", tz, expected_start - 1) == expected_start - DAY


def test_beirut_fall_back_across_midnight() -> None:
    # 2026-10-25 00:00 +03 -> 2026-10-24 23:00 +02: Oct 24 has 25 h, 23:xx twice.
    tz = load_timezone("Asia/Beirut")
    start, following = utc(2026, 10, 23, 21), utc(2026, 10, 24, 22)
    assert following == local("Asia/Beirut", 2026, 10, 25)
    check("day", "Asia/Beirut", utc(2026, 10, 24, 21, 30), start, following)
    assert period_label("day", tz, start) == "2026-10-24"
    check(
        "hour",
        "Asia/Beirut",
        utc(2026, 10, 24, 20, 30),
        utc(2026, 10, 24, 20),
        utc(2026, 10, 24, 21),
    )
    check("hour", "Asia/Beirut", utc(2026, 10, 24, 21, 30), utc(2026, 10, 24, 21), following)
    assert period_label("hour", tz, utc(2026, 10, 24, 20)) == "2026-10-24T23:00+03:00"
    assert period_label("hour", tz, utc(2026, 10, 24, 21)) == "2026-10-24T23:00+02:00"


def test_first_instant_after_boundary_inside_gap() -> None:
    """The gap search also works for boundaries strictly inside a gap (not only at its start)."""
    from cluster.model.calendar import _first_at_or_after

    paris = load_timezone("Europe/Paris")
    assert _first_at_or_after(paris, datetime(2026, 3, 29, 2, 30)) == utc(2026, 3, 29, 1)
    assert _first_at_or_after(paris, datetime(2026, 3, 29, 2)) == utc(2026, 3, 29, 1)
    assert _first_at_or_after(paris, datetime(2026, 3, 29, 3)) == utc(2026, 3, 29, 1)
    # Repeated time: the earlier occurrence.
    assert _first_at_or_after(paris, datetime(2026, 10, 25, 2, 30)) == utc(2026, 10, 25, 0, 30)
    lord_howe = load_timezone("Australia/Lord_Howe")
    assert _first_at_or_after(lord_howe, datetime(2026, 10, 4, 2, 15)) == utc(2026, 10, 3, 15, 30)
    assert _first_at_or_after(lord_howe, datetime(2026, 10, 4, 1, 59)) == utc(2026, 10, 3, 15, 29)


# -- far future ------------------------------------------------------------------------


def test_year_2200() -> None:
    tz = load_timezone("Europe/Paris")
    instant = local("Europe/Paris", 2199, 7, 1, 12)
    # Summer time under the POSIX rule continues: +02:00.
    assert instant == utc(2199, 7, 1, 10)
    check("day", "Europe/Paris", instant, utc(2199, 6, 30, 22), utc(2199, 7, 1, 22))
    check("year", "Europe/Paris", instant, utc(2198, 12, 31, 23), utc(2199, 12, 31, 23))
    end = local("Europe/Paris", 2200, 12, 31, 23, 59)
    assert next_start("year", tz, period_start("year", tz, end)) == utc(2200, 12, 31, 23)


# -- randomized properties --------------------------------------------------------------

ZONES = (
    "UTC",
    "Europe/Paris",
    "America/New_York",
    "America/Santiago",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "Australia/Lord_Howe",
    "Asia/Beirut",
    "Pacific/Chatham",
    "America/St_Johns",
)

MAX_LENGTH = {
    "minute": 60_000,
    "hour": HOUR,
    "day": 25 * HOUR,
    "week": 7 * DAY + HOUR,
    "month": 31 * DAY + HOUR,
    "year": 366 * DAY + HOUR,
}
MIN_LENGTH = {
    "minute": 1,
    "hour": 1,
    "day": 23 * HOUR,
    "week": 7 * DAY - HOUR,
    "month": 28 * DAY - HOUR,
    "year": 365 * DAY - HOUR,
}


def transitions(zone: str) -> list[int]:
    """UTC instants (ms) where the zone's offset changes in 2026-2030, found by stepping."""
    tz = ZoneInfo(zone)
    found: list[int] = []
    step = timedelta(minutes=15)
    t = datetime(2026, 1, 1, tzinfo=UTC)
    previous = t.astimezone(tz).utcoffset()
    while t.year < 2031:
        offset = t.astimezone(tz).utcoffset()
        if offset != previous:
            found.append((t - EPOCH) // timedelta(milliseconds=1))
        previous = offset
        t += step
    return found


def assert_invariants(period: str, zone: str, instant: int) -> None:
    tz = load_timezone(zone)
    b = boundaries(period, tz, instant)
    assert len(b) == 4
    assert all(x < y for x, y in itertools.pairwise(b)), (period, zone, instant, b)
    assert b[1] <= instant < b[2], (period, zone, instant, b)
    start = period_start(period, tz, instant)
    assert start == b[1]
    assert next_start(period, tz, start) == b[2]
    assert next_start(period, tz, b[0]) == b[1]
    assert next_start(period, tz, b[2]) == b[3]
    assert period_start(period, tz, b[2] - 1) == b[1]
    for x, y in itertools.pairwise(b):
        assert MIN_LENGTH[period] <= y - x <= MAX_LENGTH[period], (period, zone, x, y)
    # Oracle: the instant and its period start share the local wall-clock unit.
    here, first = to_local(zone, instant), to_local(zone, start)
    if period == "minute":
        assert here.utcoffset() == first.utcoffset()
        assert (first.date(), first.hour, first.minute) == (here.date(), here.hour, here.minute)
        assert period_label(period, tz, start) == f"{here:%Y-%m-%dT%H:%M}"
    elif period == "hour":
        assert here.utcoffset() == first.utcoffset()
        assert (first.date(), first.hour) == (here.date(), here.hour)
        assert period_label(period, tz, start).startswith(f"{here:%Y-%m-%dT%H}:00")
    elif period == "day":
        assert first.date() == here.date()
        assert period_label(period, tz, start) == here.date().isoformat()
    elif period == "week":
        iso = here.date().isocalendar()
        assert period_label(period, tz, start) == f"{iso.year:04d}-W{iso.week:02d}"
        assert first.weekday() == 0
    elif period == "month":
        assert (first.year, first.month, first.day) == (here.year, here.month, 1)
    else:
        assert (first.year, first.month, first.day) == (here.year, 1, 1)
    if period not in ("minute", "hour"):
        # Starts at local midnight, or the first instant after a skipped midnight.
        before = to_local(zone, start - 1)
        assert (first.hour, first.minute) == (0, 0) or before.date() < first.date()


def test_random_instants_all_periods() -> None:
    rng = random.Random(20260329)
    lo, hi = utc(2026, 1, 1), utc(2031, 1, 1)
    for i in range(2000):
        zone = ZONES[i % len(ZONES)]
        instant = rng.randrange(lo, hi)
        for period in PERIODS:
            assert_invariants(period, zone, instant)


@pytest.mark.parametrize("zone", ZONES)
def test_instants_around_transitions(zone: str) -> None:
    for transition in transitions(zone):
        for delta in (-HOUR - 1, -HOUR, -1, 0, 1, 30 * 60_000, HOUR - 1, HOUR):
            for period in PERIODS:
                assert_invariants(period, zone, transition + delta)


@pytest.mark.parametrize("zone", ZONES)
def test_consecutive_hours_cover_a_year(zone: str) -> None:
    """Walking next_start hour by hour matches the local wall clock exactly."""
    tz = load_timezone(zone)
    start = period_start("hour", tz, utc(2026, 1, 1))
    end = utc(2027, 1, 1)
    seen: set[str] = set()
    while start < end:
        following = next_start("hour", tz, start)
        assert 0 < following - start <= HOUR
        label = period_label("hour", tz, start)
        assert label not in seen
        seen.add(label)
        start = following
    assert len(seen) >= 365 * 24 - 1
