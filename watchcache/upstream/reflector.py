"""Reflector: one upstream list+watch per cached resource type, feeding its Cacher.

As client-go's reflector: a paged LIST, then a WATCH with bookmarks from the list's rv,
resumed from the last rv seen after any disconnect, with exponential backoff and jitter.
Two differences that matter for a proxy:

* on ``410 Gone`` it relists and hands the *difference* to ``Cacher.relist``, so client
  watches continue (kube-apiserver ends them all in this case): invariant 7; at the oldest rv
  the 410 says the upstream resumes from (a restarted apiserver's start), so that only the
  changes the upstream can no longer stream are in the difference;
* a watch that goes silent (no event, no bookmark) for longer than ``stall_timeout`` is
  dropped and resumed, rather than waited on forever.

State machine (one log line per change)::

    LISTING --synced--> WATCHING --disconnect/error--> BACKOFF --> WATCHING
        ^                   |                                  \\-- 410 --> LISTING
        +------ 410 --------+
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson

from watchcache.backoff import Backoff
from watchcache.cache.encoding import RELIST_DIFF_ANNOTATION
from watchcache.cache.events import BOOKMARK, DELETED, ERROR
from watchcache.cache.object import CachedObject, ObjectError, body_in_event, encode_object, parse_resource_version
from watchcache.dispatch.cacher import Cacher
from watchcache.upstream.client import (
    Splitter,
    UpstreamClient,
    UpstreamError,
    WatchStalled,
    collection_path,
    split_lines,
)
from watchcache.upstream.failures import LastFailures

log = logging.getLogger("watchcache.upstream.reflector")


class ReflectorState(enum.Enum):
    LISTING = "listing"
    WATCHING = "watching"
    BACKOFF = "backoff"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ReflectorConfig:
    page_size: int = 500
    # Silence longer than this ends the watch. kube sends bookmarks about once a minute.
    stall_timeout: float = 75.0
    # Watches are re-established every [min, 2*min) seconds, as client-go does.
    min_watch_timeout: float = 300.0
    # Unread this long, a resource's cache in one encoding stops its upstream watch while the other
    # serves: a protobuf cache is dropped, a JSON feed suspended (upstream/protobuf.py, encodings.py).
    encoding_idle: float = 300.0
    backoff_initial: float = 0.2
    backoff_max: float = 30.0


# The 410 of kube's watch cache (and of this proxy's store): "too old resource version: R (O)", O the
# oldest rv a watch may still resume from (a restarted apiserver's: etcd's revision at its start).
_TOO_OLD = re.compile(r"too old resource version: \d+ \((\d+)\)")


class Gone(Exception):
    """The upstream no longer has the history we asked for (410)."""

    @property
    def resumable_from(self) -> int | None:
        """The oldest rv the upstream says a watch may resume from, if it says."""
        m = _TOO_OLD.search(str(self))
        return int(m.group(1)) if m else None


class Reflector:
    # The watch stream's encoding and how it is cut into events (``ProtobufReflector``: another).
    accept = "application/json"
    split: Splitter = staticmethod(split_lines)

    def __init__(
        self,
        client: UpstreamClient,
        cacher: Cacher,
        config: ReflectorConfig | None = None,
        failures: LastFailures | None = None,
    ) -> None:
        self.client = client
        # The last upstream failure per resource, shared by the process's reflectors and discovery.
        self.failures = failures
        self.cacher = cacher
        self.resource = cacher.resource
        self.config = config or ReflectorConfig()
        self.state = ReflectorState.LISTING
        self.backoff = Backoff(self.config.backoff_initial, self.config.backoff_max)
        self.relists = 0
        self.watch_restarts = 0
        self.gone = 0
        self.last_event_at: float | None = None
        self._synced_once = False
        # Called after a relist: the proxy proves progress past the relist's rv at once (when the diff
        # has several frames at that rv a watch may not resume *at* it, see ResourceCache.relist, so
        # lists should not keep reporting it).
        self.after_relist: Callable[[Cacher], object] | None = None
        # A relist diff announced by an upstream watchcache tier (see _take_diff): its end rv and
        # the changes read so far, over as many reads as it takes.
        self._diff_end: int | None = None
        self._diff: list[tuple[str, CachedObject]] = []
        self._diff_reads = 0
        self.diffs_taken = 0
        # After a 410 naming the oldest rv the upstream resumes from (above the cache's): the relist
        # reads the state at exactly that rv, so only the changes before it (which no watch of the
        # upstream can deliver any more) come as a diff, and the watch delivers every later one as an
        # event. Listing the newest state would fold into the diff every write since that rv too (a
        # restarted apiserver's, for as long as the reflector was backing off), and clients would
        # miss their intermediate versions.
        self._relist_at: int | None = None

    def resync(self) -> None:
        """The next ``run`` starts with a list that replaces the cache (a suspended feed: upstream/encodings.py)."""
        self._synced_once = False

    def _set_state(self, state: ReflectorState, why: str = "") -> None:
        if state is not self.state:
            detail = f" ({why})" if why else ""
            log.info("reflector %s: %s -> %s%s", self.resource.qualified, self.state.value, state.value, detail)
            self.state = state

    async def run(self) -> None:
        """Forever, until cancelled."""
        need_list = True
        while True:
            try:
                if need_list:
                    self._set_state(ReflectorState.LISTING)
                    await self._list()
                    need_list = False
                    # The upstream answered a whole list: earlier failures say nothing about it now.
                    self.backoff.reset()
                self._set_state(ReflectorState.WATCHING)
                started = time.monotonic()
                await self._watch()
                self.watch_restarts += 1
                if time.monotonic() - started > 10.0:
                    self.backoff.reset()
                continue
            except asyncio.CancelledError:
                self._set_state(ReflectorState.STOPPED)
                raise
            except Gone as e:
                self.gone += 1
                need_list = True
                at = e.resumable_from
                self._relist_at = at if self._synced_once and at is not None and at > self.cacher.rv else None
                self._set_state(ReflectorState.LISTING, f"410 from upstream: {e}")
                continue
            except WatchStalled as e:
                # A silent watch (an idle upstream that sends no bookmarks, or a hung one) is not a
                # failure to back off from: watch again at once, as client-go does when a watch times
                # out. It cannot spin: each attempt lasts stall_timeout. Backing off here held a
                # cache 12 s behind an upstream that had just come back (the chaos campaign's converge).
                self.watch_restarts += 1
                log.info("reflector %s: %s; watching again", self.resource.qualified, e)
                continue
            except (UpstreamError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
                self.watch_restarts += 1
                delay = self.backoff.next()
                if self.failures is not None:
                    self.failures.failed(self.resource, "list" if need_list else "watch", e, delay)
                self._set_state(ReflectorState.BACKOFF, f"{type(e).__name__}: {e}; retry in {delay:.1f}s")
            await asyncio.sleep(delay)

    # ------------------------------------------------------------------ list

    async def _list(self) -> None:
        started = time.monotonic()
        params: dict[str, str] = {"limit": str(self.config.page_size)}
        exact = self._relist_at
        if exact is not None:
            params |= {"resourceVersion": str(exact), "resourceVersionMatch": "Exact"}
        objects: list[CachedObject] = []
        nbytes = 0
        rv = 0
        pages = 0
        while True:
            try:
                rv, items, token = await self._page(params)
            except UpstreamError as e:
                if e.code == 410 and "continue" in params:
                    # The continue token expired mid-list: start the list over.
                    params, exact = {"limit": str(self.config.page_size)}, None
                    objects, nbytes, pages = [], 0, 0
                    continue
                if exact is not None and not pages:
                    # The state at that rv is not to be had (compacted, or an upstream that does not
                    # serve Exact reads): the newest state, as client-go relists.
                    log.info("relist %s at rv %d refused (%s); listing the newest", self.resource.qualified, exact, e)
                    params, exact, self._relist_at = {"limit": str(self.config.page_size)}, None, None
                    continue
                raise
            pages += 1
            for obj in items:
                nbytes += len(obj.body)
                objects.append(obj)
            if pages % 20 == 0:
                log.info("sync %s: %d objects so far", self.resource.qualified, len(objects))
            if not token:
                break
            params = {"limit": str(self.config.page_size), "continue": token}
        if self.failures is not None:
            self.failures.succeeded(self.resource)
        self._relist_at = None
        await self._before_sync(rv, objects)
        if self._synced_once:
            events = self.cacher.relist(objects, rv)
            self.relists += 1
            if self.after_relist is not None:
                self.after_relist(self.cacher)
            log.info(
                "relisted %s at rv %d: %d objects, %d changes delivered to watchers",
                self.resource.qualified,
                rv,
                len(objects),
                len(events),
            )
        else:
            self.cacher.replace(objects, rv)
            self._synced_once = True
        log.info(
            "synced %s: %d objects, %.1f MB, rv %d, %.2fs",
            self.resource.qualified,
            len(objects),
            nbytes / 1e6,
            rv,
            time.monotonic() - started,
        )

    async def _page(self, params: dict[str, str]) -> tuple[int, list[CachedObject], str | None]:
        """One page of the list: its rv, its objects, and the continue token (None or "" on the last)."""
        page = await self.client.get_json(collection_path(self.resource), params, timeout=60.0)
        rv = parse_resource_version(page["metadata"]["resourceVersion"])
        items = [encode_object(self.resource, item) for item in page.get("items") or []]
        return rv, items, page["metadata"].get("continue")

    async def _before_sync(self, rv: int, objects: list[CachedObject]) -> None:
        """Called once a whole list at ``rv`` is read, before the cache takes it (a hook for other encodings)."""

    # ------------------------------------------------------------------ watch

    async def _watch(self) -> None:
        timeout = int(self.config.min_watch_timeout * (1 + random.random()))
        params = {
            "resourceVersion": str(self.cacher.rv),
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
        }
        self.drop_diff()
        try:
            # Each read's events are applied in the stream's own callback (upstream/client.py).
            await self.client.watch_into(
                self.resource,
                params,
                self._apply,
                stall_timeout=self.config.stall_timeout,
                accept=self.accept,
                split=self.split,
            )
        except UpstreamError as e:
            if e.code == 410:
                raise Gone(e.status.get("message", "") if e.status else str(e)) from None
            raise

    def _apply(self, lines: list[bytes]) -> None:
        """Apply one network read's events as one batch (one dispatch, one coalesced flush).

        An event at or below the newest rv seen is a repeat and skipped — except one at that rv
        for a key the group at that rv does not have yet: an upstream that is a watch cache (another
        watchcache tier) sends groups of events sharing one rv, and a read may end inside one. The
        group's keys are looked up only then (kube's own events never share an rv). So the cache
        is fed in rv order, each event once (invariant 1), a split group continued (invariant 3).
        """
        cacher = self.cacher
        if self.failures is not None and self.resource in self.failures.failing:
            self.failures.succeeded(self.resource)  # the watch delivers again
        batch: list[tuple[str, CachedObject]] = []
        if self._diff_end is not None:
            self._diff_reads += 1
        last = cacher.rv
        # Keys of the group of events at `last` (None: not looked up yet; _MARK: `last` is a list's
        # or a bookmark's rv, after which no event can come at `last`).
        group: set[str] | None = None
        decode = self._decode
        for line in lines:
            kind, obj, detail = decode(line)
            if kind == ERROR:
                if batch:
                    cacher.apply(batch)
                status = detail if isinstance(detail, dict) else {}
                if status.get("code") == 410:
                    raise Gone(str(status.get("message", "")))
                raise UpstreamError(int(status.get("code") or 500), str(status.get("message", "")), status)
            if kind == BOOKMARK:
                if batch:
                    cacher.apply(batch)
                    batch = []
                meta = detail if isinstance(detail, dict) else {}
                rv = parse_resource_version(meta.get("resourceVersion"))
                if self._diff_end is not None and rv >= self._diff_end:
                    self._take_diff()
                    last, group = cacher.rv, _MARK
                    continue
                cacher.progress(rv)  # the upstream's proof of progress (invariant 8)
                if rv > last:
                    last, group = rv, _MARK
                end = (meta.get("annotations") or {}).get(RELIST_DIFF_ANNOTATION)
                if end is not None and self._diff_end is None:
                    self._diff_end, self._diff, self._diff_reads = parse_resource_version(end), [], 1
                continue
            if obj is None:
                log.warning("%s: dropping malformed %s event: %s", self.resource.qualified, kind, detail)
                continue
            if self._diff_end is not None:
                if obj.rv <= self._diff_end:
                    self._diff.append((DELETED if kind == DELETED else kind, obj))
                    continue
                self._take_diff()  # an upstream that sent no BOOKMARK at the diff's end
                last, group = cacher.rv, _MARK
            if obj.rv > last:
                last, group = obj.rv, None
            elif obj.rv < last:
                continue  # already applied (a resumed stream may repeat its start)
            else:
                if group is None:
                    group = self._group_at(last, batch)
                if group is _MARK or obj.key in group:
                    continue
                group.add(obj.key)
            batch.append((DELETED if kind == DELETED else kind, obj))
        if batch:
            cacher.apply(batch)
        self.last_event_at = time.monotonic()

    def _decode(self, line: bytes) -> tuple[str, CachedObject | None, object]:
        """One event of the stream: (type, the object or None, detail).

        The detail is the Status of an ERROR, the metadata of a BOOKMARK (its resourceVersion
        and annotations, as JSON), and why an object could not be cached (then it is None).
        """
        event = orjson.loads(line)
        kind = event.get("type")
        raw = event.get("object") or {}
        if kind == ERROR:
            return kind, None, raw
        if kind == BOOKMARK:
            return kind, None, raw.get("metadata") or {}
        try:
            return kind, encode_object(self.resource, raw, body_in_event(self.resource, line, kind, len(event))), None
        except ObjectError as e:
            return kind, None, e

    def drop_diff(self) -> None:
        """Forget a diff cut short by the end of its stream: the resume from the old rv gets 410."""
        self._diff_end, self._diff, self._diff_reads = None, [], 0

    def _take_diff(self) -> None:
        """Apply an upstream tier's relist diff as one relist here, at its end rv.

        Applied event by event, the diff would put states in this cache (and in reads at
        their rvs) that the upstream never had: its deletions carry stamped rvs. As one
        relist, this tier's watchers get the same diff (``ResourceCache.relist`` orders it
        the same way from the same states), and its history restarts at the same rv (invariant 7).
        """
        end, changes, reads = self._diff_end, self._diff, self._diff_reads
        assert end is not None
        self._diff_end, self._diff, self._diff_reads = None, [], 0
        cacher = self.cacher
        if end <= cacher.rv:
            return
        state = {obj.key: obj for obj in cacher.cache.snapshot().iter_range("", None)}
        for kind, obj in changes:
            if kind == DELETED:
                state.pop(obj.key, None)
            else:
                state[obj.key] = obj
        events = cacher.relist(state.values(), end)
        self.diffs_taken += 1
        if self.after_relist is not None:
            self.after_relist(cacher)
        log.info(
            "took the upstream's relist diff of %s at rv %d: %d changes in %d reads, %d delivered to watchers",
            self.resource.qualified,
            end,
            len(changes),
            reads,
            len(events),
        )

    def _group_at(self, rv: int, batch: list[tuple[str, CachedObject]]) -> set[str]:
        """The keys of the group at ``rv``: in this batch, and in the cache if the group started there."""
        keys = {obj.key for _, obj in batch if obj.rv == rv}
        cache = self.cacher.cache
        if cache.rv == rv:
            if not cache.continues_group():
                return _MARK
            keys.update(e.object.key for e in cache.history.at(rv))
        return keys


# `last` is a list's or a bookmark's rv: nothing can continue at it.
_MARK: set[str] = set()
