"""A worker's part in a process group: follow what others own, serve what it owns, share metrics.

Worker i of W reflects only the resources it owns (``shard.ownership``); the others are
followed from their owners on first use. Each worker listens on its own unix socket in
the shard directory: the follow streams of the caches it owns, and its metrics for the
others (a scrape of any worker covers all of them). Group readiness: a worker is ready
when every worker's owned caches have synced, since a request or a probe lands on any.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson

from watchcache.dispatch.cacher import Cacher
from watchcache.metrics import merge_workers
from watchcache.resources import ResourceType
from watchcache.server.context import ApiContext
from watchcache.service.lifecycle import MetricsRoute, Wiring
from watchcache.service.ondemand import OnDemandCaches
from watchcache.service.options import RunOptions, ShardOptions
from watchcache.shard.follower import Followers
from watchcache.shard.layout import READY, SYNCED
from watchcache.shard.owner import FollowServer, fetch_metrics, fetch_status
from watchcache.shard.ownership import owner_of
from watchcache.upstream.protobuf import ProtobufCaches

_JOIN_WAIT = 30.0  # seconds a restarted worker waits for its caches before it accepts

log = logging.getLogger("watchcache")


def protobuf_followers(socket_of: Callable[[ResourceType], str], me: int, options: RunOptions) -> Followers:
    """Followers of the owners' protobuf caches. As a JSON follower, each backfills from its owner
    (whose protobuf cache backfills from the upstream) and resumes a broken stream from its rv: a
    typed client resuming its watch on this worker after the proxy restarted gets the events since
    its rv, not 410 and a relist (tests/reference/test_restarts_control_plane.py)."""
    return Followers({}, socket_of, me, options.cache, backfill=options.backfill, protobuf=True)


async def wire_shard(
    wiring: Wiring,
    options: RunOptions,
    shard: ShardOptions,
    protobuf: ProtobufCaches | None = None,
    ondemand: OnDemandCaches | None = None,
) -> None:
    """Adds followers, this worker's sockets, group readiness and ``/debug/shards`` to ``wiring``.

    ``protobuf``: this worker's protobuf caches; the others' are followed as the JSON caches are.
    ``ondemand``: the caches reads start; a kind another worker owns is followed from it, which
    starts it there (one reflector per kind in the group, on its owner).
    """
    ctx = wiring.ctx

    def socket_of(t: ResourceType) -> str:
        return shard.layout.socket(owner_of(t.path_id(), shard.workers))

    followers = Followers(ctx.cachers, socket_of, shard.worker_id, options.cache, backfill=options.backfill)
    ctx.on_demand = lambda t: None if shard.owns(t) else followers.ensure(t)
    # Followers of the kinds reads start: kept aside until synced (their reads pass through until
    # then), published and dropped by ``ondemand``.
    od_followers = Followers({}, socket_of, shard.worker_id, options.cache, backfill=options.backfill)
    if ondemand is not None:
        ondemand.follow_from_start = followers.ensure
        ondemand.follow = lambda t: (od_followers.ensure(t), lambda: od_followers.drop(t))
        ctx.on_demand = ondemand.cacher
    follow, server = await _listen(ctx, shard, ondemand)
    if protobuf is not None:
        pb_followers = protobuf_followers(socket_of, shard.worker_id, options)
        protobuf.follow = pb_followers.ensure

        def owned_protobuf(resource_id: str) -> Cacher | None:
            t = ctx.registry.by_id(resource_id)
            return protobuf.ensure(t) if t is not None and shard.owns(t) else None

        follow.owned_protobuf = owned_protobuf
        wiring.housekeeping.append(pb_followers.drop_idle)
        wiring.ctx.more_cachers = lambda: [*protobuf.cachers(), *pb_followers.cachers.values()]

    async def shard_map() -> bytes:
        return _shard_map(ctx, shard, followers, od_followers)

    wiring.handler.routes["/debug/shards"] = shard_map
    handler = wiring.handler
    handler.worker, handler.workers = shard.worker_id, shard.workers
    handler.owns = shard.owns
    follow.status_json = lambda: orjson.dumps(handler.status())

    async def peer_statuses() -> list[dict[str, Any]]:
        peers = [w for w in range(shard.workers) if w != shard.worker_id]
        replies = await asyncio.gather(*(fetch_status(shard.layout.socket(w)) for w in peers), return_exceptions=True)
        return [orjson.loads(r) for r in replies if isinstance(r, bytes)]

    handler.peer_statuses = peer_statuses
    wiring.following = lambda: [f for fs in (followers, od_followers) for f, _ in fs.followers.values()]
    wiring.metrics_route = lambda own: _gathered_metrics(own, shard, follow)
    wiring.housekeeping.append(followers.drop_idle)
    synced = shard.layout.marker(shard.worker_id, SYNCED)
    synced.unlink(missing_ok=True)

    def mark_synced() -> None:
        owned = [c for t, c in ctx.cachers.items() if shard.owns(t)]
        # A worker may own nothing (more workers than resources): synced once discovery is done.
        if ctx.discovered and all(c.serving for c in owned) and not synced.exists():
            synced.write_text(str(os.getpid()))

    def workers_synced() -> tuple[bool, str]:
        missing = [w for w in range(shard.workers) if not shard.layout.marker(w, SYNCED).exists()]
        if missing:
            return False, f"[-]workers-synced failed: workers {missing} not synced"
        return True, f"[+]workers-synced ok ({shard.workers} workers)"

    async def announce_synced() -> None:
        # At once, not at the next tick (1-1.25 s): every worker's /readyz, and so the group's
        # readiness, waits for this file.
        while not synced.exists():
            mark_synced()
            await asyncio.sleep(0.01)

    announcing: list[asyncio.Future[None]] = []

    def on_listening() -> None:
        shard.layout.marker(shard.worker_id, READY).write_text(str(os.getpid()))
        announcing.append(asyncio.ensure_future(announce_synced()))

    async def owned_synced_if_restarted() -> None:
        # A worker (re)started while a peer is synced joins a group that serves: it accepts on the
        # shared socket only once its own caches are, so that a client it would take meanwhile (a
        # 429 "not synced yet" for a watch of what it owns) is served by a peer. A group starting
        # accepts at once (probes, and kube's answers while initialising), as does a worker whose
        # caches take longer than ``_JOIN_WAIT`` (an upstream down): its peers are no better off.
        peers = [w for w in range(shard.workers) if w != shard.worker_id]
        if not any(shard.layout.marker(w, SYNCED).exists() for w in peers):
            return
        started = time.monotonic()
        while time.monotonic() - started < _JOIN_WAIT:
            mark_synced()
            if synced.exists():
                log.info("worker %d: caches synced in %.2fs, accepting", shard.worker_id, time.monotonic() - started)
                return
            await asyncio.sleep(0.01)
        log.warning("worker %d: caches not synced after %gs; accepting anyway", shard.worker_id, _JOIN_WAIT)

    wiring.housekeeping.append(mark_synced)
    wiring.handler.readiness_checks.append(workers_synced)
    wiring.on_listening.append(on_listening)
    wiring.before_serving = owned_synced_if_restarted

    async def stop_shard() -> None:
        followers.stop()
        od_followers.stop()
        server.close()

    wiring.cleanup.insert(0, stop_shard)


async def _listen(
    ctx: ApiContext, shard: ShardOptions, ondemand: OnDemandCaches | None
) -> tuple[FollowServer, asyncio.AbstractServer]:
    """This worker's socket: the follow streams of the caches it owns (started if a read may start
    them: ``ondemand``), and its metrics."""
    path = shard.layout.socket(shard.worker_id)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # left by a predecessor that was killed
    owned = {t.path_id() for t in ctx.cachers}

    def lookup(resource_id: str) -> Cacher | None:
        t = ctx.registry.by_id(resource_id)
        if t is None or not shard.owns(t):
            return None
        cached = ctx.cachers.get(t)
        if cached is not None and cached.resume is not None:
            cached.resume()  # a follower will read it: its suspended JSON feed starts again (upstream/encodings.py)
        return cached if cached is not None or ondemand is None else ondemand.owned(t)

    follow = FollowServer(lookup)
    server = await asyncio.get_running_loop().create_unix_server(follow.protocol, path)
    log.info("worker %d of %d owns %s", shard.worker_id, shard.workers, ", ".join(sorted(owned)) or "nothing yet")
    return follow, server


def _shard_map(ctx: ApiContext, shard: ShardOptions, followers: Followers, more: Followers) -> bytes:
    return orjson.dumps(
        {
            "worker": shard.worker_id,
            "workers": shard.workers,
            "pid": os.getpid(),
            "owners": {t.path_id(): owner_of(t.path_id(), shard.workers) for t in ctx.registry.types},
            "owned": sorted(t.path_id() for t in ctx.cachers if shard.owns(t)),
            "following": sorted(t.path_id() for t in [*followers.followers, *more.followers]),
        }
    )


def _gathered_metrics(own: Callable[[], bytes], shard: ShardOptions, follow: FollowServer) -> MetricsRoute:
    """/metrics on a worker: its own samples and every other worker's, labelled by worker."""
    follow.metrics_text = own

    async def gathered() -> bytes:
        texts = [(shard.worker_id, own())]
        peers = [w for w in range(shard.workers) if w != shard.worker_id]
        replies = await asyncio.gather(*(fetch_metrics(shard.layout.socket(w)) for w in peers), return_exceptions=True)
        texts += [(w, r) for w, r in zip(peers, replies, strict=True) if isinstance(r, bytes)]
        return merge_workers(texts)

    return gathered
