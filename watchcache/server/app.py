"""The API handler: admission (in-flight seats, request timeout), then health, a cached read, or the upstream.

A request is served from the cache when it is a get/list/watch of a cached resource
(no subresource) and the representation kube-apiserver would choose for its Accept header
is one the cache writes (``server/decision.py``, ``server/negotiation.py``): full objects in JSON,
or in protobuf from the resource's protobuf cache once it is ready (``ctx.protobuf``),
PartialObjectMetadata(List) in JSON or protobuf, or Tables for kubectl (``server/tables.py``).
Anything else — writes, discovery, subresources, uncached resources, Tables of kinds without a
printer here, YAML, full objects only in protobuf without a protobuf cache, consistent reads the
cache cannot prove fresh — goes to ``ctx.upstream.forward``,
counted by reason (``PassReason``). An Accept header kube would refuse gets kube's 406 here.
Health and readiness: ``server/health.py``; the gate's reviews: ``server/authorization.py``; which
requests are long-running: ``server/limits.py``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, cast

import orjson

from watchcache import apierrors
from watchcache.cache.encoding import Encoding
from watchcache.cache.protobuf import FULL_PROTOBUF
from watchcache.dispatch.cacher import Cacher
from watchcache.fairness.classify import Classification
from watchcache.fairness.controller import FlowControl, Grant, Rejected
from watchcache.fairness.width import ObjectStats
from watchcache.http.request import Admit, Admitted, Request
from watchcache.http.response import Response
from watchcache.http.routing import RequestInfo, parse_request_info
from watchcache.resources import ResourceType
from watchcache.server import fairness, health, seats
from watchcache.server.authorization import authorize, has_credentials
from watchcache.server.context import ApiContext, EarlySend
from watchcache.server.deadlines import Deadline, Deadlines
from watchcache.server.decision import Decisions
from watchcache.server.deprecation import CustomDeprecations, Headers, warning_headers
from watchcache.server.limits import long_running, request_timed_out
from watchcache.server.negotiation import (
    JSON,
    KUBE,
    SIM,
    NotAcceptable,
    PassReason,
    ProtobufRequest,
    TableRequest,
    pretty_requested,
    render_error,
)
from watchcache.server.options import parse_bool, parse_get_options, parse_list_options
from watchcache.server.reads import serve_get, serve_list
from watchcache.server.refusals import PassThrough
from watchcache.server.seats import Seat, Seats
from watchcache.server.status import local_status, merge, readiness_lines
from watchcache.server.tables import Tables, serve_table
from watchcache.server.watch import HttpWatchStream, serve_watch

log = logging.getLogger("watchcache.server")

_TEXT = health.TEXT
_EXEMPT = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})


#: The watch that goes on without its handler, if any (``serve_watch``: its end is the request's end).
Handled = HttpWatchStream | None


class _Admitted:
    """A request's flow control: its grant (None: not flow-controlled, or exempt) and classification
    (None when its authentication failed: no PF headers)."""

    __slots__ = ("classification", "grant")

    def __init__(self, grant: Grant | None, classification: Classification | None) -> None:
        self.grant = grant
        self.classification = classification

    def release(self) -> None:
        if self.grant is not None:
            self.grant.release()


_NOT_CONTROLLED = (None, None)


class _Labels:
    """What a request turned out to be, for its metrics: set by ``_handle`` as soon as it knows, so
    that an error raised after it (a 404 from the cache, a 410, a 504) counts under the request's
    verb and resource, as kube-apiserver's does, not under its HTTP method."""

    __slots__ = ("resource", "verb")

    def __init__(self, verb: str) -> None:
        self.verb = verb
        self.resource: ResourceType | None = None


