"""In-flight seats (``--max-requests-inflight``): held by work, given up while a request waits.

A request that waits (for a TokenReview or SubjectAccessReview, a proof of the cache's
freshness, a backfill, or the upstream's answer) does no work meanwhile; holding a seat then
only turns other clients' requests into 429s (issue: a quiet client got 68 of 180 requests
refused while a noisy one's consistent LISTs waited). So a waiting request gives its seat back
and is counted as waiting instead, and takes a seat again, without a limit check, when it has
work to do: it was admitted once. What bounds the waiting is ``max_waiting`` (a request that
finds it full keeps its seat while it waits, as before) and each wait's own deadline (invariant 14);
a pass-through also waits for its flow's turn at the upstream, of as many as its priority level has
seats (``WaitingForUpstream``; ``fairness.controller.Grant.upstream_turn``), without a seat too.

The seat of the request being handled is found through a context variable, so that the read
path (``dispatch/reads.py``, through ``ApiContext.waiting``) marks its waits without a seat threaded
through every call.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Protocol


class Seats:
    """One worker's seats: how many requests work (by kind, as kube's metric) and how many wait."""

    __slots__ = ("active", "active_by_kind", "max_waiting", "waiting")

    def __init__(self, max_waiting: int) -> None:
        self.active = 0
        self.active_by_kind = {"readOnly": 0, "mutating": 0}
        self.waiting = 0
        self.max_waiting = max_waiting


class Lent(Protocol):
    """The seat of a priority level behind this one (``fairness.controller.Grant``): lent and given back alike."""

    def release(self) -> None: ...
    def vacate(self) -> None: ...
    def take_upstream_turn(self) -> bool: ...
    async def upstream_turn(self, wait: float | None) -> None: ...
    def end_upstream_turn(self) -> None: ...


class Seat:
    """One request's seat, given back once at its end (or when a watch starts); vacated while it waits.

    ``grant``: its priority level's seat (API Priority and Fairness), vacated and given back with it.
    """

    __slots__ = ("grant", "held", "kind", "seats", "vacated")

    def __init__(self, seats: Seats, kind: str, grant: Lent | None = None) -> None:
        self.seats = seats
        self.kind = kind
        self.grant = grant
        self.held = True
        self.vacated = False
        seats.active += 1
        seats.active_by_kind[kind] += 1

    def release(self) -> None:
        if self.vacated:
            self._return()
        if self.held:
            self.held = False
            self.seats.active -= 1
            self.seats.active_by_kind[self.kind] -= 1
            if self.grant is not None:
                self.grant.release()

    def vacate(self) -> bool:
        """Give the seat up while waiting; False if it is kept (not held, or too many waiting)."""
        seats = self.seats
        if not self.held or self.vacated or seats.waiting >= seats.max_waiting:
            return False
        if self.grant is not None:
            self.grant.vacate()
        self.vacated = True
        seats.active -= 1
        seats.active_by_kind[self.kind] -= 1
        seats.waiting += 1
        return True

    def _return(self) -> None:
        self.vacated = False
        seats = self.seats
        seats.waiting -= 1
        seats.active += 1
        seats.active_by_kind[self.kind] += 1

    def reoccupy(self) -> None:
        """Back to work: the seat again, whatever the count (the request was admitted once)."""
        if self.vacated:
            self._return()


current: contextvars.ContextVar[Seat | None] = contextvars.ContextVar("watchcache_seat", default=None)


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """While entered, the current request (if it holds a seat) waits without it (``Seat.vacate``)."""
    seat = current.get()
    if seat is None or not seat.vacate():
        yield
        return
    try:
        yield
    finally:
        seat.reoccupy()


class WaitingForUpstream:
    """``waiting``, for a pass-through's answer, after its flow's turn at the upstream (waited for at
    most ``wait`` s, without the seat: ``fairness.controller.Rejected`` past it). A class, not a
    generator: every passed-through GET enters it."""

    __slots__ = ("grant", "seat", "vacated", "wait")

    def __init__(self, wait: float | None) -> None:
        self.wait = wait
        self.seat = current.get()
        self.grant = None if self.seat is None else self.seat.grant
        self.vacated = False

    async def __aenter__(self) -> None:
        seat = self.seat
        if seat is None:
            return
        self.vacated = seat.vacate()
        grant = self.grant
        if grant is not None and not grant.take_upstream_turn():
            try:
                await grant.upstream_turn(self.wait)
            except BaseException:
                self._reoccupy()
                raise

    async def __aexit__(self, *exc: object) -> None:
        if self.grant is not None:
            self.grant.end_upstream_turn()
        self._reoccupy()

    def _reoccupy(self) -> None:
        if self.vacated:
            self.vacated = False
            assert self.seat is not None
            self.seat.reoccupy()
