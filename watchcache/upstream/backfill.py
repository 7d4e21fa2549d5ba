"""The owner's backfill fetch: the upstream's history in front of a cache's window (``dispatch.backfill.Fetch``).

For a request at ``R`` older than the window's start ``O``, two requests to the upstream:

1. the state at ``R``: a paged LIST with ``resourceVersion=R&resourceVersionMatch=Exact``
   (kube-apiserver reads it from etcd, or its watch cache; 410 once etcd compacted ``R``). A
   span must start from a known state, never from bare events (invariant 13): a selector watch needs each
   event's prior state to turn a MODIFIED into an ADDED or a DELETED;
2. the events after ``R``: a WATCH from ``R`` with bookmarks and ``timeoutSeconds=3``, read
   until it proves every event ``≤ O`` was received: an event past ``O`` (events come in rv
   order); an event *at* ``O`` (kube-apiserver and the simulated cluster give every event its
   own rv, so nothing else is at ``O``; an upstream watchcache tier's groups of events sharing
   an rv come from relist diffs, which a window never reaches back across); or a BOOKMARK at or
   past ``O``. kube sends that bookmark 2 s before the watch's deadline only when its cache has
   moved past the last event it sent the watch (measured against the reference apiserver:
   0.5-1.8 s into a 3 s watch, sometimes not at all; none when ``O`` is the resource's last
   event, which the event at ``O`` proves instead). So a watch that ends without a proof is
   watched again from the last event seen, at most ``WATCH_ROUNDS`` times. kube answers a
   watch from an rv older than its own watch cache with 410, even while etcd still has the
   revision: a limit of the upstream, not of this proxy (docs/reliability.md).

The LIST first, then the watch, so that the proof is checked against the window's start in
the same step that hands the span to the cache (``Cacher.backfill``, which replays it and
refuses it unless it gives the cache's own state at ``O``). Bounded: fetches at once per
process, bytes they hold together, events and bytes per span, time per fetch.

Both reads are in the cache's own encoding (``Codec``): a protobuf cache's span is the
upstream's protobuf bytes (``pbreflector.ProtobufCodec``), as its window is, so the frames a
backfilled watcher gets are kube's.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Protocol

import aiohttp
import orjson

from watchcache.cache.encoding import RELIST_DIFF_ANNOTATION
from watchcache.cache.events import BOOKMARK, DELETED, ERROR
from watchcache.cache.object import CachedObject, ObjectError, encode_object, parse_resource_version
from watchcache.cache.store import BackfillRefused, Span
from watchcache.dispatch.backfill import BackfillFailed, BackfillLimits, Backfills, Fetched
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import ResourceType
from watchcache.upstream.client import (
    Splitter,
    UpstreamClient,
    UpstreamError,
    WatchStalled,
    collection_path,
    split_lines,
)

# kube sends a watch's bookmark 2 s before its deadline: 3 s brings it 1-2.25 s in (2 never does).
WATCH_TIMEOUT = 3
# Watches without a proof before the fetch gives up (bookmarks are best effort): ~9 s.
WATCH_ROUNDS = 3

# Answers that say "not now" (kube-apiserver's 429, and what a failing apiserver or the load
# balancer before it answers): the fetch is worth asking again later, so clients are told to
# retry rather than to relist (``dispatch.outcomes.before_window``).
_PASSING_CODES = frozenset({429, 500, 502, 503, 504})

_REFUSED = {
    BackfillRefused.RELIST: BackfillFailed.RELIST,
    BackfillRefused.ROOM: BackfillFailed.BOUND,
    BackfillRefused.MISMATCH: BackfillFailed.MISMATCH,
    BackfillRefused.SPLIT: BackfillFailed.MISMATCH,
    BackfillRefused.SHORT: BackfillFailed.FAILED,
}


class Codec(Protocol):
    """How a cache's list pages and watch events read in its encoding."""

    accept: str
    split: Splitter

    def page(self, body: bytes) -> tuple[int, list[CachedObject], str | None]:
        """A list page's rv, objects and continue token. Raises ValueError, ObjectError."""

    def event(self, line: bytes) -> tuple[str, CachedObject | None, dict[str, Any]]:
        """An event's type and object; the Status of an ERROR or the metadata of a BOOKMARK.
        Raises ValueError, ObjectError."""


