"""Exponential backoff with jitter: the one retry schedule of the reflector, discovery, followers and workers.

Each delay is drawn from [d/2, d] where d doubles from ``initial`` up to ``maximum``, so
processes that failed together (every worker losing the same apiserver, every follower
losing the same owner) do not retry in lockstep.
"""

from __future__ import annotations

import random


class Backoff:
    """``next()`` the delay before the next try; ``reset()`` once a try has gone well."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self._current = initial

    def next(self) -> float:
        delay = random.uniform(self._current / 2, self._current)
        self._current = min(self._current * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._current = self.initial
