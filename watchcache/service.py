"""Process assembly for ``watchcache sim`` and ``watchcache serve``: wire, listen, run, stop.

Both log one line containing ``ready`` once they accept requests, and stop cleanly on
SIGTERM/SIGINT: stop listening, end every watch (flushing what is pending), exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from watchcache.cache.continuetoken import ContinueCodec
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import ResourceRegistry
from watchcache.server.app import ApiHandler
from watchcache.server.context import ApiContext, ServeConfig, Upstream
from watchcache.server.http import start_server
from watchcache.sim.churn import Churn, populate
from watchcache.sim.cluster import SimCluster
from watchcache.upstream.embedded import EmbeddedUpstream, SimUpstream
from watchcache.watchers.flush import FlushScheduler
from watchcache.watchers.watcher import CloseReason

log = logging.getLogger("watchcache")


@dataclass(frozen=True)
class SimOptions:
    objects: int = 0
    namespaces: int = 1
    nodes: int = 10
    churn: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class RunOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    serve: ServeConfig = field(default_factory=ServeConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    sim: SimOptions = field(default_factory=SimOptions)
    resources: tuple[str, ...] = ()
    continue_key: bytes = b""


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen wants HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def continue_key(configured: bytes) -> bytes:
    # A random key per process is right for one process; replicas must share a configured key.
    return configured or os.urandom(32)


async def _serve(
    name: str,
    options: RunOptions,
    cluster: SimCluster,
    make: Callable[[SimCluster], tuple[dict, Upstream]],
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    started = time.monotonic()
    populate(
        cluster,
        objects=options.sim.objects,
        namespaces=options.sim.namespaces,
        nodes=options.sim.nodes,
        seed=options.sim.seed,
    )
    cachers, upstream = make(cluster)
    ctx = ApiContext(
        registry=cluster.registry if not options.resources else cluster.registry.select(list(options.resources)),
        cachers=cachers,
        upstream=upstream,
        codec=ContinueCodec(continue_key(options.continue_key)),
        flusher=FlushScheduler(loop),
        config=options.serve,
    )
    handler = ApiHandler(ctx)
    server = await start_server(handler, options.host, options.port)
    port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    objects = sum(len(c.cache) for c in cachers.values())
    log.info(
        "%s ready: listening on http://%s:%d (%d objects, rv %d, %.2fs)",
        name,
        options.host,
        port,
        objects,
        cluster.rv,
        time.monotonic() - started,
    )
    tasks = [asyncio.ensure_future(_tick(cachers))]
    if options.sim.churn > 0:
        tasks.append(asyncio.ensure_future(Churn(cluster, options.sim.churn, seed=options.sim.seed).run()))
    await stop.wait()
    log.info("%s shutting down", name)
    server.close()
    for task in tasks:
        task.cancel()
    for cacher in cachers.values():
        for watcher in list(cacher.dispatcher.watchers()):
            watcher.close(CloseReason.SHUTDOWN)
        cacher.stop()
    # Let watch handlers flush and end their streams.
    await asyncio.sleep(0.1)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.wait_closed(), 2.0)
    log.info("%s stopped", name)


async def _tick(cachers: dict) -> None:
    while True:
        await asyncio.sleep(1.0)
        for cacher in cachers.values():
            cacher.tick()


def run_sim(options: RunOptions) -> None:
    """The simulated cluster: its storage is the cache the read path serves from."""

    def make(cluster: SimCluster) -> tuple[dict, Upstream]:
        return cluster.cachers, SimUpstream(cluster)

    _run("watchcache sim", options, make)


def run_serve(options: RunOptions) -> None:
    """The proxy, fed in-process by an embedded simulated cluster (see ``upstream.embedded``)."""

    def make(cluster: SimCluster) -> tuple[dict, Upstream]:
        registry = cluster.registry if not options.resources else cluster.registry.select(list(options.resources))
        cachers = {t: Cacher(t, options.cache) for t in registry.types}
        return cachers, EmbeddedUpstream(cluster, cachers)

    _run("watchcache serve", options, make)


def _run(name: str, options: RunOptions, make: Callable[[SimCluster], tuple[dict, Upstream]]) -> None:
    import uvloop

    async def main() -> None:
        cluster = SimCluster(ResourceRegistry(), options.cache if name.endswith("sim") else CacheConfig())
        await _serve(name, options, cluster, make)

    uvloop.run(main())
