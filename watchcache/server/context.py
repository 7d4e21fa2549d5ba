"""What every request handler shares: the cachers, the upstream, the config (``ApiContext``).

It is also the ``ReadContext`` of the reads it serves (``dispatch/reads.py``): their upstream,
continue-token codec, waits, metrics, and the seat a waiting read gives up."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from watchcache.cache.continuetoken import ContinueCodec
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.reads import ReadUpstream
from watchcache.http.request import Request
from watchcache.http.response import Response
from watchcache.http.routing import RequestInfo
from watchcache.resources import ResourceRegistry, ResourceType
from watchcache.server import seats
from watchcache.server.config import ServeConfig
from watchcache.watchers.budget import WatchBudget
from watchcache.watchers.deadlines import WatchDeadlines
from watchcache.watchers.flush import FlushScheduler

if TYPE_CHECKING:
    from watchcache.auth.gate import Gate
    from watchcache.server.metrics import Metrics
    from watchcache.upstream.failures import LastFailures


class Upstream(ReadUpstream, Protocol):
    """Where the truth is: answers what the cache cannot (writes, the rest of the API), and tells a
    cache that is behind where the upstream is and proves its progress (``dispatch/reads.py``)."""

    # True when a GET without resourceVersion goes to the upstream, as kube-apiserver sends it to
    # etcd (``server/decision.py``); False when the upstream's state is the cache's (the sim).
    delegates_consistent_gets: bool

    def send_early(self, request: Request) -> EarlySend | None:
        """Send ``request``, a consistent GET ``forward`` will carry, at once (``ApiHandler``'s rule
        for it); None if nothing was started. Only called when ``delegates_consistent_gets``."""

    async def forward(self, request: Request, response: Response, info: RequestInfo | None) -> None:
        """Answer a request the cache does not serve. Raises StatusError."""


class EarlySend(Protocol):
    """A request ``Upstream.send_early`` started: ``forward`` takes it, or the handler discards it."""

    @property
    def sent(self) -> bool:
        """Whether the request went out (else it goes when the pass-through gets to it)."""
        ...

    def discard(self) -> bool:
        """The handler ended: True if it dropped an answer sent early that nothing took."""
        ...

    def settled(self) -> bool:
        """Taken by its handler, or no longer at the upstream (answered, failed, or never sent)."""
        ...


@dataclass
class ApiContext:
    registry: ResourceRegistry
    cachers: dict[ResourceType, Cacher]
    upstream: Upstream
    codec: ContinueCodec
    flusher: FlushScheduler
    config: ServeConfig = field(default_factory=ServeConfig)
    # For a resource in the registry but not in ``cachers``: a cache made on first use
    # (a follower of the worker that owns it), or None to pass the request through.
    on_demand: Callable[[ResourceType], Cacher | None] | None = None
    # For a resource not in ``cachers``: True when no read may ever cache it here (--cache-exclude,
    # --no-cache-on-demand): its reads are passed through at once, before any review.
    never_cached: Callable[[ResourceType], bool] = lambda resource: False
    # Full objects in protobuf: the resource's protobuf cache once it is ready (made on first use; a
    # read may wait for a new one), else None (the read is answered as without one). None: no protobuf caches here.
    protobuf: Callable[[ResourceType], Awaitable[Cacher | None]] | None = None
    # Caches besides ``cachers`` (the protobuf caches and their followers): ticked, counted toward
    # --max-watchers, and their watchers ended at shutdown, as the others.
    more_cachers: Callable[[], Iterable[Cacher]] = tuple
    # Delegated authentication + authorization of cached reads (None: --authentication none).
    gate: Gate | None = None
    # Per-request and per-flush observations (None: not measured, e.g. in unit tests).
    metrics: Metrics | None = None
    # The upstream's discovery has confirmed which resources are cached (always true without one).
    discovered: bool = True
    # The process-wide budget of unsent watch bytes (None: only each watcher's own cap).
    watch_budget: WatchBudget | None = None
    # The upstream is an apiserver with continue tokens of its own: a page token this cache did not
    # sign belongs to a list the upstream answered, and goes to it (else: 400).
    upstream_continue_tokens: bool = False
    # Watches waiting for the cache to reach their rv (``server/watch.py``), each by the future that
    # ends its wait: False at shutdown (``end_waiting_watches``), True when its client goes.
    waiting_watches: set[asyncio.Future[bool]] = field(default_factory=set)
    # The last failure of the proxy's own upstream requests, per resource (None: no upstream client).
    upstream_failures: LastFailures | None = None
    # The upstream, for /readyz?verbose: where and how (never a secret).
    upstream_description: str = ""
    # Every watch's timeout, on one loop timer.
    watch_deadlines: WatchDeadlines = field(default_factory=WatchDeadlines)

    def end_waiting_watches(self) -> None:
        """At shutdown: a watch still waiting for its rv ends now, with no event (it has none to give)."""
        for ended in self.waiting_watches:
            if not ended.done():
                ended.set_result(False)

    def waiting(self) -> AbstractContextManager[object]:
        """While entered, the request being served waits without its in-flight seat (``server/seats.py``)."""
        return seats.waiting()
