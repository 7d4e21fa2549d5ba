"""Ages as kube prints them: apimachinery's ``duration.HumanDuration``, and RFC 3339 times.

Times are integers of nanoseconds since the epoch, as Go's ``time.Since`` subtracts them: a
table cell is ``human_duration(now - created)`` with ``now`` the request's wall clock
(``time.time_ns()``, injected by the caller: nothing here reads a clock).
"""

from __future__ import annotations

import functools
import re

SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})", re.ASCII)


def _trunc_div(a: int, b: int) -> int:
    """Go's integer division (towards zero)."""
    q = abs(a) // b
    return q if a >= 0 else -q


def human_duration(d: int) -> str:
    """``duration.HumanDuration(d)``: ~2-3 significant figures; a clock skew of up to 2 s reads as now."""
    seconds = _trunc_div(d, SECOND)
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 60 * 2:
        return f"{seconds}s"
    minutes = d // MINUTE
    if minutes < 10:
        s = (d // SECOND) % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = d // HOUR
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def parse_time(value: object) -> int | None:
    """A ``metav1.Time`` as kube decodes it, in ns since the epoch (see ``_parse_time``)."""
    if not isinstance(value, str):
        return None
    # Objects share their times (made in the same second, restarted at the same moment): memoized,
    # for strings no longer than a time usually is (the cache stays small whatever objects hold).
    return _cached_parse(value) if len(value) <= 40 else _parse_time(value)


def _parse_time(value: str) -> int | None:
    """A ``metav1.Time`` as kube decodes it (``time.Parse(time.RFC3339, ...)``), in ns since the epoch.

    None for a value that is not an RFC 3339 string (kube: a decoding error); ``ZERO_TIME`` for
    Go's zero time. Absent or null: the caller's zero.
    """
    m = _RFC3339.fullmatch(value)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= _month_days(year, month)):
        return None
    if hour > 23 or minute > 59 or second > 59:
        return None
    fraction = m.group(7)
    nanos = int((fraction[1:] + "000000000")[:9]) if fraction else 0
    zone = m.group(8)
    offset = 0
    if zone != "Z":
        zh, zm = int(zone[1:3]), int(zone[4:6])
        if zh > 23 or zm > 59:
            return None
        offset = (zh * 3600 + zm * 60) * (1 if zone[0] == "+" else -1)
    days = _days_from_civil(year, month, day)
    return ((days * 86400 + hour * 3600 + minute * 60 + second - offset) * SECOND) + nanos


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year, unlike ``calendar.timegm``'s range)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _month_days(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


# Go's zero time.Time (0001-01-01T00:00:00Z) in nanoseconds since the epoch: ``IsZero``.
ZERO_TIME = _days_from_civil(1, 1, 1) * 86400 * SECOND


_cached_parse = functools.lru_cache(maxsize=8192)(_parse_time)
