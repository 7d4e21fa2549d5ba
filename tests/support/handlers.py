"""Drive ApiHandler without sockets: a fake upstream, a Cacher fed by the test, FakeResponse."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode

from harness.waiting import until
from tests.support.factories import FakeResponse, pod
from watchcache import apierrors
from watchcache.cache.continuetoken import ContinueCodec
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.freshness import Reached
from watchcache.http.request import Request
from watchcache.http.routing import RequestInfo
from watchcache.resources import PODS, ResourceRegistry
from watchcache.server.app import ApiHandler
from watchcache.server.context import ApiContext, ServeConfig
from watchcache.watchers.flush import FlushScheduler

__all__ = ["ADDED", "DELETED", "MODIFIED", "Harness", "WatchStream", "until"]


class FakeEarly:
    """What ``FakeUpstream.send_early`` started (``server.context.EarlySend``): taken by ``forward``."""

    sent = True

    def __init__(self) -> None:
        self.taken = False
        self.answered = False  # the test's say: the upstream answered it

    def settled(self) -> bool:
        return self.taken or self.answered

    def discard(self) -> bool:
        if self.taken:
            return False
        self.taken = True
        return True


class FakeUpstream:
    """Knows the upstream's rv; proves nothing (the cache reaches an rv by the test's writes)."""

    # As the simulated cluster: an rv older than the window is compacted (a proxy's upstream may
    # still have it: tests set this to True to see such reads passed through).
    answers_old_reads = False
    answers_reads_ahead = False
    no_bookmarks = False  # unprovable(): the upstream's probes of this resource end without a bookmark
    # As the simulated cluster: GETs without resourceVersion from the cache (tests of the proxy's
    # delegation set it).
    delegates_consistent_gets = False

    def __init__(self) -> None:
        self.rv = 0
        # Scope proofs asked for (consistent LISTs and watches), by namespace (None: all).
        self.scope_proofs: list[str | None] = []
        # Times the upstream's current state was asked for: a scope proof or its rv (``current_rv``).
        self.consistent_calls = 0
        self.proving_now = 0
        self.proving_seen = 0
        self.forwarded: list[str] = []
        # Set: a forwarded request is held open until the event is set (a streaming pass-through).
        self.hold: asyncio.Event | None = None
        # The paths of GETs sent early (``send_early``); None: none is (no pooled connection, say).
        self.sent_early: list[str] | None = None

    async def current_rv(self, cacher: Cacher, timeout: float) -> int:
        self.consistent_calls += 1
        return self.rv

    async def prove_scope(self, cacher: Cacher, namespace: str | None, timeout: float) -> Reached:
        """The scope is proven once the cache reaches the upstream's rv (by the test's writes), within ``timeout``."""
        self.scope_proofs.append(namespace)
        self.consistent_calls += 1
        self.proving_now += 1
        self.proving_seen += 1
        try:
            return Reached.EVENTS if await cacher.wait_for_rv(self.rv, timeout) else Reached.TIMEOUT
        finally:
            self.proving_now -= 1

    def unprovable(self, cacher: Cacher) -> bool:
        return self.no_bookmarks

    @contextlib.contextmanager
    def proving(self, cacher: Cacher) -> Iterator[None]:
        self.proving_now += 1
        self.proving_seen += 1
        try:
            yield
        finally:
            self.proving_now -= 1

    def send_early(self, request: Request) -> FakeEarly | None:
        if self.sent_early is None:
            return None
        self.sent_early.append(request.path)
        early = request.early = FakeEarly()
        return early

    async def forward(self, request: Request, response: Any, info: RequestInfo | None) -> None:
        if isinstance(request.early, FakeEarly):
            request.early.taken = True  # as ``passthrough.exchange`` takes its answer
        self.forwarded.append(request.path)
        if self.hold is not None:
            await self.hold.wait()
        raise apierrors.path_not_found()


class Harness:
    """A pods cache at rv 10 with default/p0..p4 (label i=0/1), history window of ``max_events``.

    Consistent reads wait for the cache (``FakeUpstream.prove_scope``); GETs too, unless a test
    sets ``delegates_consistent_gets``. ``detached``: watches are answered as over HTTP/1.1, whose
    handler returns once the watcher is registered (``Response.outlives_handler``); else as over
    HTTP/2, whose handler returns when the watch ends.
    """

    detached = False

    def __init__(
        self, *, max_events: int = 100, fresh_wait: float = 0.2, bookmark_interval: float = 10.0, **config: Any
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.upstream = FakeUpstream()
        self.cacher = Cacher(PODS, CacheConfig(history_max_events=max_events))
        self.cacher.replace([pod(f"p{i}", rv=i + 1, labels={"i": str(i % 2)}) for i in range(5)], 10)
        self.upstream.rv = 10
        self.ctx = ApiContext(
            registry=ResourceRegistry((PODS,)),
            cachers={PODS: self.cacher},
            upstream=self.upstream,
            codec=ContinueCodec(b"t" * 32),
            flusher=FlushScheduler(self.loop),
            config=ServeConfig(
                fresh_wait=fresh_wait,
                bookmark_interval=bookmark_interval,
                **config,
            ),
        )
        self.handler = ApiHandler(self.ctx)
        self.rv = 10

    def write(self, kind: str, name: str, **kw: Any) -> int:
        """Commit one change upstream and feed it to the cache; returns its rv."""
        self.rv += 1
        self.upstream.rv = self.rv
        self.cacher.apply([(kind, pod(name, rv=self.rv, **kw))])
        return self.rv

    @staticmethod
    def make_request(path: str, query: dict[str, Any] | None = None, method: str = "GET") -> Request:
        qs = urlencode(query or {})
        raw = (path + ("?" + qs if qs else "")).encode()
        return Request(method, raw, path, parse_qs(qs, keep_blank_values=True), {}, b"", "1.1", "test")

    async def request(self, path: str, query: dict[str, Any] | None = None, method: str = "GET") -> FakeResponse:
        return await self.send(self.make_request(path, query, method))

    async def send(self, req: Request) -> FakeResponse:
        """The handler's answer to ``req`` (as built by ``make_request``)."""
        resp = FakeResponse()
        try:
            await self.handler(req, resp)
        except apierrors.StatusError as e:
            resp.send(e.code, e.body())
        return resp

    async def list(self, **query: Any) -> FakeResponse:
        return await self.request("/api/v1/namespaces/default/pods", query)

    async def get(self, name: str, **query: Any) -> FakeResponse:
        return await self.request(f"/api/v1/namespaces/default/pods/{name}", query)

    def start_watch(self, resp: FakeResponse | None = None, **query: Any) -> WatchStream:
        """A watch request, sent: the handler runs it in the background as the client reads."""
        return WatchStream(self, query, resp)

    async def open_watch(self, resp: FakeResponse | None = None, **query: Any) -> WatchStream:
        """A watch whose watcher the server has registered (or that it answered without one)."""
        return await self.start_watch(resp, **query).started()

    async def watch(self, then: Callable[[], object] | None = None, **query: Any) -> FakeResponse:
        """Run a watch: once its watcher is registered, call ``then`` (the writes under test), let
        everything dispatched be written, disconnect. Returns what the client got."""
        stream = await self.open_watch(**query)
        if then is not None:
            then()
        return await stream.close()