class JsonCodec:
    accept = "application/json"
    split: Splitter = staticmethod(split_lines)

    def __init__(self, resource: ResourceType) -> None:
        self.resource = resource

    def page(self, body: bytes) -> tuple[int, list[CachedObject], str | None]:
        page = orjson.loads(body)
        meta = page.get("metadata") or {}
        items = [encode_object(self.resource, item) for item in page.get("items") or []]
        return parse_resource_version(meta.get("resourceVersion")), items, meta.get("continue")

    def event(self, line: bytes) -> tuple[str, CachedObject | None, dict[str, Any]]:
        event = orjson.loads(line)
        kind = str(event.get("type"))
        raw = event.get("object") or {}
        if kind == ERROR:
            return kind, None, raw
        if kind == BOOKMARK:
            return kind, None, raw.get("metadata") or {}
        return kind, encode_object(self.resource, raw), {}


class UpstreamBackfill:
    """Fetches spans from the upstream for the caches this process owns; one per process (the bounds are shared)."""

    def __init__(self, client: UpstreamClient, limits: BackfillLimits, *, page_size: int = 500) -> None:
        self.client = client
        self.limits = limits
        self.page_size = page_size
        self._slots = asyncio.Semaphore(limits.concurrency)
        # Bytes held by the fetches in flight (lists and events read), against ``limits.memory_bytes``.
        self.held = 0

    def backfills(self, cacher: Cacher, codec: Codec | None = None) -> Backfills:
        """The single flight of ``cacher``'s backfills, fetching here in ``codec``'s encoding (JSON by default)."""
        fetch = functools.partial(self.__call__, codec=codec or JsonCodec(cacher.resource))
        limits = self.limits
        return Backfills(
            cacher, fetch, wait=limits.wait, coalesce=limits.coalesce, unreachable_for=limits.unreachable_for
        )

    async def __call__(self, cacher: Cacher, rv: int, codec: Codec | None = None) -> Fetched:
        limits = self.limits
        try:
            async with asyncio.timeout(limits.fetch_timeout), self._slots:
                return await _Fetch(self, cacher, rv, codec or JsonCodec(cacher.resource)).run()
        except TimeoutError:
            timeout = limits.fetch_timeout
            raise BackfillFailed(BackfillFailed.FAILED, f"no span from the upstream within {timeout:g}s") from None
        except UpstreamError as e:
            if e.code == 410:
                raise BackfillFailed(BackfillFailed.GONE, f"the upstream answered 410: {_message(e)}") from None
            outcome = BackfillFailed.UNREACHABLE if e.code in _PASSING_CODES else BackfillFailed.FAILED
            raise BackfillFailed(outcome, f"the upstream answered {e.code}: {_message(e)}") from None
        except (aiohttp.ClientError, WatchStalled, OSError) as e:  # refused, reset, cut mid-answer, silent
            raise BackfillFailed(BackfillFailed.UNREACHABLE, f"{type(e).__name__}: {e}") from None
        except (ValueError, KeyError, TypeError) as e:  # a malformed answer
            raise BackfillFailed(BackfillFailed.FAILED, f"{type(e).__name__}: {e}") from None


