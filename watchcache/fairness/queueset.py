"""One priority level's seats and queues: kube's fair queuing by virtual finish time, free of I/O.

A request is offered with its flow's hash and its width (seats). It is dealt a hand of the
level's queues (``shuffle.deal``) and joins the one with the fewest seats waiting and in use
(kube's ``shuffleShardLocked``); if that queue already holds ``queue_length_limit`` requests it
is rejected (``queue-full``). A level whose limitResponse is Reject has no queues: a request
finding too few free seats is rejected at once (``concurrency-limit``).

Dispatch is kube's ``queueset``: a virtual clock ``r`` (seat-seconds) advances, per real second,
by min(seats requested, limit) / active queues: the service each active queue would get from a
fluid fair server. A queue that becomes active starts at ``r``; each dispatch from it moves its
``next_r`` on by the request's estimated work (width × ``service_estimate``, kube's 3 ms), and a
request's end corrects that by width × (estimate − actual service). Whenever seats are free the
queue whose head would finish first in virtual time (``next_r`` + the head's work) goes, ties to
the next queue after the last one served (kube's ``robinIndex``). So a flow with one request at
a time goes at the next free seat, backlogged flows share the seats by their requests' real
cost, and a queue's ``next_r`` is never behind its head's arrival (kube's anti-windup bound).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from watchcache.fairness.shuffle import deal

__all__ = ["SERVICE_ESTIMATE", "Entry", "QueueSet"]

WAITING = "waiting"
EXECUTING = "executing"
REJECTED = "rejected"
CANCELLED = "cancelled"
DONE = "done"

#: kube's estimatedServiceDuration: the work a seat is assumed to do per request before it ends.
SERVICE_ESTIMATE = 0.003


class Entry:
    """A request offered to a queue set; ``payload`` is the caller's (a future, in ``controller``)."""

    __slots__ = ("arrival_r", "payload", "queue", "reason", "seats", "started", "state")

    def __init__(self, payload: Any, seats: int) -> None:
        self.payload = payload
        self.seats = seats
        self.queue = -1
        self.state = WAITING
        self.reason = ""
        self.arrival_r = 0.0
        self.started = 0.0


class _Queue:
    __slots__ = ("executing", "next_r", "seats_in_use", "seats_waiting", "waiting")

    def __init__(self) -> None:
        self.waiting: deque[Entry] = deque()
        self.seats_waiting = 0
        self.seats_in_use = 0
        self.executing = 0
        self.next_r = 0.0  # virtual time at which its next request starts (kube's nextDispatchR)

    def active(self) -> bool:
        return bool(self.waiting) or self.executing > 0


