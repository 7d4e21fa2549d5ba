"""WATCH over HTTP: the status line, the chunks, flow control, the timeout, Status errors.

What a watch *is* lives below HTTP: the read's owner (``dispatch/reads.py``) admits it (readiness,
freshness) and starts it without a gap (``Cacher.start_watch``, invariant 2), and ``Cacher.catch_up``
runs the lag cycle (invariant 6). This module parses the request, writes what the watcher has
pending, one chunk per flush pass, and tells the cacher when a lagging watcher's client has drained.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from watchcache import apierrors
from watchcache.cache.encoding import FULL_JSON, Encoding
from watchcache.cache.semantics import ListOptions, plan_watch
from watchcache.dispatch import reads
from watchcache.dispatch.cacher import Cacher, WatchRequest
from watchcache.dispatch.outcomes import Expired, Refusal, RetryLater, TooLarge
from watchcache.http.flowcontrol import ConnectionClosed
from watchcache.http.response import Response
from watchcache.http.routing import RequestInfo
from watchcache.server.context import ApiContext
from watchcache.server.refusals import refuse
from watchcache.server.selection import parse_predicate
from watchcache.watchers.deadlines import WatchDeadlines
from watchcache.watchers.flush import FlushScheduler
from watchcache.watchers.watcher import CloseReason, Watcher

if TYPE_CHECKING:
    from watchcache.server.metrics import Metrics

logger = logging.getLogger("watchcache.server.watch")

# One flush writes at most this much, so a watcher with a large backlog (initial events of
# a big list) never copies it all into the transport buffer at once.
FLUSH_BYTES = 1 << 20


class HttpWatchStream:
    """The ``WatchSink`` of one watcher: flushes its pending frames as HTTP chunks, with flow control.

    A lagging watcher's catch-up (``Cacher.catch_up``) runs from ``flush``, once the client
    has drained what was written: the cacher decides what to replay, or to end it with 410.

    Detached (an answer that outlives its handler: HTTP/1.1), a registered watch is this object
    and its watcher, and nothing else: no handler task or coroutine chain waits for its end, nor
    the request they would keep (docs/lab/performance-notebook.md, "Memory per idle watch"). Its end
    (``_end``) then runs from the watcher's ``closed``: its deadline dropped, what is pending
    written, the body ended, and the handler's own end (``on_end``: its in-flight count, its
    request metric). Otherwise the handler awaits ``done`` and ends the stream itself.
    """

    __slots__ = (
        "_drain_task",
        "_end_request",
        "cacher",
        "deadlines",
        "done",
        "flusher",
        "metrics",
        "pending_since",
        "response",
        "watcher",
    )

    def __init__(
        self,
        response: Response,
        flusher: FlushScheduler,
        cacher: Cacher,
        metrics: Metrics | None,
        *,
        detached: bool = False,
    ) -> None:
        self.response = response
        self.flusher = flusher
        self.cacher = cacher
        self.metrics = metrics
        # When the watcher's pending frames went from none to some (delivery latency).
        self.pending_since = 0.0
        self.watcher: Watcher | None = None
        # The handler waits on it, unless detached.
        self.done: asyncio.Future[str] | None = None if detached else asyncio.get_running_loop().create_future()
        # Where the watch's timeout is kept, once it is registered there.
        self.deadlines: WatchDeadlines | None = None
        self._drain_task: asyncio.Future[None] | None = None
        # Detached: run once the stream has ended (the handler's own end).
        self._end_request: Callable[[], object] | None = None

    def on_end(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` once this detached stream has ended (one: the request's end)."""
        assert self._end_request is None
        self._end_request = callback

    def client_gone(self) -> None:
        if self.watcher is not None:
            self.watcher.close(CloseReason.CLIENT_GONE)

    # WatchSink
    def wake(self, watcher: Watcher) -> None:
        self.pending_since = time.monotonic()
        self.flusher.mark(self)

    def closed(self, watcher: Watcher, reason: str) -> None:
        done = self.done
        if done is None:
            # On the next loop pass, as a handler awaiting ``done`` would resume: never from inside
            # the fan-out or the flush pass that closed it.
            asyncio.get_running_loop().call_soon(self._end)
        elif not done.done():
            done.set_result(reason)

    def lagging(self, watcher: Watcher) -> None:
        # Its buffer is gone: flush once the client can take more, which runs the catch-up.
        self.flusher.mark(self)

    # Flushable
    def flush(self) -> int:
        watcher = self.watcher
        if watcher is None or watcher.closed:
            return 0
        response = self.response
        if response.closed:
            watcher.close(CloseReason.CLIENT_GONE)
            return 0
        if not response.writable:
            # Over the transport's high-water mark: keep frames in the watcher's bounded
            # buffer and flush again once the client has read.
            if self._drain_task is None:
                self._drain_task = asyncio.ensure_future(self._resume_after_drain())
            return 0
        if watcher.pending:
            frames, events = watcher.take(FLUSH_BYTES)
            size = response.write_chunk(frames)
            cacher = self.cacher
            cacher.count_sent(events, size)
            metrics = self.metrics
            if metrics is not None and metrics.delivery_sample and events:
                metrics.flushed(cacher.resource, self.pending_since, size // events)
            if watcher.pending or watcher.lagging:
                self.pending_since = time.monotonic()
                self.flusher.mark(self)
            return events if size else 0
        if watcher.lagging and (self.cacher.catch_up(watcher) or watcher.pending):
            # A step was queued (or a 410): written by the next pass, then the next step.
            self.flusher.mark(self)
        return 0

    def flush_failed(self, error: Exception) -> None:
        """``flush`` raised: end this watch, and only it (invariant 11). The connection is aborted, since
        a chunk may be half-written; the client sees a broken stream and resumes from the last event it read."""
        self.cacher.count_failure("flush")
        if self.watcher is not None:
            self.watcher.close(CloseReason.INTERNAL_ERROR)
        self.response.abort()

    def stop(self) -> None:
        """Close the watcher and drop its timeout: whatever ended it, it leaves the budget and
        its cacher (once registered it must)."""
        watcher = self.watcher
        if watcher is not None:
            watcher.close(CloseReason.SHUTDOWN)
            if self.deadlines is not None:
                self.deadlines.ended(watcher)
                self.deadlines = None

    def finish(self) -> None:
        """The watch is over: stop it, write what is pending, end the body."""
        self.stop()
        watcher = self.watcher
        assert watcher is not None
        response = self.response
        if not response.closed:
            if watcher.pending and response.writable:
                response.write_chunk(watcher.take()[0])
            response.end_chunked()

    def _end(self) -> None:
        """A detached stream's end: what its handler would have done after ``done``, then the handler's own end."""
        if self.watcher is None:
            return  # closed before it was registered: the handler answers
        try:
            self.finish()
        except Exception:
            # As a handler failing after its answer started: a truncated stream must not look complete.
            logger.exception("ending a watch of %s failed", self.cacher.resource.qualified)
            self.response.abort()
        finally:
            end, self._end_request = self._end_request, None
            if end is not None:
                try:
                    end()
                except Exception:
                    logger.exception("a watch's end callback failed")

    async def _resume_after_drain(self) -> None:
        try:
            await self.response.drain()
        except ConnectionClosed:
            if self.watcher is not None:
                self.watcher.close(CloseReason.CLIENT_GONE)
            return
        finally:
            self._drain_task = None
        self.flusher.mark(self)


def _watch_timeout(ctx: ApiContext, opts: ListOptions) -> float:
    if opts.timeout_seconds:
        return float(opts.timeout_seconds)
    low = ctx.config.min_request_timeout
    return low * (1.0 + random.random())


async def serve_watch(
    ctx: ApiContext,
    cacher: Cacher,
    info: RequestInfo,
    opts: ListOptions,
    response: Response,
    encoding: Encoding = FULL_JSON,
    *,
    started: Callable[[], None] | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> HttpWatchStream | None:
    """Serve one watch; ``started()`` is called once it is a registered watcher (not while it waits).

    ``headers``: more response headers (a deprecation ``Warning``). Returns the stream when the
    watch goes on detached from the handler (``Response.outlives_handler``): the caller's own end
    of the request goes to its ``on_end``; None when the watch has ended."""
    # kube's watch timeout runs from before its storage's Watch call (the request's context): waits
    # for readiness or freshness here count against it.
    began = time.monotonic()
    cacher.count_watch_request()
    namespace = info.namespace
    if info.name:
        # /watch/namespaces/ns/pods/name: the legacy single-object watch is a name field selector.
        selector = f"metadata.name={info.name}"
        opts = dataclasses.replace(opts, field_selector=",".join(s for s in (opts.field_selector, selector) if s))
    predicate = parse_predicate(cacher.resource, namespace, opts)
    plan = plan_watch(opts)
    if opts.timeout_seconds is not None and opts.timeout_seconds < 0:
        # kube: the watch's context is past its deadline before it starts. Without a resourceVersion
        # its wait for freshness fails on it (an ERROR event); with one there is no wait, and the
        # watch ends at once with no event.
        response.start_chunked(200, content_type=encoding.watch_content_type, headers=headers)
        if not opts.resource_version:
            response.write_chunk([encoding.error_frame(apierrors.internal_error("context deadline exceeded"))])
        response.end_chunked()
        return None
    refused = await reads.admit_watch(ctx, cacher, plan, namespace or None)
    if refused is not None and not isinstance(refused, TooLarge):
        refuse(refused)  # before the watch is accepted: a Status (429), or the upstream answers

    response.start_chunked(200, content_type=encoding.watch_content_type, headers=headers)
    detached = response.outlives_handler
    stream = HttpWatchStream(response, ctx.flusher, cacher, ctx.metrics, detached=detached)
    timeout = _watch_timeout(ctx, opts)
    if isinstance(refused, TooLarge) and not plan.initial_events:
        # kube accepts a watch from an rv ahead of its cache, and sends what comes after it.
        ended: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def went() -> None:
            if not ended.done():
                ended.set_result(True)

        response.add_close_callback(went)
        ctx.waiting_watches.add(ended)
        try:
            left = timeout - (time.monotonic() - began)
            started_now = left > 0 and await reads.await_watch_start(ctx, cacher, plan.rv, left, ended)
        finally:
            ctx.waiting_watches.discard(ended)
        if not started_now:
            if not (ended.done() and ended.result()):
                response.end_chunked()  # its timeout (or shutdown): no event came, as at kube
            return None
        refused = None
    timeout = max(timeout - (time.monotonic() - began), 0.001)
    outcome: Watcher | Refusal
    if refused is None:
        request = WatchRequest(
            predicate,
            plan,
            timeout=timeout,
            encoding=encoding,
            allow_bookmarks=opts.allow_watch_bookmarks,
            bookmark_interval=ctx.config.bookmark_interval,
            max_pending_bytes=ctx.config.watch_max_pending_bytes,
            budget=ctx.watch_budget,
        )
        outcome = await reads.start_watch(ctx, cacher, request, stream)  # a Watcher, or 410/429 before the window
    else:
        outcome = refused  # an rv the cache did not reach in time: 504
    if isinstance(outcome, Refusal):
        # Once a watch is accepted, kube reports errors as an ERROR event, then ends it.
        assert isinstance(outcome, (TooLarge, Expired, RetryLater)), outcome
        response.write_chunk([encoding.error_frame(outcome.status())])
        response.end_chunked()
        return None
    # Registered in the step that returned it; its first flush comes later in this loop pass.
    # From here to the return (detached) or the await, no await: nothing can end it unseen.
    stream.watcher = watcher = outcome
    try:
        if started is not None:
            started()  # a watcher now: its in-flight slot is given back (--max-watchers counts it)
        response.add_close_callback(stream.client_gone)
        stream.deadlines = ctx.watch_deadlines
        ctx.watch_deadlines.add(watcher, timeout)
        if detached:
            return stream  # (a watcher already closed has scheduled its ``_end``)
        assert stream.done is not None
        await stream.done
    except BaseException:
        stream.stop()  # and the error goes up: the connection closes, as a cut stream must look cut
        raise
    stream.finish()
    return None