class _Fetch:
    """One fetch: its reads, what it holds, what it found."""

    def __init__(self, owner: UpstreamBackfill, cacher: Cacher, rv: int, codec: Codec) -> None:
        self.owner = owner
        self.codec = codec
        self.cacher = cacher
        self.resource: ResourceType = cacher.resource
        self.rv = rv
        self.held = 0
        self.read = 0
        self.span_bytes = 0

    def _hold(self, nbytes: int) -> None:
        self.read += nbytes
        self.held += nbytes
        self.owner.held += nbytes
        if self.owner.held > self.owner.limits.memory_bytes:
            raise BackfillFailed(
                BackfillFailed.BOUND,
                f"the memory budget of backfills (--backfill-memory-bytes={self.owner.limits.memory_bytes}) is spent",
            )

    async def run(self) -> Fetched:
        try:
            listed = await self._list()
            changes, through = await self._events()
            span = Span.from_list(self.rv, listed, changes, through)
            try:
                # Synchronous from the proof's check (in _events) to here: the window has not moved.
                events = self.cacher.backfill(span)
            except BackfillRefused as e:  # logged with the fetch's outcome (dispatch/backfill.py)
                raise BackfillFailed(_REFUSED.get(e.reason, BackfillFailed.MISMATCH), str(e)) from None
            return Fetched(len(events), self.read)
        finally:
            self.owner.held -= self.held

    async def _list(self) -> list[CachedObject]:
        """The state at rv: every page read at exactly rv (the continue tokens carry it)."""
        path = collection_path(self.resource)
        size = str(self.owner.page_size)
        params: dict[str, str] = {"limit": size, "resourceVersion": str(self.rv), "resourceVersionMatch": "Exact"}
        objects: list[CachedObject] = []
        while True:
            body = await self.owner.client.get_bytes(path, params, timeout=60.0, accept=self.codec.accept)
            self._hold(len(body))
            try:
                listed_at, items, token = self.codec.page(body)
            except ObjectError as e:
                raise BackfillFailed(BackfillFailed.FAILED, f"a malformed list item: {e}") from None
            if listed_at != self.rv:
                raise BackfillFailed(BackfillFailed.FAILED, f"an exact list at {self.rv} answered {listed_at}")
            objects.extend(items)
            if not token:
                return objects
            params = {"limit": size, "continue": token}

    async def _events(self) -> tuple[list[tuple[str, CachedObject]], int]:
        """Every event after rv, until proof that none up to the window's start is missing."""
        limits = self.owner.limits
        changes: list[tuple[str, CachedObject]] = []
        through = last = self.rv
        cache = self.cacher.cache
        for _ in range(WATCH_ROUNDS):
            params = {
                "resourceVersion": str(last),
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(WATCH_TIMEOUT),
            }
            stream = self.owner.client.watch(
                self.resource,
                params,
                stall_timeout=WATCH_TIMEOUT + 5.0,
                accept=self.codec.accept,
                split=self.codec.split,
            )
            async for lines in stream:
                for line in lines:
                    self._hold(len(line))
                    try:
                        kind, obj, detail = self.codec.event(line)
                    except ObjectError as e:
                        raise BackfillFailed(BackfillFailed.FAILED, f"a malformed event: {e}") from None
                    if kind == ERROR:
                        code = int(detail.get("code") or 500)
                        raise UpstreamError(code, str(detail.get("message", "")), detail)
                    if kind == BOOKMARK:
                        if RELIST_DIFF_ANNOTATION in (detail.get("annotations") or {}):
                            raise BackfillFailed(BackfillFailed.FAILED, "the upstream tier relisted during the fetch")
                        through = max(through, parse_resource_version(detail.get("resourceVersion")))
                    elif obj is not None:
                        if obj.rv <= last:
                            continue  # a resumed stream repeating its start
                        changes.append((DELETED if kind == DELETED else str(kind), obj))
                        self.span_bytes += len(obj.body)
                        # Every event before this one came; at its rv, no other (one event per rv).
                        through = max(through, obj.rv)
                        last = obj.rv
                        if len(changes) > limits.max_events or self.span_bytes > limits.max_bytes:
                            raise BackfillFailed(
                                BackfillFailed.BOUND,
                                f"more than --backfill-max-events={limits.max_events} events or "
                                f"--backfill-max-bytes={limits.max_bytes} bytes after {self.rv}",
                            )
                    if through >= cache.oldest_rv:
                        await stream.aclose()
                        return changes, through
        raise BackfillFailed(
            BackfillFailed.FAILED, f"no proof of the events up to {cache.oldest_rv} in {WATCH_ROUNDS} watches"
        )


def _message(e: UpstreamError) -> str:
    return str((e.status or {}).get("message") or e)
