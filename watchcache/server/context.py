"""What every request handler shares: the cachers, the upstream, the config."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from watchcache.cache.continuetoken import ContinueCodec
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.freshness import Progress
from watchcache.http.request import Request
from watchcache.http.response import Response
from watchcache.http.routing import RequestInfo
from watchcache.resources import ResourceRegistry, ResourceType
from watchcache.watchers.budget import WatchBudget
from watchcache.watchers.deadlines import WatchDeadlines
from watchcache.watchers.flush import FlushScheduler

if TYPE_CHECKING:
    from watchcache.auth.gate import Gate
    from watchcache.server.metrics import Metrics
    from watchcache.server.negotiation import PassReason
    from watchcache.upstream.failures import LastFailures


class Upstream(Progress, Protocol):
    """Where the truth is: answers what the cache cannot (writes, the rest of the API), and tells a
    cache that is behind where the upstream is and proves its progress (``freshness.Progress``)."""

    # True when the upstream may still answer an exact read older than this cache's history
    # (kube-apiserver reads it from etcd until etcd compacts it): such a LIST passes through
    # instead of getting our 410. False when the upstream's history is this cache's own (the sim).
    answers_old_reads: bool
    # True when a GET without resourceVersion goes to the upstream, as kube-apiserver sends it to etcd.
    delegates_consistent_gets: bool

    async def forward(self, request: Request, response: Response, info: RequestInfo | None) -> None:
        """Answer a request the cache does not serve. Raises StatusError."""


class PassThrough(Exception):
    """Raised by a cached read that must be answered by the upstream instead."""

    def __init__(self, reason: PassReason) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ServeConfig:
    """Read-path tunables; defaults are kube-apiserver's where it has one."""

    # How long a read waits for the cache to reach its rv (a requested one, or the upstream's for a
    # consistent read) before 504 or pass-through (kube: 3 s). See dispatch/freshness.py.
    fresh_wait: float = 3.0
    # How long a request waits for a cache that has not synced yet before 429.
    ready_wait: float = 0.0
    # Periodic bookmarks, for watchers that allow them: kube-apiserver's defaultBookmarkFrequency. Each
    # is a write to its watcher's connection: with thousands of mostly idle watchers (kubelets) they
    # outnumber the events (docs/lab/performance-notebook.md, "Kubelet-shaped scale").
    bookmark_interval: float = 60.0
    # Watches without timeoutSeconds end after [min, 2*min) s (kube: --min-request-timeout=1800).
    min_request_timeout: float = 1800.0
    # A watcher whose unsent frames exceed this lags: buffer dropped, caught up from history later.
    watch_max_pending_bytes: int = 16 << 20
    # Unsent frames of all watchers (per worker); past it those furthest behind lag first (0: none).
    watch_max_total_bytes: int = 1 << 30
    # Page size clamp for LIST (0: none).
    max_limit: int = 0
    # Flush watch streams at most once per this many seconds (0: every loop pass).
    watch_flush_interval: float = 0.0
    # Observe delivery latency on one flush in N (0: never).
    delivery_sample: int = 16
    # Non-watch requests handled at once per worker before 429 (kube: --max-requests-inflight=400).
    max_requests_inflight: int = 400
    # Requests waiting without a seat (for a review, a proof, the upstream) per worker; past it a
    # waiting request keeps its seat. Each holds its head and a task while it waits (server/seats.py).
    max_requests_waiting: int = 2000
    # API Priority and Fairness (kube: --enable-priority-and-fairness): a request finding its
    # priority level's seats busy waits in its flow's queue; off: it gets 429 at once.
    priority_and_fairness: bool = False
    # A request that is not long-running (not a watch or a tunnel) is ended after this many seconds,
    # its answer written or not, and its in-flight slot given back (kube: --request-timeout=60s).
    request_timeout: float = 60.0
    # Watches open at once per worker before 429: each costs memory and a share of every event.
    max_watchers: int = 10_000


class ListBodies:
    """The LIST answers built at a resource's newest snapshot, shared by identical LISTs at it.

    In a relist storm thousands of informers send the same LIST within moments (``resourceVersion=0``
    after a partition, a rollout, an upstream restart): each was scanned and framed again, ~30 ms of
    a worker's loop for 10,000 pods (docs/lab/performance-notebook.md, "Relist storm"). An answer is its snapshot's
    rv plus the request's own terms, so an identical request at the same rv gets the same parts (the
    cached object bytes, immutable). A snapshot is named by its rv and the number of events at it: an
    upstream that is a watch cache sends groups of events sharing one rv, and a read may end inside
    one, so the state at an rv can still grow. Entries are kept for one version, the newest one
    stored: a newer snapshot drops them, an older one (a continue page of an earlier list) is not
    kept, so at most ``MAX`` answers' references are held, of one generation of objects.
    """

    __slots__ = ("entries", "shared", "version")
    MAX = 8

    def __init__(self) -> None:
        # (rv, events at rv) of the entries.
        self.version = (-1, 0)
        self.entries: dict[tuple[object, ...], tuple[list[bytes], int, int]] = {}
        # LISTs answered with parts built for an earlier identical one (/debug/cache).
        self.shared = 0

    def get(self, version: tuple[int, int], key: tuple[object, ...]) -> tuple[list[bytes], int, int] | None:
        """The parts, items and objects examined of an identical LIST at ``version``, if built."""
        if version != self.version:
            return None
        built = self.entries.get(key)
        if built is not None:
            self.shared += 1
        return built

    def put(self, version: tuple[int, int], key: tuple[object, ...], built: tuple[list[bytes], int, int]) -> None:
        if version < self.version:
            return
        if version > self.version:
            self.entries.clear()
            self.version = version
        elif len(self.entries) >= self.MAX:
            del self.entries[next(iter(self.entries))]
        self.entries[key] = built


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
    # Full objects in protobuf: the resource's protobuf cache if it is ready (made on first use),
    # else None (the read is answered as without one). None: no protobuf caches here.
    protobuf: Callable[[ResourceType], Cacher | None] | None = None
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
    # The last failure of the proxy's own upstream requests, per resource (None: no upstream client).
    upstream_failures: LastFailures | None = None
    # The upstream, for /readyz?verbose: where and how (never a secret).
    upstream_description: str = ""
    # Per resource: LIST answers shared by identical LISTs at one snapshot (a relist storm).
    list_bodies: dict[ResourceType, ListBodies] = field(default_factory=dict)
    # Every watch's timeout, on one loop timer.
    watch_deadlines: WatchDeadlines = field(default_factory=WatchDeadlines)