class QueueSet:
    """Seats ``limit``; ``queues`` queues (0: reject instead of queuing), hands of ``hand_size``; ``clock``
    gives real time in seconds (the core reads none itself)."""

    __slots__ = (
        "_active",
        "_backlogged",
        "_last",
        "_robin",
        "_seats_requested",
        "clock",
        "demand_changed",
        "executing",
        "hand_size",
        "limit",
        "queue_length_limit",
        "queues",
        "r",
        "seats_in_use",
        "service_estimate",
        "waiting",
    )

    def __init__(
        self,
        limit: int,
        queues: int = 0,
        hand_size: int = 1,
        queue_length_limit: int = 0,
        *,
        clock: Callable[[], float],
        service_estimate: float = SERVICE_ESTIMATE,
    ) -> None:
        self.limit = limit
        self.hand_size = hand_size
        self.queue_length_limit = queue_length_limit
        self.queues = [_Queue() for _ in range(queues)]
        self.clock = clock
        self.service_estimate = service_estimate
        self.executing = 0  # requests executing
        self.seats_in_use = 0
        self.waiting = 0
        self.r = 0.0  # the virtual clock, in seat-seconds (kube's currentR)
        self._last = clock()
        self._robin = -1
        self._active = 0  # queues with requests waiting or executing
        self._seats_requested = 0  # seats in use and waiting, over the queues
        self._backlogged: set[int] = set()  # queues with requests waiting
        # Told the seats in use and waiting whenever they change (kube's seat demand, for borrowing).
        self.demand_changed: Callable[[int], None] | None = None

    # -- the virtual clock

    def _sync(self) -> None:
        """Advance ``r`` to now at the rate of the last interval (kube's ``syncTimeLocked``)."""
        now = self.clock()
        if self._active:
            rate = min(self._seats_requested, self.limit) / self._active
            self.r += rate * max(0.0, now - self._last)
        self._last = now

    # -- requests

    def offer(self, hash_value: int, payload: Any, seats: int = 1) -> Entry:
        """A new request: ``state`` executing (its seats are its), waiting, or rejected with ``reason``."""
        entry = Entry(payload, max(1, seats))
        if not self.queues:
            if self._fits(entry.seats):
                self._seat(entry)
                self._demand()
            else:
                entry.state, entry.reason = REJECTED, "concurrency-limit"
            return entry
        self._sync()
        hand = deal(hash_value, len(self.queues), self.hand_size)
        best = min(hand, key=lambda q: self.queues[q].seats_waiting + self.queues[q].seats_in_use)
        queue = self.queues[best]
        if len(queue.waiting) >= self.queue_length_limit:
            entry.state, entry.reason = REJECTED, "queue-full"
            return entry
        if not queue.active():
            queue.next_r = self.r
            self._active += 1
        entry.queue = best
        entry.arrival_r = self.r
        queue.waiting.append(entry)
        queue.seats_waiting += entry.seats
        self._seats_requested += entry.seats
        self._backlogged.add(best)
        self.waiting += 1
        self._bound(queue)  # a queue with requests executing, none waiting, may be behind ``r``
        self.dispatch()
        self._demand()
        return entry

    def cancel(self, entry: Entry, reason: str) -> bool:
        """Take a waiting request out of its queue (its wait ended first); False if it was dispatched."""
        if entry.state != WAITING:
            return False
        self._sync()
        queue = self.queues[entry.queue]
        queue.waiting.remove(entry)
        self._unqueued(entry.queue, entry)
        if not queue.active():
            self._active -= 1
        entry.state, entry.reason = CANCELLED, reason
        self._bound(queue)
        self._demand()
        return True

    def finish(self, entry: Entry) -> list[Entry]:
        """An executing request ended: its seats go to the next; returns the requests dispatched."""
        if entry.state != EXECUTING:
            return []
        self._sync()
        entry.state = DONE
        self.executing -= 1
        self.seats_in_use -= entry.seats
        if entry.queue >= 0:
            queue = self.queues[entry.queue]
            queue.executing -= 1
            queue.seats_in_use -= entry.seats
            self._seats_requested -= entry.seats
            if not queue.active():
                self._active -= 1
            # The estimate charged at dispatch, corrected by the service it really took.
            served = max(0.0, self.clock() - entry.started)
            queue.next_r -= entry.seats * (self.service_estimate - served)
            self._bound(queue)
        out = self.dispatch()
        self._demand()
        return out

    def set_limit(self, limit: int) -> list[Entry]:
        self._sync()
        self.limit = limit
        return self.dispatch()

    def dispatch(self) -> list[Entry]:
        """While seats are free, the head of the queue with the earliest virtual finish."""
        out: list[Entry] = []
        while self.waiting and self.seats_in_use < self.limit:
            q = self._earliest()
            queue = self.queues[q]
            entry = queue.waiting[0]
            if not self._fits(entry.seats):
                break  # kube: the robin index stays; the seats free up as requests end
            queue.waiting.popleft()
            self._unqueued(q, entry)
            self._robin = q
            queue.executing += 1
            queue.seats_in_use += entry.seats
            self._seats_requested += entry.seats
            self._seat(entry)
            queue.next_r += entry.seats * self.service_estimate
            self._bound(queue)
            out.append(entry)
        return out

    # -- helpers

    def _demand(self) -> None:
        if self.demand_changed is not None:
            self.demand_changed(self._seats_requested if self.queues else self.seats_in_use)

    def _earliest(self) -> int:
        """kube's ``findDispatchQueueToBoundLocked``: the least ``next_r`` + head's work; ties go to the
        first queue after the last one served."""
        n = len(self.queues)
        robin = self._robin
        best, key = -1, (0.0, 0)
        for q in self._backlogged:
            queue = self.queues[q]
            k = (queue.next_r + queue.waiting[0].seats * self.service_estimate, (q - robin - 1) % n)
            if best < 0 or k < key:
                best, key = q, k
        return best

    def _bound(self, queue: _Queue) -> None:
        """kube's anti-windup: a queue's next dispatch is not earlier, virtually, than its head's arrival."""
        if queue.waiting and queue.next_r < queue.waiting[0].arrival_r:
            queue.next_r = queue.waiting[0].arrival_r

    def _unqueued(self, q: int, entry: Entry) -> None:
        queue = self.queues[q]
        queue.seats_waiting -= entry.seats
        self._seats_requested -= entry.seats
        self.waiting -= 1
        if not queue.waiting:
            self._backlogged.discard(q)

    def _fits(self, seats: int) -> bool:
        """kube's ``canAccommodateSeatsLocked``: wider than the level, it goes alone."""
        if seats > self.limit:
            return self.executing == 0
        return self.seats_in_use + seats <= self.limit

    def _seat(self, entry: Entry) -> None:
        entry.state = EXECUTING
        entry.started = self.clock()
        self.executing += 1
        self.seats_in_use += entry.seats
