"""A client-go style watch loop's single step: open one WATCH, report its events, check their order.

Each event becomes one sample in locust's table, request type ``WATCH``, named by event type:
``ADDED``/``MODIFIED``/``DELETED`` timed by delivery latency (``latency.py``; ``None`` when the
object carries no stamp, e.g. the simulated cluster's own pod churn; ``... (replayed)`` when the
write was sent before this stream was requested), ``BOOKMARK`` untimed,
``ADDED (initial)`` for a streaming list's initial state (untimed: replayed state, not a
delivery), ``BOOKMARK (initial-events-end)`` timed from the request to the end of that state, and
``ERROR 410 Expired``. Gaps and duplicates (``continuity.py``) are failures of the event that
revealed them. Opening the watch is its own row, ``<collection> (open)``, timed to the
response headers.
"""

from __future__ import annotations

import enum
import random
import time
from typing import Any
from urllib.parse import urlencode

from loadtest.locust.context import RunContext, report
from loadtest.locust.continuity import Continuity, StoreCheck
from loadtest.locust.latency import written_at
from loadtest.locust.watchstream import WatchConnection, WatchEvent, WatchRejected

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class Outcome(enum.Enum):
    ENDED = "ended"  # the server closed the stream (timeoutSeconds): resume from the last rv
    EXPIRED = "expired"  # 410: the rv left the server's history; the client must relist
    BROKEN = "broken"  # connection or HTTP error, or an ERROR event other than 410: resume after a pause


class WatchGap(Exception):
    """An event that a correct watch could not have delivered (see continuity.py)."""


class WatchSession:
    """The watches of one client on one collection, resumed from the last rv across streams."""

    def __init__(
        self,
        environment: Any,
        context: RunContext,
        base_url: str,
        path: str,
        params: dict[str, str],
        label: str,
        *,
        store: StoreCheck | None = None,
    ) -> None:
        self.environment = environment
        self.context = context
        self.path = path
        self.params = params  # selectors; the watch parameters are added per stream
        self.label = label  # e.g. "configmaps -n [ns]": the row names of this collection
        self.continuity = Continuity()
        self.store = store
        timeout = context.settings.watch_timeout
        # Outlasts the longest stream (2T) plus slack: a read that times out is a stalled watch.
        self.connection = WatchConnection(base_url, context.settings.headers(), network_timeout=2 * timeout + 30)

    def close(self) -> None:
        self.connection.close()

    def _timeout_seconds(self) -> str:
        t = self.context.settings.watch_timeout
        return str(max(1, int(t * (1.0 + random.random()))))

    def stream_from(self, rv: int) -> Outcome:
        """Watch from ``rv`` ("Start at Exact"): events after it, then resume until it ends."""
        self.continuity.start(rv)
        params = {
            **self.params,
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": str(rv),
            "timeoutSeconds": self._timeout_seconds(),
        }
        return self._stream(params, initial=False)

    def streaming_list(self) -> Outcome:
        """A streaming list (sendInitialEvents): state as ADDED events, a bookmark, then changes."""
        self.continuity.reset()
        params = {
            **self.params,
            "watch": "1",
            "allowWatchBookmarks": "true",
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
            "resourceVersion": "",
            "timeoutSeconds": self._timeout_seconds(),
        }
        if self.store is not None:
            self.store.replace(set())
        return self._stream(params, initial=True)

    def _stream(self, params: dict[str, str], *, initial: bool) -> Outcome:
        env, label = self.environment, self.label
        started = time.perf_counter()
        opened_at = time.time()
        try:
            events = self.connection.open(f"{self.path}?{urlencode(params)}")
        except Exception as e:  # WatchRejected, OSError; GreenletExit is a BaseException and passes
            elapsed = (time.perf_counter() - started) * 1000
            if initial and isinstance(e, WatchRejected) and e.status in (400, 422):
                # sendInitialEvents refused: a server without streaming lists. Not a failure of
                # the server under test; the WatchUsers fall back to list-then-watch.
                self.context.streaming_lists = False
                self.context.counters["streaming lists refused"] += 1
                report(env, "WATCH", f"{label} (open, streaming list refused: {e.status})", elapsed)
                return Outcome.EXPIRED
            report(env, "WATCH", f"{label} (open)", elapsed, 0, e)
            return Outcome.BROKEN
        report(env, "WATCH", f"{label} (open)", (time.perf_counter() - started) * 1000)
        self.context.counters["watch streams"] += 1
        try:
            for event in events:
                outcome = self._event(event, initial, opened_at)
                if outcome is not None:
                    return outcome
                if initial and event.type == "BOOKMARK" and _ends_initial_events(event):
                    initial = False
        except Exception as e:  # a broken connection mid-stream: OSError, geventhttpclient's parse errors
            report(env, "WATCH", f"{label} (stream)", None, 0, e)
            return Outcome.BROKEN
        return Outcome.ENDED

    def _event(self, event: WatchEvent, initial: bool, opened_at: float) -> Outcome | None:
        env, context = self.environment, self.context
        kind = event.type
        if kind == "BOOKMARK":
            problem = self.continuity.bookmark(event.rv)
            if initial and _ends_initial_events(event):
                elapsed = (event.received_at - opened_at) * 1000
                report(env, "WATCH", "BOOKMARK (initial-events-end)", elapsed, event.size, _gap(problem))
            else:
                report(env, "WATCH", "BOOKMARK", None, event.size, _gap(problem))
            return None
        if kind == "ERROR":
            code = event.object.get("code")
            if code == 410:
                context.counters["410 Expired"] += 1
                report(env, "WATCH", "ERROR 410 Expired", None, event.size)
                return Outcome.EXPIRED
            message = str(event.object.get("message", ""))[:200]
            report(env, "WATCH", f"ERROR {code}", None, event.size, Exception(f"ERROR event {code}: {message}"))
            return Outcome.BROKEN
        key = event.key
        if initial:
            if self.store is not None:
                self.store.event(kind, key)
            report(env, "WATCH", f"{kind} (initial)", None, event.size)
            return None
        problem = self.continuity.event(key, event.rv)
        if problem is None and self.store is not None:
            problem = self.store.event(kind, key)
        if problem is not None:
            context.counters["gaps and duplicates"] += 1
        sent = self._sent_at(kind, event)
        latency = None
        name = kind
        if sent is not None:
            # Never negative: writer and watcher on different hosts can disagree on the clock.
            latency = max(0.0, (event.received_at - sent) * 1000)
            if sent < opened_at:
                # Written before this stream was requested: replayed from the server's history
                # (a watch from a list's rv, or a resumption), so its latency includes the time
                # this client was not watching. Kept apart from live delivery.
                name = f"{kind} (replayed)"
            context.latencies.add(name, latency)
        report(env, "WATCH", name, latency, event.size, _gap(problem))
        return None

    def _sent_at(self, kind: str, event: WatchEvent) -> float | None:
        """When the write this event reports was sent, if the ChurnUser of this process sent it."""
        if kind == "DELETED":
            meta = event.object.get("metadata", {})
            return self.context.deletes.when(meta.get("namespace", ""), meta.get("name", ""))
        return written_at(event.object)


def _ends_initial_events(event: WatchEvent) -> bool:
    annotations = event.object.get("metadata", {}).get("annotations") or {}
    return annotations.get(INITIAL_EVENTS_END) == "true"


def _gap(problem: str | None) -> WatchGap | None:
    return WatchGap(problem) if problem else None
