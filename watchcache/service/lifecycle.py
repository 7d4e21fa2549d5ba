"""The process lifecycle of ``watchcache serve`` and ``watchcache sim``: wire, listen, run, stop.

Each mode's wiring (``service.proxy``, ``sim.wiring``) builds a ``Wiring``: the handler
context and the tasks that feed it. This module turns it into a process: metrics, TLS,
the listening socket, a once-a-second tick, and the shutdown. Both log one line
containing ``ready: listening on URL`` once ``/readyz`` answers 200, or ``serving, not ready:
REASON; listening on URL`` until then (``service.readiness``), and stop cleanly on
SIGTERM/SIGINT: stop listening, end every watch (flushing what is pending, after a last
bookmark), exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import random
import resource
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from watchcache.auth.authn import CertAuthenticator
from watchcache.auth.metrics import GateCollector
from watchcache.auth.requestheader import ca_subjects
from watchcache.cache.continuetoken import ContinueCodec
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.metrics import BackfillCollector, CacherCollector
from watchcache.fairness.metrics import FlowControlCollector
from watchcache.http.admission import Admission
from watchcache.http.h2protocol import create_h2_factory
from watchcache.http.listener import bind_listener
from watchcache.http.metrics import AdmissionCollector
from watchcache.http.server import start_server
from watchcache.http.tls import ServingCert
from watchcache.metrics import process_registry, render
from watchcache.resources import ResourceRegistry, ResourceType
from watchcache.server.app import ApiHandler
from watchcache.server.context import ApiContext, Upstream
from watchcache.server.metrics import HandlerCollector, Metrics
from watchcache.service.openfiles import fit_connections
from watchcache.service.options import RunOptions, ShardOptions, first_worker
from watchcache.service.readiness import ReadinessLog
from watchcache.shard.follower import Follower
from watchcache.shard.metrics import FollowerCollector, RestartsCollector
from watchcache.shard.supervisor import SUPERVISOR_PID
from watchcache.upstream.consistency import ConsistentReads
from watchcache.upstream.metrics import ConsistencyCollector, ReflectorCollector, UpstreamErrorsCollector
from watchcache.upstream.reflector import Reflector
from watchcache.watchers.budget import WatchBudget
from watchcache.watchers.flush import FlushScheduler
from watchcache.watchers.metrics import DeliveryCollector
from watchcache.watchers.watcher import CloseReason

log = logging.getLogger("watchcache")

MetricsRoute = Callable[[], Awaitable[bytes]]


@dataclass
class Wiring:
    """What a mode builds: the handler context plus the tasks that feed it."""

    ctx: ApiContext
    handler: ApiHandler
    tasks: Sequence[asyncio.Future[None]] = field(default_factory=list)
    cleanup: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    consistent: ConsistentReads | None = None
    # Called every tick (about once a second), e.g. dropping idle followers.
    housekeeping: list[Callable[[], object]] = field(default_factory=list)
    reflectors: list[Reflector] = field(default_factory=list)
    # The followers this worker runs (for their metrics).
    following: Callable[[], Iterable[Follower]] = tuple
    # Given this process's own exposition, the /metrics route (a worker's gathers every worker's).
    metrics_route: Callable[[Callable[[], bytes]], MetricsRoute] | None = None
    # Called once the port is open (ready or not: service.readiness logs when /readyz turns 200).
    on_listening: list[Callable[[], object]] = field(default_factory=list)
    # Awaited before the port is served: a worker restarted while its peers serve waits here for
    # its own caches, so that clients it would accept meanwhile are served by the peers instead.
    before_serving: Callable[[], Awaitable[None]] | None = None
    # Trusted by the TLS listener besides --client-ca-file: the sim's request-header CA.
    requestheader_ca_file: str | None = None
    # More metric collectors of this mode's components (e.g. the tunnels').
    collectors: list[Collector] = field(default_factory=list)


def api_context(
    options: RunOptions, registry: ResourceRegistry, cachers: dict[ResourceType, Cacher], upstream: Upstream
) -> ApiContext:
    # A random key is right for one process; replicas must share a configured one.
    key = options.continue_key or os.urandom(32)
    serve = options.serve
    flusher = FlushScheduler(
        asyncio.get_running_loop(), serve.watch_flush_interval, serve.watch_flush_pacing, serve.watch_flush_max_delay
    )
    limit = options.serve.watch_max_total_bytes
    return ApiContext(
        registry=registry,
        cachers=cachers,
        upstream=upstream,
        codec=ContinueCodec(key),
        flusher=flusher,
        config=options.serve,
        watch_budget=WatchBudget(limit, flusher) if limit > 0 else None,
    )


async def serve(
    name: str,
    options: RunOptions,
    wire: Callable[[RunOptions], Awaitable[Wiring]],
    listener: socket.socket | None = None,
) -> None:
    """Run one mode until SIGTERM on ``listener`` (bound by the command before anything started, or
    inherited from the supervisor; without one, bound here on ``options.host:port``)."""
    if listener is None:
        listener = bind_listener(options.host, options.port)
    # The cyclic collector stops the loop for as long as a pass takes. What is alive now (modules,
    # classes, functions: ~54,000 objects after the imports) lives as long as the process: frozen, full
    # passes no longer traverse it (CPython's advice for a server). And a young generation of 7,000
    # allocations (CPython's default: 700) makes every pass 10x rarer: 30,000 pods cached, 50 changes/s,
    # GETs for 40 s: full passes 19 -> 2, the longest 60 -> 14 ms, all passes' time 790 -> 196 ms.
    gc.freeze()
    gc.set_threshold(7000, 10, 10)
    # Port 0 is resolved: what the log and the wiring say is the port clients use.
    options = dataclasses.replace(options, port=listener.getsockname()[1])
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # raised by the command (cli.main)
    http = fit_connections(options.http, open_files, report=first_worker(options.shard))
    options = dataclasses.replace(options, http=http)
    wiring = await wire(options)
    cachers = wiring.ctx.cachers
    shard = options.shard
    registry = process_registry()
    wiring.ctx.metrics = Metrics(registry, delivery_sample=options.serve.delivery_sample)
    admission = options.http.admission()
    for collector in _collectors(wiring, admission, shard):
        registry.register(collector)
    wiring.handler.routes["/metrics"] = _metrics_route(registry, wiring)
    cert = None
    if options.tls is not None:
        tls = options.tls
        http2 = options.http2 is not None
        cert = ServingCert(tls.cert_file, tls.key_file, tls.client_ca_file, wiring.requestheader_ca_file, http2=http2)
        wiring.housekeeping.append(cert.reload_if_changed)
        if cert.client_ca_file and wiring.ctx.gate is not None:
            # Beside a request-header CA, only the client CA's certificates are users.
            issuers = ca_subjects(cert.client_ca_file) if wiring.requestheader_ca_file else None
            wiring.ctx.gate.certs = CertAuthenticator(issuers)
    h2 = (
        create_h2_factory(
            wiring.handler,
            options.http,
            options.http2,
            admission,
            admit=wiring.handler.admit,
            prestart=wiring.handler.prestart,
        )
        if cert is not None and options.http2 is not None
        else None
    )
    try:
        if wiring.before_serving is not None:
            # A SIGTERM meanwhile ends the wait: the server starts and is stopped at once below.
            waiting = asyncio.ensure_future(wiring.before_serving())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait((waiting, stopping), return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            stopping.cancel()
        server = await start_server(
            wiring.handler,
            options.host,
            options.port,
            sock=listener,
            limits=options.http,
            ssl=cert.context if cert else None,
            admission=admission,
            h2=h2,
            admit=wiring.handler.admit,
            prestart=wiring.handler.prestart,
        )
    except BaseException:
        # Nothing will serve (the address is taken): stop what wire() started, so that the error
        # is the last word, not "Unclosed client session" from the upstream's sessions after it.
        for task in wiring.tasks:
            task.cancel()
        for cleanup in wiring.cleanup:
            with contextlib.suppress(Exception):
                await cleanup()
        raise
    port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    who = name if shard is None else f"{name} worker {shard.worker_id}"
    host = f"[{options.host}]" if ":" in options.host else options.host

    def details() -> str:
        objects = sum(len(c.cache) for c in list(cachers.values()))
        return f"({len(cachers)} resources, {objects} objects cached, {time.monotonic() - started:.2f}s)"

    readiness = ReadinessLog(who, f"{'https' if cert else 'http'}://{host}:{port}", wiring.handler, details)
    for listening in wiring.on_listening:
        listening()
    tasks = [
        *wiring.tasks,
        asyncio.ensure_future(_tick(cachers, wiring.ctx.more_cachers, wiring.housekeeping, stop)),
        asyncio.ensure_future(_log_readiness(readiness)),
    ]
    await stop.wait()
    log.info("%s shutting down", who)
    wiring.handler.shutting_down = True  # a request still arriving gets 429 + Retry-After, not a half-stopped process
    server.close()
    for task in tasks:
        task.cancel()
    # Every watcher that asked for bookmarks gets a last one at the newest rv, so its client
    # resumes from there (on another worker or replica) without relisting; then all end.
    for cacher in [*cachers.values(), *wiring.ctx.more_cachers()]:
        for watcher in list(cacher.dispatcher.watchers()):
            watcher.bookmark(cacher.rv, final=True)
            watcher.close(CloseReason.SHUTDOWN)
    wiring.ctx.end_waiting_watches()  # (not watchers yet: they end with no event)
    # In-flight reads (one may be waiting for a resourceVersion) finish with an answer,
    # and watch handlers flush and end their streams; bounded by the longest read wait.
    deadline = time.monotonic() + options.serve.fresh_wait + 1.0
    await asyncio.sleep(0.05)
    if h2 is not None:
        # After the watches' last frames went out (a client on the h2 library stops reading at a
        # GOAWAY): HTTP/2 clients open new streams elsewhere; the streams still open finish here.
        h2.goaway_all()
    while wiring.handler.inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for cacher in [*cachers.values(), *wiring.ctx.more_cachers()]:
        cacher.stop()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.wait_closed(), 2.0)
    for cleanup in wiring.cleanup:
        await cleanup()
    log.info("%s stopped", who)


def _collectors(wiring: Wiring, admission: Admission, shard: ShardOptions | None) -> list[Collector]:
    """Every component's metric families, read at scrape time (``watchcache.metrics`` lists where each lives)."""
    ctx = wiring.ctx
    collectors: list[Collector] = [
        CacherCollector(ctx.cachers, shard.owns if shard is not None else None),
        BackfillCollector(ctx.cachers),
        DeliveryCollector(ctx.flusher, ctx.watch_budget),
        ReflectorCollector(lambda: wiring.reflectors),
        FollowerCollector(wiring.following),
        HandlerCollector(wiring.handler, admission),
        AdmissionCollector(admission),
        FlowControlCollector(lambda: wiring.handler.flow_control),
    ]
    if ctx.gate is not None:
        collectors.append(GateCollector(ctx.gate))
    if ctx.upstream_failures is not None:
        collectors.append(UpstreamErrorsCollector(ctx.upstream_failures))
    if wiring.consistent is not None:
        collectors.append(ConsistencyCollector(wiring.consistent))
    if shard is not None:
        collectors.append(RestartsCollector(shard.layout.restarts_file, shard.worker_id))
    return collectors + wiring.collectors


