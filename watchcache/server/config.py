"""The read path's tunables (``--fresh-wait``, ``--max-requests-inflight``, ...): one frozen value per server."""

from __future__ import annotations

from dataclasses import dataclass


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
    # Start a flush pass no sooner than this many times the CPU time the last pass took after it ended,
    # and at most watch_flush_max_delay later (0: no pacing). watchers/flush.py; docs/performance.md.
    watch_flush_pacing: float = 6.0
    watch_flush_max_delay: float = 0.1
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
