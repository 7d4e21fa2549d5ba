"""Review results kept for a TTL that depends on the outcome, with one review in flight per key.

Both delegated checks (``TokenReview``, ``SubjectAccessReview``) cost a round trip to the
upstream, and a burst of requests from one client (an informer starting a dozen watches,
a controller's LIST pages) asks the same question many times. Answers are cached, allows
longer than denies (a fresh RoleBinding takes effect within the deny TTL), and concurrent
askers of a question not yet cached share the one review in flight (single flight).

Failures are never cached: every waiter of the failed review gets the exception, and the
next request asks again. The clock is injected so tests can move time.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a flight's outcome as retrieved, so an error nobody waited for is not reported as lost."""
    if not future.cancelled():
        future.exception()


class ReviewCache(Generic[K, V]):
    """``key -> (expires_at, value)`` plus the reviews in flight; bounded to ``max_entries``.

    Entries are evicted oldest-stored first once over the bound, and dropped when read
    after their expiry. Counters (plain ints, read by metrics): ``hits`` (answered from the
    cache), ``reviews`` (reviews started), ``joined`` (requests that shared a review in
    flight).
    """

    def __init__(
        self,
        *,
        allow_ttl: float,
        deny_ttl: float,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.allow_ttl = allow_ttl
        self.deny_ttl = deny_ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._inflight: dict[K, asyncio.Future[V]] = {}
        self.hits = 0
        self.reviews = 0
        self.joined = 0

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[K]:
        """The keys currently stored (expired ones included until read or evicted)."""
        return list(self._entries)

    def inflight_keys(self) -> list[K]:
        return list(self._inflight)

    def clear(self) -> None:
        self._entries.clear()

    def allowed(self, key: K) -> V | None:
        """The answer of ``key`` if stored, not expired and an allow (not None), counted as a hit;
        else None and nothing counted (``get`` answers). No coroutine: most requests stop here."""
        entry = self._entries.get(key)
        if entry is not None and entry[1] is not None and self._clock() < entry[0]:
            self.hits += 1
            return entry[1]
        return None

    async def get(self, key: K, review: Callable[[], Awaitable[V]], allowed: Callable[[V], bool]) -> V:
        """The cached answer for ``key``, or the answer of ``review()`` (shared with concurrent askers).

        ``allowed(value)`` picks the TTL: ``allow_ttl`` if true, else ``deny_ttl``; a TTL
        of 0 or less stores nothing. A waiter that is cancelled does not cancel the review
        others share: it completes and is cached.
        """
        entry = self._entries.get(key)
        if entry is not None:
            if self._clock() < entry[0]:
                self.hits += 1
                return entry[1]
            del self._entries[key]
        flight = self._inflight.get(key)
        if flight is None:
            self.reviews += 1
            flight = asyncio.ensure_future(self._run(key, review, allowed))
            flight.add_done_callback(_retrieve)
            self._inflight[key] = flight
        else:
            self.joined += 1
        return await asyncio.shield(flight)

    async def _run(self, key: K, review: Callable[[], Awaitable[V]], allowed: Callable[[V], bool]) -> V:
        try:
            value = await review()
        finally:
            self._inflight.pop(key, None)
        ttl = self.allow_ttl if allowed(value) else self.deny_ttl
        if ttl > 0:
            self._entries[key] = (self._clock() + ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return value
