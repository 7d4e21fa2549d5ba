"""The Retry-After of flow control's 429, per priority level, as kube's ``droppedRequestsTracker``.

kube does not always answer ``Retry-After: 1``: a level that keeps refusing asks its clients to
back off longer, like TCP's congestion window. Per level, each second's refusals are counted;
when the second changes, the refusals of the last ``retry_after`` seconds (before this one) are
looked at: at least 3 × ``retry_after`` of them (and ``retry_after`` seconds since the last raise)
doubles it, up to 32 s; fewer than ``retry_after`` lowers it by one, down to 1 s. Free of I/O:
the caller gives the time.
"""

from __future__ import annotations

__all__ = ["MAX_RETRY_AFTER", "DroppedRequests"]

#: kube's maxRetryAfter, in seconds.
MAX_RETRY_AFTER = 32


class _Level:
    __slots__ = ("current", "current_count", "history", "raised_at", "retry_after")

    def __init__(self) -> None:
        self.history: list[tuple[int, int]] = []  # (second, refusals), oldest first
        self.current = 0  # the second being counted
        self.current_count = 0
        self.retry_after = 1
        self.raised_at = 0  # the second retry_after was last doubled

    def record(self, second: int) -> None:
        if second == self.current:
            self.current_count += 1
            return
        self.history.append((self.current, self.current_count))
        self.history = [(s, n) for s, n in self.history if self.current - s <= MAX_RETRY_AFTER]
        self.current, self.current_count = second, 1
        self._adjust(second)

    def _adjust(self, second: int) -> None:
        retry = self.retry_after
        dropped = 0
        for s, n in reversed(self.history):
            if second - s > retry:
                break
            if s < second:
                dropped += n
        if second - self.raised_at >= retry and dropped >= 3 * retry:
            self.retry_after = min(retry * 2, MAX_RETRY_AFTER)
            self.raised_at = second
        elif dropped < retry and retry > 1:
            self.retry_after = retry - 1


class DroppedRequests:
    """Refusals per priority level, and the Retry-After each level's next 429 carries."""

    def __init__(self) -> None:
        self._levels: dict[str, _Level] = {}

    def record(self, priority_level: str, now: float) -> None:
        """A request of ``priority_level`` was refused at ``now`` (Unix seconds)."""
        level = self._levels.get(priority_level)
        if level is None:
            level = self._levels[priority_level] = _Level()
        level.record(int(now))

    def retry_after(self, priority_level: str) -> int:
        level = self._levels.get(priority_level)
        return 1 if level is None else level.retry_after
