"""One priority level's seats and queues: fair queuing with shuffle sharding, free of I/O.

A request is offered with its flow's hash. It is dealt a hand of the level's queues
(``shuffle.deal``) and joins the shortest, counting the requests waiting in it and those it
dispatched that still execute (kube's queue choice); if that queue already holds
``queue_length_limit`` requests it is rejected (``queue-full``). A level whose limitResponse is
Reject has no queues: a request finding no free seat is rejected at once
(``concurrency-limit``). Whenever a seat is free, the next request goes from the queues in
round-robin order, one request per non-empty queue per round, a queue that just became
non-empty first (FQ-CoDel's new and old lists): a flow with one request at a time (below its
fair share) goes at the next free seat, and a flow that keeps its queues full gets one request
per round like every other. kube orders its queues by virtual finish time, which gives a newly
active queue the same precedence and also weighs how long each queue's requests execute; this
weighs every request alike (kube's work estimates, seats per request > 1, are not done here
either: every request takes one seat).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from watchcache.fairness.shuffle import deal

__all__ = ["Entry", "QueueSet"]

WAITING = "waiting"
EXECUTING = "executing"
REJECTED = "rejected"
CANCELLED = "cancelled"
DONE = "done"


class Entry:
    """A request offered to a queue set; ``payload`` is the caller's (a future, in ``controller``)."""

    __slots__ = ("payload", "queue", "reason", "state")

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.queue = -1
        self.state = WAITING
        self.reason = ""


class QueueSet:
    """Seats ``limit``; ``queues`` queues (0: reject instead of queuing), hands of ``hand_size``."""

    __slots__ = (
        "_listed",
        "_new",
        "_old",
        "executing",
        "hand_size",
        "limit",
        "queue_executing",
        "queue_length_limit",
        "queues",
        "waiting",
    )

    def __init__(self, limit: int, queues: int = 0, hand_size: int = 1, queue_length_limit: int = 0) -> None:
        self.limit = limit
        self.hand_size = hand_size
        self.queue_length_limit = queue_length_limit
        self.queues: list[deque[Entry]] = [deque() for _ in range(queues)]
        # Per queue: its requests executing now (dispatched from it, not finished).
        self.queue_executing = [0] * queues
        self.executing = 0  # seats taken
        self.waiting = 0
        # Queues with requests, in the order they are served: those just become non-empty first,
        # then the others round-robin. A queue emptied by a cancel stays listed until reached.
        self._new: deque[int] = deque()
        self._old: deque[int] = deque()
        self._listed = [False] * queues

    def offer(self, hash_value: int, payload: Any) -> Entry:
        """A new request: ``state`` executing (a seat is its), waiting, or rejected with ``reason``."""
        entry = Entry(payload)
        if not self.queues:
            if self.executing < self.limit:
                self._seat(entry)
            else:
                entry.state, entry.reason = REJECTED, "concurrency-limit"
            return entry
        hand = deal(hash_value, len(self.queues), self.hand_size)
        best = min(hand, key=lambda q: len(self.queues[q]) + self.queue_executing[q])
        if len(self.queues[best]) >= self.queue_length_limit:
            entry.state, entry.reason = REJECTED, "queue-full"
            return entry
        entry.queue = best
        self.queues[best].append(entry)
        self.waiting += 1
        if not self._listed[best]:
            self._listed[best] = True
            self._new.append(best)
        self.dispatch()
        return entry

    def cancel(self, entry: Entry, reason: str) -> bool:
        """Take a waiting request out of its queue (its wait ended first); False if it was dispatched."""
        if entry.state != WAITING:
            return False
        self.queues[entry.queue].remove(entry)
        self.waiting -= 1
        entry.state, entry.reason = CANCELLED, reason
        return True

    def finish(self, entry: Entry) -> list[Entry]:
        """An executing request ended: its seat goes to the next; returns the requests dispatched."""
        if entry.state != EXECUTING:
            return []
        entry.state = DONE
        if entry.queue >= 0:
            self.queue_executing[entry.queue] -= 1
        self.executing -= 1
        return self.dispatch()

    def set_limit(self, limit: int) -> list[Entry]:
        self.limit = limit
        return self.dispatch()

    def dispatch(self) -> list[Entry]:
        """While a seat is free, the head of the next queue: newly non-empty ones first, then round-robin."""
        out: list[Entry] = []
        queues = self.queues
        while self.waiting and self.executing < self.limit:
            q = self._new.popleft() if self._new else self._old.popleft()
            if not queues[q]:  # emptied by cancels while listed
                self._listed[q] = False
                continue
            entry = queues[q].popleft()
            self.waiting -= 1
            self.queue_executing[q] += 1
            self._seat(entry)
            if queues[q]:
                self._old.append(q)
            else:
                self._listed[q] = False
            out.append(entry)
        return out

    def _seat(self, entry: Entry) -> None:
        entry.state = EXECUTING
        self.executing += 1
