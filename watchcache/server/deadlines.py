"""Request deadlines (--request-timeout) on one timer per loop, not one per request.

Every request that is not long-running ends at --request-timeout (``server/limits.py``). With
``asyncio.timeout`` each request armed a timer of its own and cancelled it as it ended: a timer
handle made and freed, three ``get_running_loop`` calls (each a ``getpid`` system call) and the
timeout's state machine, ~4 µs of a ~1 ms passed-through GET on a warm core and more on the cold
one a pass-through wakes on (docs/performance.md, "Consistent reads").

Every deadline of a handler has the same length, so the ones in force end in the order they
began: they are kept in that order (a dict: insertion-ordered, O(1) removal), and one timer is
armed for the oldest. A request that ends takes its deadline out; when the timer fires, the
deadlines past are expired and it is armed again for the new oldest. What a deadline does when
it passes is ``asyncio.Timeout``'s: its task is cancelled and, on the way out of the ``async
with``, that cancellation becomes a ``TimeoutError`` (unless someone else cancelled the task too).
"""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["Deadline", "Deadlines"]

_ENTERED, _EXPIRING, _EXPIRED, _EXITED, _CREATED = range(5)


class Deadlines:
    """The deadlines of one handler's requests, all ``seconds`` long (None: requests have none)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._active: dict[Deadline, None] = {}  # in force, oldest first
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def new(self, enabled: bool = True) -> Deadline:
        """A deadline for a request starting now (none at all unless ``enabled``)."""
        return Deadline(self if enabled and self.seconds is not None else None)

    def enter(self, deadline: Deadline, loop: asyncio.AbstractEventLoop) -> None:
        """``deadline`` is in force from now (its ``async with``)."""
        assert self.seconds is not None
        deadline.when = loop.time() + self.seconds
        self._active[deadline] = None
        if self._timer is None or self._loop is not loop:
            self._arm(loop, deadline.when)

    def leave(self, deadline: Deadline) -> None:
        """``deadline`` is no longer in force (its request ended, or it was lifted)."""
        # The timer stays armed for a deadline that has gone: it finds the next one when it fires.
        self._active.pop(deadline, None)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._loop = loop
        self._timer = loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        active = self._active
        while active:
            oldest = next(iter(active))
            if oldest.when > now:
                self._arm(loop, oldest.when)
                return
            del active[oldest]
            oldest.expire()

    def __len__(self) -> int:
        """Deadlines in force."""
        return len(self._active)


class Deadline:
    """One request's deadline: ``async with`` it around the request's work, as ``asyncio.timeout``."""

    __slots__ = ("_cancelling", "_owner", "_state", "_task", "when")

    def __init__(self, owner: Deadlines | None) -> None:
        self._owner = owner
        self._state = _CREATED
        self._task: asyncio.Task[object] | None = None
        self.when = 0.0
        self._cancelling = 0

    async def __aenter__(self) -> Deadline:
        if self._state != _CREATED:
            raise RuntimeError("a deadline is entered once")
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a deadline is used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._state = _ENTERED
        if self._owner is not None:
            self._owner.enter(self, loop)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._state == _EXPIRING:
            self._state = _EXPIRED
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc  # this deadline's cancellation, nobody else's
            return
        self._state = _EXITED
        if self._owner is not None:
            self._owner.leave(self)

    def reschedule(self, when: None) -> None:
        """No deadline from now on (a watch, a stream: long-running). Only ``None`` is supported."""
        if self._state != _ENTERED:
            raise RuntimeError("only a deadline in force can be lifted")
        if when is not None:
            raise ValueError("a request deadline can only be lifted")
        if self._owner is not None:
            self._owner.leave(self)
            self._owner = None

    def expired(self) -> bool:
        """Whether the deadline passed while in force (its task was cancelled for it)."""
        return self._state in (_EXPIRING, _EXPIRED)

    def expire(self) -> None:
        """Passed: the task is cancelled, which ``__aexit__`` turns into a TimeoutError."""
        assert self._state == _ENTERED and self._task is not None
        self._task.cancel()
        self._state = _EXPIRING