def _metrics_route(registry: CollectorRegistry, wiring: Wiring) -> MetricsRoute:
    """/metrics: this process's metrics, or with workers every worker's, labelled by worker."""

    def own() -> bytes:
        return render(registry)

    if wiring.metrics_route is not None:
        return wiring.metrics_route(own)

    async def single() -> bytes:
        return own()

    return single


async def _tick(
    cachers: dict[ResourceType, Cacher],
    more_cachers: Callable[[], Iterable[Cacher]],
    housekeeping: list[Callable[[], object]],
    stop: asyncio.Event,
) -> None:
    # The supervisor's pid, not the parent now: a worker forked just before its supervisor died
    # would read init here, and never see it go.
    parent = int(os.environ.get(SUPERVISOR_PID) or os.getppid())
    while True:
        # As kube's cacher bookmark timer: a second, plus up to 25% jitter (wait.Jitter(1s, 0.25)).
        await asyncio.sleep(random.uniform(1.0, 1.25))
        for cacher in [*cachers.values(), *more_cachers()]:
            cacher.tick()
        for job in housekeeping:
            job()
        if os.getppid() != parent:  # the supervisor died: do not outlive it
            log.warning("parent process exited; shutting down")
            stop.set()


async def _log_readiness(readiness: ReadinessLog) -> None:
    """``ready`` (or why not) in the log as soon as ``/readyz`` would say it; then each change, once.

    The first time it is ready, the caches' initial objects are frozen out of the cyclic collector's
    full passes too, as the imports were (``serve``): they are acyclic, freed by their reference counts
    when replaced, and were most of what a full pass traversed. Once only: a freeze also keeps what is
    alive then from the collector, so that a cycle among those objects that dies later is never freed.
    """
    frozen = False
    while True:
        readiness.check()
        if readiness.said_ready and not frozen:
            frozen = True
            gc.freeze()
        await asyncio.sleep(1.0 if readiness.said_ready else 0.05)


def run(
    name: str,
    options: RunOptions,
    wire: Callable[[RunOptions], Awaitable[Wiring]],
    listener: socket.socket | None = None,
) -> None:
    """Run one mode until SIGTERM, on uvloop."""
    import uvloop

    uvloop.run(serve(name, options, wire, listener))
