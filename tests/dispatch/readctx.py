"""A ``ReadContext`` for the read's owner (``dispatch/reads.py``) without a server: its upstream, waits and seat."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from watchcache.cache.continuetoken import ContinueCodec
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.freshness import Reached, Wait
from watchcache.resources import ResourceType


class ProvingUpstream:
    """The upstream at ``rv``: a scope is proven once the cache reaches it (by the test's writes) in time."""

    answers_old_reads = False
    answers_reads_ahead = False
    no_bookmarks = False

    def __init__(self, rv: int = 0) -> None:
        self.rv = rv
        self.scope_proofs: list[str | None] = []
        # Whether the read's seat was given up when the upstream was asked (``ReadCtx.waiting``).
        self.asked_seated: list[bool] = []
        self.ctx: ReadCtx | None = None

    async def current_rv(self, cacher: Cacher, timeout: float) -> int:
        return self.rv

    async def prove_scope(self, cacher: Cacher, namespace: str | None, timeout: float) -> Reached:
        self.scope_proofs.append(namespace)
        self._note_seat()
        return Reached.EVENTS if await cacher.wait_for_rv(self.rv, timeout) else Reached.TIMEOUT

    @contextlib.contextmanager
    def proving(self, cacher: Cacher) -> Iterator[None]:
        self._note_seat()
        yield

    def unprovable(self, cacher: Cacher) -> bool:
        return self.no_bookmarks

    def _note_seat(self) -> None:
        if self.ctx is not None:
            self.asked_seated.append(self.ctx.seated)


@dataclass(frozen=True)
class Config:
    fresh_wait: float = 0.2
    ready_wait: float = 0.0


class Waits:
    """Records the waits, as ``server/metrics.py`` observes them: (resource, wait, consistent)."""

    def __init__(self) -> None:
        self.seen: list[tuple[ResourceType, Wait, bool]] = []

    def waited(self, resource: ResourceType, wait: Wait, *, consistent: bool) -> None:
        self.seen.append((resource, wait, consistent))


@dataclass
class ReadCtx:
    upstream: ProvingUpstream = field(default_factory=ProvingUpstream)
    codec: ContinueCodec = field(default_factory=lambda: ContinueCodec(b"t" * 32))
    config: Config = field(default_factory=Config)
    metrics: Waits = field(default_factory=Waits)
    # The request's seat: given up while it waits, taken back after (``server/seats.py``).
    seated: bool = True
    waits: int = 0

    def __post_init__(self) -> None:
        self.upstream.ctx = self

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        assert self.seated, "a wait inside a wait"
        self.seated = False
        self.waits += 1
        try:
            yield
        finally:
            self.seated = True
