"""A request's work estimate (its width in seats), as kube-apiserver v1.36 estimates it; free of I/O.

kube's ``request/width.go``: a LIST (and a WATCH that begins with its initial events:
``sendInitialEvents=true``, or a legacy watch from resourceVersion "" or "0") is estimated by the
memory its answer holds at once (``list_work_estimator.go``, ``seatsBasedOnObjectSize``: the
``SizeBasedListCostEstimate`` gate, on by default since v1.34): objects loaded × their average
size, at most 1 MB for a read the watch cache answers, one seat per 100 kB; at least one seat, at
most the level's maximum. Every other request takes one seat. The proxy answers its cached reads
from its cache, so each is estimated as kube estimates a read from its watch cache; the object
count and bytes are the cache's own (``ObjectStats``, a dict lookup away). A resource with no cache
here is passed through: kube's answer for a resource whose count it does not know (an aggregated
API, served elsewhere) is the minimum, one seat, and so is it here: the upstream does the work,
under its own flow control, and the request gives its seat up while it waits for the upstream.

kube's estimate for mutating requests (one seat, then ``watchers / 10`` seats for 5 ms each after
the request ends, for its watch events) is not made: the proxy passes writes through and the
fan-out of their events is its reflector's work when the upstream's event arrives, not the
write's; the upstream charges its own writers for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from watchcache.selectors.errors import SelectorError
from watchcache.selectors.fields import unescape_field_value

__all__ = [
    "MAXIMUM_LIST_SEATS",
    "MINIMUM_SEATS",
    "ObjectStats",
    "estimate",
    "level_max_seats",
    "list_seats",
]

#: kube's ``MinimumSeats``.
MINIMUM_SEATS = 1
#: kube's ``MaximumListSeatsLimit`` with SizeBasedListCostEstimate on (10 without it).
MAXIMUM_LIST_SEATS = 100
#: kube's ``bytesPerSeat``.
BYTES_PER_SEAT = 100_000
#: kube's ``cacheWithStreamingMaxMemoryUsage``: what a read from the watch cache holds at most.
CACHE_MAX_MEMORY = 1_000_000
#: kube's ``maxObjectSize``: the size assumed for objects of unknown size.
MAX_OBJECT_SIZE = 1_500_000
#: kube's ``priorityLevelMaxSeatsPercent``.
MAX_SEATS_FRACTION = 0.15


@dataclass(frozen=True, slots=True)
class ObjectStats:
    """What kube's storage tells its estimator (``storage.Stats``): objects stored, their total bytes."""

    count: int
    bytes: int


def level_max_seats(nominal: int, hand_size: int) -> int:
    """The widest request a queuing level takes (kube's ``MaxSeatsTracker``, set in apf_controller.go):
    max(1, min(ceil(15% of its nominal seats), nominal seats / hand size)); 0 for a level without
    queues (no maximum of its own: the estimators' limits apply)."""
    if hand_size <= 0:
        return 0
    return max(1, min(math.ceil(nominal * MAX_SEATS_FRACTION), nominal // hand_size))


def list_seats(stats: ObjectStats | None, *, single: bool, limit: int, max_seats: int) -> int:
    """kube's ``seatsBasedOnObjectSize`` for a read from the watch cache: ``single`` when it names one
    object (``metadata.name``), ``limit`` its page size (0: none). None: no count known (one seat)."""
    if max_seats <= 0 or max_seats > MAXIMUM_LIST_SEATS:
        max_seats = MAXIMUM_LIST_SEATS
    if stats is None:
        return MINIMUM_SEATS
    average = stats.bytes // stats.count if stats.count > 0 else 0
    if average <= 0 and stats.count != 0:
        average = MAX_OBJECT_SIZE
    loaded = 1 if single else min(stats.count, limit) if limit > 0 else stats.count
    memory = min(loaded * average, CACHE_MAX_MEMORY)
    seats = math.ceil(memory / BYTES_PER_SEAT)
    return max(MINIMUM_SEATS, min(seats, max_seats))


def estimate(
    verb: str,
    name: str,
    query: Callable[[str], str | None],
    stats: Callable[[], ObjectStats | None],
    max_seats: int,
) -> int:
    """The seats of a request with RequestInfo ``verb`` and ``name``, its query parameters (``query``),
    its resource's object stats (asked only for a LIST or an initial-events WATCH) and its level's
    ``max_seats`` (``level_max_seats``)."""
    if verb not in ("list", "watch"):
        return MINIMUM_SEATS
    try:
        limit = _int(query("limit"))
        _int(query("timeoutSeconds"))
    except ValueError:
        # kube: the options do not convert; the request will fail validation: the level's maximum.
        return MAXIMUM_LIST_SEATS if max_seats <= 0 or max_seats > MAXIMUM_LIST_SEATS else max_seats
    if verb == "watch" and not _bool(query("sendInitialEvents")) and query("resourceVersion") not in (None, "", "0"):
        return MINIMUM_SEATS  # no initial events: a watch is cheap until then
    single = bool(name) or _named(query("fieldSelector"))
    return list_seats(stats(), single=single, limit=limit, max_seats=max_seats)


def _named(selector: str | None) -> bool:
    """kube's RequestInfo takes a LIST's or WATCH's name from ``fieldSelector=metadata.name=x``."""
    if not selector or "metadata.name" not in selector:
        return False
    for term in selector.split(","):
        field, eq, value = term.partition("=")
        if not eq or field != "metadata.name":
            continue
        value = value.removeprefix("=")
        try:
            value = unescape_field_value(value)
        except SelectorError:
            return False
        # kube's IsPathSegmentName: a name that can be a path segment.
        return value not in (".", "..") and "/" not in value and "%" not in value
    return False


def _int(value: str | None) -> int:
    """Go's ``strconv.ParseInt`` as the query's conversion uses it: absent is 0, else ``ValueError``
    unless a decimal int64 ("" included)."""
    if value is None:
        return 0
    text = value[1:] if value[:1] in ("+", "-") else value
    if not text.isascii() or not text.isdigit():
        raise ValueError(value)
    number = int(value)
    if not -(2**63) <= number < 2**63:
        raise ValueError(value)
    return number


def _bool(value: str | None) -> bool:
    """apimachinery's conversion of a query's bool: absent, "0" and "false" (any case) are false, any
    other value (even empty) true; it never fails."""
    return value is not None and value != "0" and value.lower() != "false"