class WatchStream:
    """One watch request against the handler, its connection held open until ``close``."""

    def __init__(self, h: Harness, query: dict[str, Any], resp: FakeResponse | None = None) -> None:
        self.h = h
        self.resp = resp if resp is not None else FakeResponse(outlives_handler=h.detached)
        qs = urlencode({"watch": "true", **query})
        path = "/api/v1/namespaces/default/pods"
        req = Request(
            "GET", (path + "?" + qs).encode(), path, parse_qs(qs, keep_blank_values=True), {}, b"", "1.1", "test"
        )
        self._before = len(h.cacher.dispatcher)
        self.task = asyncio.ensure_future(h.handler(req, self.resp))

    @property
    def registered(self) -> bool:
        return len(self.h.cacher.dispatcher) > self._before

    async def started(self) -> WatchStream:
        """Until the server has registered the watcher (events from now on reach it), or has answered."""
        await until(lambda: self.registered or self.task.done())
        return self

    async def in_flight(self) -> WatchStream:
        """Until the handler has the request and is waiting (e.g. for the cache to reach its rv)."""
        await until(lambda: self.h.handler.inflight > 0 or self.task.done())
        return self

    async def close(self) -> FakeResponse:
        """Let every frame dispatched so far be written, then disconnect; returns what the client got."""
        await until(lambda: self.h.ctx.flusher.idle)
        if not self.task.done() or self._going_on():
            self.resp.disconnect()
        return await self.ended(1.0)

    def _going_on(self) -> bool:
        """The handler returned and the watch goes on without it (detached)."""
        resp = self.resp
        return resp.outlives_handler and resp.chunked and not resp.ended and not resp.closed

    async def ended(self, timeout: float) -> FakeResponse:
        """Until the handler has returned (the server ended the watch, or ``close`` did), and a
        detached watch has ended too."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await asyncio.wait_for(self.task, timeout)
        except apierrors.StatusError as e:
            self.resp.send(e.code, e.body())
        while self._going_on():
            if loop.time() > deadline:
                raise TimeoutError("the detached watch did not end")
            await asyncio.sleep(0.005)
        await asyncio.sleep(0)  # its end (scheduled by its watcher's close) has run
        return self.resp


_background: set[asyncio.Future[Any]] = set()


def background(coro: Any) -> asyncio.Future[Any]:
    """Run ``coro`` alongside the request under test (kept referenced until done)."""
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


def arun(fn: Any) -> Any:
    """Run an async test function in a fresh event loop (pytest-asyncio is not a dependency)."""

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        return asyncio.run(fn(*a, **kw))

    return wrapper