class ApiHandler:
    def __init__(self, ctx: ApiContext, *, forward_tables: bool = False, forward_upgrades: bool = False) -> None:
        self.ctx = ctx
        # Local endpoints added by the process assembly (``/metrics``, ``/debug/shards``).
        self.routes: dict[str, Callable[[], Awaitable[bytes]]] = {}
        # Called first for every request; raise a StatusError to answer it (fault injection).
        self.admission: list[Callable[[Request], None]] = []
        # More /readyz checks, each (passed, "[+]name ok" line): e.g. the other workers' sync.
        self.readiness_checks: list[Callable[[], tuple[bool, str]]] = []
        # Set at SIGTERM: from then on every request but a probe or a scrape gets 429 with
        # Retry-After, as kube-apiserver's --shutdown-send-retry-after, and /readyz fails. A request
        # may still come on a connection accepted before (a keep-alive one): client-go retries a
        # 429 (a watch without relisting), where an error (a 500) would make its informer relist.
        self.shutting_down = False
        # In front of a real apiserver, negotiate as it does and pass through what the cache cannot
        # write (Table, YAML, full protobuf); the simulated cluster negotiates only what it writes.
        self.endpoint = KUBE if forward_tables else SIM
        # Who answers each request (memoized per Accept header, verb and group).
        self.decisions = Decisions(ctx, self.endpoint, forward_upgrades=forward_upgrades)
        # Printers and Table encodings (kubectl's default output), shared by the requests that ask.
        self.tables = Tables(ctx, passes_through=self.endpoint.passes_through)
        # Deprecated versions of custom resources, from the same CRDs as their printers.
        self.custom_deprecations = CustomDeprecations(self.tables.crd_cacher)
        self.passed_through: dict[str, int] = {}
        # The last GET sent early (``_send_early``): another goes only once it is settled.
        self._early: EarlySend | None = None
        # GETs sent early by what became of their answers: passed back, or dropped (the handler ended otherwise).
        self.sent_early = {"used": 0, "dropped": 0}
        # Every request's --request-timeout, on one timer (``server/deadlines.py``).
        timeout = ctx.config.request_timeout
        self.deadlines = Deadlines(timeout if timeout > 0 else None)
        # Reads of full objects in protobuf of a built-in kind, by answer: "protobuf-cache" (kube's bytes),
        # "json" (its protobuf cache syncing; the client accepts JSON), "passed-through" (it does not).
        self.full_protobuf: dict[str, int] = {}
        # Of those, requests with a shardSelector: the upstream's answer is sharded only if it serves
        # shardSelector itself (kube v1.36 with ShardedListAndWatch on).
        self.passed_through_sharded: dict[str, int] = {}
        # Cached reads being answered now (watches included until they end); shutdown waits for them.
        self.inflight = 0
        # Requests holding an in-flight seat (the --max-requests-inflight limit): every request but
        # health, metrics and upgrades, while it works, until it ends or, for a watch, until its
        # watcher is registered; by kind as kube's apiserver_current_inflight_requests. A request
        # waiting (for a review, a proof, the upstream) gives its seat up (``server/seats.py``).
        self.seats = Seats(ctx.config.max_requests_waiting)
        self.rejected: dict[str, int] = {}
        # Long-running requests passed through (watches of uncached resources, log streams):
        # counted with the cache's watchers toward --max-watchers.
        self.streams = 0
        # As worker ``worker`` of ``workers`` (set by the worker's wiring): which caches this
        # process owns, and the other workers' statuses (``server/status.py``), so that
        # /debug/cache and /readyz?verbose describe the whole group whichever worker answers.
        self.worker: int | None = None
        self.workers = 1
        self.owns: Callable[[ResourceType], bool] = lambda resource: True
        self.peer_statuses: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None
        # API Priority and Fairness (``server/fairness.py``): requests queue for a seat of their
        # priority level instead of a 429 when --max-requests-inflight are busy. None: that 429.
        self.flow_control = FlowControl(ctx.config.max_requests_inflight) if ctx.config.priority_and_fairness else None
        if self.flow_control is not None:
            self.readiness_checks.append(functools.partial(fairness.readiness, self.flow_control))
            self.flow_control.object_stats = self._object_stats  # a LIST's work estimate
        # For the HTTP layer: a request whose body is to come is admitted before its body is read.
        self.admit: Admit | None = self._admit_head if self.flow_control is not None else None
        # Which kinds reads started and why (service/ondemand.py), for /debug/cache and /readyz?verbose.
        self.caching: Callable[[], dict[str, Any]] | None = None

    def _object_stats(self, group: str, version: str, resource: str) -> ObjectStats | None:
        """The objects a cache of the resource holds here (a follower's too), for a LIST's seats."""
        found = self.ctx.registry.get(group, version, resource)
        cacher = None if found is None else self.ctx.cachers.get(found)
        if cacher is None:
            return None
        stats = cacher.cache.stats()
        return ObjectStats(stats.objects, stats.object_bytes)

    @property
    def active(self) -> int:
        """Requests holding an in-flight seat now."""
        return self.seats.active

    @property
    def active_by_kind(self) -> dict[str, int]:
        return self.seats.active_by_kind

    def readiness(self) -> tuple[bool, list[str]]:
        return health.readiness(
            self.ctx, worker=self.worker, shutting_down=self.shutting_down, checks=self.readiness_checks
        )

    def watchers(self) -> int:
        """Watches open: registered on a cache, or passed through (--max-watchers)."""
        caches = [*self.ctx.cachers.values(), *self.ctx.more_cachers()]
        return sum(len(c.dispatcher) for c in caches) + self.streams

    def status(self) -> dict[str, Any]:
        """This process's part of /debug/cache and /readyz?verbose."""
        return local_status(
            self.ctx,
            worker=self.worker,
            owns=self.owns,
            passed_through=self.passed_through,
            inflight=self.inflight,
            checks=[check() for check in self.readiness_checks],
            caching=self.caching() if self.caching is not None else None,
        )

    async def group_statuses(self) -> list[dict[str, Any]]:
        """Every worker's status (this one's first); a worker that does not answer is left out."""
        own = self.status()
        return [own, *await self.peer_statuses()] if self.peer_statuses is not None else [own]

    async def cache_stats(self) -> bytes:
        """Per resource: objects, bytes, history window (events, bytes, oldest rv), watchers, each replica
        and the last upstream failure; the cached reads being answered now (watches included), e.g. one
        waiting for a resourceVersion: the whole process group."""
        return orjson.dumps(merge(await self.group_statuses(), self.workers))

    async def __call__(self, request: Request, response: Response) -> None:
        early: EarlySend | None = request.early  # type: ignore[assignment] # (``prestart``'s)
        if early is None:
            await self._answer(request, response)
            return
        try:
            await self._answer(request, response)
        finally:
            request.early = None  # settled here, not again at its task's end (``prestart``)
            self._settle(early)

    def _deprecation(self, resource: ResourceType | None) -> Headers:
        """kube's deprecation ``Warning`` for a read of ``resource`` (server/deprecation.py)."""
        if resource is not None and resource.custom:
            return self.custom_deprecations.headers(resource)
        return warning_headers(resource)

    def _settle(self, early: EarlySend) -> None:
        if early.discard():
            self.sent_early["dropped"] += 1
        elif early.sent:
            self.sent_early["used"] += 1

    def prestart(self, request: Request, task: asyncio.Task[Any] | None = None) -> None:
        """The protocols' hook (``http.request.Prestart``) for a request complete without a body and its
        handler's task, not yet run: a consistent GET goes to the upstream from here (``_send_early``).
        A task cancelled before it ran (an HTTP/2 stream reset at once) runs no handler, so the task's
        end settles a GET sent early that no handler took."""
        if (
            request.method == "GET"
            and self.ctx.upstream.delegates_consistent_gets
            and not self.shutting_down
            and not request.query_value("resourceVersion")
            and self._idle()
        ):
            try:
                early = self._send_early(request)
            except Exception:  # called from the protocol's parser: the request is answered as without it
                log.exception("sending %s %s early failed", request.method, request.path)
                return
            if early is not None and task is not None:
                task.add_done_callback(lambda _: self._never_handled(request, early))

    def _never_handled(self, request: Request, early: EarlySend) -> None:
        if request.early is early:  # no handler ran (``__call__`` lets go of it as it ends)
            request.early = None
            self._settle(early)

    def _idle(self) -> bool:
        """Nothing else in this worker holds a seat, is at the upstream or waits for it, and no other
        GET sent early is still unanswered: one that arrives now is admitted at once, and its flow's
        turn is free."""
        last = self._early
        if last is not None:
            if not last.settled():
                return False
            self._early = None  # (not held longer than its request: its answer may be large)
        control = self.flow_control
        return not self.seats.active and (control is None or not (control.upstream_turns or control.upstream_line))

    def _send_early(self, request: Request) -> EarlySend | None:
        """A consistent GET the upstream will answer, sent to it as it arrives when the worker is idle:
        the upstream reads it while flow control, the deadline and the counters do their work here,
        instead of after them. Nothing flow control would hold or refuse is sent (``_idle``); one
        the handler then does not pass through (a fault injected, a timeout) has its answer dropped."""
        raw = request.raw_path.split(b"?", 1)[0].decode("latin-1")
        info = parse_request_info("GET", raw, parse_bool(request.query_value("watch")))
        if request.raw_path == b"*" or self.decisions.decide(request, info) is not PassReason.CONSISTENT_GET:
            return None
        early = self._early = self.ctx.upstream.send_early(request)
        return early

    async def _answer(self, request: Request, response: Response) -> None:
        # Health and metrics are never refused, so probes and scrapes still see an overloaded
        # server; upgrades (tunnels) have their own cap, --max-tunnels. Every other request holds an
        # in-flight slot while it works or waits: a watch until it is registered (then
        # --max-watchers counts it), whatever its query says.
        if request.raw_path == b"*":
            # The server itself, not a resource: OPTIONS gets Go's empty 200 (globalOptionsHandler);
            # anything else is not a request this server, or the upstream, could answer.
            if request.method != "OPTIONS":
                raise apierrors.bad_request("invalid request target *: only OPTIONS may ask about the server")
            response.send(200, b"", content_type=_TEXT)
            return
        if self.shutting_down and request.path not in _EXEMPT:
            # kube's WithRetryAfter tears the connection down too, so the client's next request
            # opens a new one, to another replica (HTTP/2: the GOAWAY the drain sends next).
            close_after = getattr(response, "close_after", None)
            if close_after is not None:
                close_after()
            self._reject("shutdown", "the server is shutting down, please try again later")
        # A request ends at --request-timeout unless it turns out long-running (kube's
        # WithTimeoutForNonLongRunningRequests): a watch or a stream lifts the deadline (tunnels
        # never have one), so a client that does not read cannot keep a slot, or its answer, longer.
        timeout = self.ctx.config.request_timeout
        deadlines = self.deadlines
        if deadlines.seconds != (timeout if timeout > 0 else None):  # (a configuration changed in place)
            deadlines = self.deadlines = Deadlines(timeout if timeout > 0 else None)
        deadline = deadlines.new(request.upgrade is None)
        if request.path in _EXEMPT or request.upgrade is not None:
            await self._measured(request, response, None, deadline)
            return
        grant = None
        if self.flow_control is not None:
            admitted: _Admitted | None = request.admitted  # type: ignore[assignment] # (ours: ``_admit_head``)
            if admitted is None:  # no body, or no admission before it (``admit``)
                got = await self._admit(request, response)
                if got is None:
                    return
                grant, classification = got
            else:
                grant, classification = admitted.grant, admitted.classification
            if classification is not None:
                response = cast(Response, fairness.ClassifiedResponse(response, classification))
        elif self.seats.active >= self.ctx.config.max_requests_inflight:
            self._reject("inflight", "too many requests in flight, please try again later")
        kind = "readOnly" if request.method in ("GET", "HEAD", "OPTIONS") else "mutating"
        slot = Seat(self.seats, kind, grant)
        token = seats.current.set(slot)
        try:
            await self._measured(request, response, slot, deadline)
        except apierrors.StatusError as e:
            if not isinstance(response, fairness.ClassifiedResponse) or response.started:
                raise
            # As the protocol would answer it, with the PF headers (kube sets them on every answer).
            retry = () if e.retry_after is None else (("Retry-After", str(e.retry_after)),)
            response.send(e.code, e.body(), content_type=e.content_type, headers=retry)
        finally:
            seats.current.reset(token)
            slot.release()

    async def _admit_head(self, request: Request, response: Response) -> Admitted | None:
        """``admit`` (``http.request.Admit``): a request whose body is to come waits for its seat
        before the body is read, as kube's APF filter runs before any handler reads it; so a queued
        request holds its head and no more. None once answered (kube's 429)."""
        if request.raw_path == b"*" or request.path in _EXEMPT or request.upgrade is not None:
            return _Admitted(None, None)  # answered by ``__call__`` as without a body
        if self.shutting_down:
            self._reject("shutdown", "the server is shutting down, please try again later")
        got = await self._admit(request, response)
        return None if got is None else _Admitted(*got)

    async def _admit(self, request: Request, response: Response) -> tuple[Grant | None, Classification | None] | None:
        """Flow control: the request's grant and classification (for the PF headers), after its wait in
        its priority level's queues; None once answered with kube's 429. A long-running request that
        is not a watch (a log stream) is not flow-controlled, as in kube."""
        control = self.flow_control
        assert control is not None
        info = fairness.request_info(request)
        long = long_running(info)
        if long and info.verb != "watch":
            return _NOT_CONTROLLED
        wait = fairness.wait_budget(self.ctx.config.request_timeout, long)
        grant, classification = await fairness.admit(control, self.ctx.gate, request, info, wait)
        if isinstance(grant, int):  # refused: kube's 429, with its Retry-After in seconds
            if classification is not None:
                response = cast(Response, fairness.ClassifiedResponse(response, classification))
            self._refuse(response, grant)
            return None
        return grant, classification

    def _refuse(self, response: Response, retry_after: int) -> None:
        """Flow control's refusal: kube's 429 (plain text, its Retry-After in seconds)."""
        self.rejected["priority_and_fairness"] = self.rejected.get("priority_and_fairness", 0) + 1
        headers = fairness.rejected_headers(retry_after)
        response.send(429, fairness.REJECTED_BODY, content_type=fairness.REJECTED_TYPE, headers=headers)

    def _reject(self, limit: str, message: str) -> NoReturn:
        self.rejected[limit] = self.rejected.get(limit, 0) + 1
        raise apierrors.too_many_requests(message, 1)

    async def _measured(self, request: Request, response: Response, slot: Seat | None, deadline: Deadline) -> None:
        metrics = self.ctx.metrics
        labels = _Labels(request.method)
        if metrics is None:
            await self._within(request, response, slot, deadline, labels)
            return
        started = time.monotonic()
        try:
            detached = await self._within(request, response, slot, deadline, labels)
        except apierrors.StatusError as e:
            latency = None if labels.verb == "WATCH" else time.monotonic() - started
            metrics.request(labels.verb, labels.resource, e.code, latency)
            raise
        else:
            if detached is not None:
                return  # counted when it ends (``_detached_ended``), as one the handler waited for
            # Watches and tunnels (101) last as long as their clients: no latency to observe.
            endless = labels.verb == "WATCH" or response.status in (0, 101)
            latency = None if endless else time.monotonic() - started
            metrics.request(labels.verb, labels.resource, response.status, latency)

    async def _within(
        self, request: Request, response: Response, slot: Seat | None, deadline: Deadline, labels: _Labels
    ) -> Handled:
        """``_handle`` under the request's deadline: past it, kube's 504, or (answer started) the
        answer is abandoned: the stream reset or the connection closed, as a truncated answer must
        not look complete. Either way the handler is done, and its slot goes back."""
        try:
            async with deadline:
                return await self._handle(request, response, slot, deadline, labels)
        except TimeoutError:
            if not deadline.expired():
                raise
            self.rejected["request_timeout"] = self.rejected.get("request_timeout", 0) + 1
            if not response.started:
                raise request_timed_out() from None
            log.debug("%s %s: answer abandoned at the request timeout", request.method, request.path)
            response.abort()
            return None

    async def _handle(
        self, request: Request, response: Response, slot: Seat | None, deadline: Deadline, labels: _Labels
    ) -> Handled:
        """Answer; returns a watch that goes on detached (the request's metrics: ``labels``)."""
        for admit in self.admission:
            admit(request)
        path = request.path
        if path in ("/healthz", "/livez"):
            response.send(200, b"ok", content_type=_TEXT)
            return None
        if path == "/readyz":
            ok, _ = self.readiness()
            lines = None
            if "verbose" in request.query:
                checks = [line for check in self.readiness_checks for line in (check()[1],)]
                if self.shutting_down:
                    checks.insert(0, health.SHUTTING_DOWN)
                lines = readiness_lines(await self.group_statuses(), self.workers, checks)
            status, body = health.readyz_body(ok, lines)
            response.send(status, body, content_type=_TEXT)
            return None
        route = self.routes.get(path)
        if (route is not None or path == "/debug/cache") and self.ctx.gate is not None:
            # The proxy's own endpoints, as kube-apiserver's: a SubjectAccessReview for the path.
            await self._authorize(request, None)
        if route is not None:
            content_type = "text/plain; version=0.0.4; charset=utf-8" if path == "/metrics" else "application/json"
            response.send(200, await route(), content_type=content_type)
            return None
        if path == "/debug/cache":
            response.send(200, await self.cache_stats())
            return None

        raw = request.raw_path.split(b"?", 1)[0].decode("latin-1")
        info = parse_request_info(request.method, raw, parse_bool(request.query_value("watch")))
        verb = labels.verb = info.verb.upper()
        resource = labels.resource = (
            self.ctx.registry.get(info.group, info.version, info.resource) if info.is_resource_request else None
        )
        decision = self.decisions.decide(request, info)
        if isinstance(decision, NotAcceptable):
            if self.ctx.gate is not None:
                await self._authorize(request, info)
            if decision.media in (None, JSON) or not self.endpoint.passes_through:
                raise decision
            decision = PassReason.MEDIA_TYPE  # kube writes this 406 in YAML or protobuf: let it
        if isinstance(decision, (Encoding, TableRequest, ProtobufRequest)) and self.ctx.gate is not None:
            # Before any cached byte, and before a follower replica (or a protobuf cache) is
            # built for it: 401/403 as the upstream would answer (once per watch).
            await self._authorize(request, info)
        cacher = None
        if isinstance(decision, ProtobufRequest):
            # Full objects in protobuf: the protobuf cache (made on first use), else as without one.
            assert resource is not None
            if self.ctx.protobuf is not None:
                with seats.waiting():  # for a new protobuf cache to sync (bounded: upstream/protobuf.py)
                    cacher = await self.ctx.protobuf(resource)
            decision = decision.fallback if cacher is None else FULL_PROTOBUF
            answer = "protobuf-cache" if cacher else "json" if isinstance(decision, Encoding) else "passed-through"
            self.full_protobuf[answer] = self.full_protobuf.get(answer, 0) + 1
        if cacher is None and isinstance(decision, (Encoding, TableRequest)) and not self.decisions.cache_for(resource):
            decision = PassReason.UNCACHED_RESOURCE
        if isinstance(decision, (Encoding, TableRequest)):
            if info.verb == "watch":
                if self.watchers() >= self.ctx.config.max_watchers:
                    self._reject("watchers", "too many watches open on this server, please try again later")
                deadline.reschedule(None)  # long-running: its own timeout, lag and budget rules
            # kube's deprecation Warning: on what its resource handler answers, errors included.
            warnings = self._deprecation(resource) if self.endpoint is KUBE else ()
            self.inflight += 1
            detached = None
            try:
                detached = await self._serve_cached(request, response, info, decision, slot, warnings, cacher)
                return detached
            except PassThrough as p:
                decision = p.reason
            except apierrors.StatusError as e:
                pretty = pretty_requested(request.query, request.headers, self.endpoint)
                error = render_error(e, request.headers.get("accept"), self.endpoint, pretty=pretty)
                if not warnings or response.started:
                    raise error from None
                retry = () if error.retry_after is None else (("Retry-After", str(error.retry_after)),)
                response.send(error.code, error.body(), content_type=error.content_type, headers=(*warnings, *retry))
                return None
            finally:
                if detached is None:
                    self.inflight -= 1
                else:  # a watch goes on without this handler: in flight until it ends
                    detached.on_end(functools.partial(self._detached_ended, verb, resource, response.status))
        reason = decision.value
        self.passed_through[reason] = self.passed_through.get(reason, 0) + 1
        if info.is_resource_request and request.query_value("shardSelector"):
            self.passed_through_sharded[reason] = self.passed_through_sharded.get(reason, 0) + 1
        if request.http_version == "2" and self.ctx.gate is not None and not has_credentials(request):
            # Anonymous to the upstream, which would end its own HTTP/2 connection after it: so does this one.
            request.close_connection = True
        forwarded = info if info.is_resource_request else None
        if request.upgrade is not None or not long_running(info):
            # The upstream's work, under the upstream's own flow control; waited for without a seat,
            # past as many of its flow's as its level has seats in its flow's line (``Grant.upstream_turn``).
            wait = fairness.wait_budget(self.ctx.config.request_timeout, False)
            try:
                async with seats.WaitingForUpstream(wait):
                    await self.ctx.upstream.forward(request, response, forwarded)
            except Rejected as e:  # its turn did not come within a queue's wait: kube's 429 (time-out)
                assert self.flow_control is not None
                self._refuse(response, self.flow_control.retry_after(e.classification))
            return None
        # A watch or stream passed through: open as long as the upstream keeps it, so it counts as
        # a watch (--max-watchers), not as a request in flight, and has no request deadline.
        if self.watchers() >= self.ctx.config.max_watchers:
            self._reject("watchers", "too many watches open on this server, please try again later")
        deadline.reschedule(None)
        if slot is not None:
            slot.release()
        self.streams += 1
        try:
            await self.ctx.upstream.forward(request, response, forwarded)
        finally:
            self.streams -= 1
        return None

    def _detached_ended(self, verb: str, resource: ResourceType | None, status: int) -> None:
        """A detached watch ended: what ``_handle`` and ``_measured`` do at a request's end."""
        self.inflight -= 1
        if self.ctx.metrics is not None:
            self.ctx.metrics.request(verb, resource, status, None)

    async def _authorize(self, request: Request, info: RequestInfo | None) -> None:
        gate = self.ctx.gate
        assert gate is not None
        await authorize(gate, request, info, self.endpoint)

    async def _serve_cached(
        self,
        request: Request,
        response: Response,
        info: RequestInfo,
        encoding: Encoding | TableRequest,
        slot: Seat | None,
        headers: Sequence[tuple[str, str]] = (),
        cacher: Cacher | None = None,
    ) -> HttpWatchStream | None:
        """``cacher``: the cache to read (a protobuf cache), else the resource's own."""
        resource = self.ctx.registry.get(info.group, info.version, info.resource)
        assert resource is not None
        if info.namespace and not resource.namespaced:
            raise apierrors.path_not_found()
        if cacher is None:
            cacher = self.ctx.cachers[resource]
        cacher.touch()
        if info.verb == "get":
            opts = parse_get_options(request.query)
        else:
            max_limit = self.ctx.config.max_limit
            opts = parse_list_options(request.query, watch_path=info.verb == "watch", max_limit=max_limit)
        started = slot.release if slot else None
        # Indented JSON for a person (a watch never is)
        pretty = info.verb != "watch" and pretty_requested(request.query, request.headers, self.endpoint)
        if isinstance(encoding, TableRequest):
            return await serve_table(self.ctx, self.tables, cacher, info, opts, request, response, encoding.version,
                                     started=started, headers=headers, pretty=pretty)  # fmt: skip
        if info.verb == "watch":
            return await serve_watch(self.ctx, cacher, info, opts, response, encoding, started=started, headers=headers)
        if info.verb == "get":
            await serve_get(self.ctx, cacher, info, opts, response, encoding, headers=headers, pretty=pretty)
        else:
            await serve_list(self.ctx, cacher, info, opts, response, encoding, headers=headers, pretty=pretty)
        return None
