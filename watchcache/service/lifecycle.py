"""Process assembly for ``watchcache sim`` and ``watchcache serve``: wire, listen, run, stop.

Both log one line containing ``ready`` once they accept requests, and stop cleanly on
SIGTERM/SIGINT: stop listening, end every watch (flushing what is pending), exit 0.
``serve`` has two upstreams: a real apiserver (reflectors, pass-through, consistent-read
proofs) or, when none is configured, a simulated cluster embedded in the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import orjson
from prometheus_client.registry import Collector

from watchcache.auth import AuthOptions, Gate
from watchcache.auth.authn import CertAuthenticator
from watchcache.auth.requestheader import RequestHeaderAuthenticator, RequestHeaderNames, ca_subjects
from watchcache.cache.continuetoken import ContinueCodec
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.http.protocol import HttpLimits, Request, start_server
from watchcache.http.tls import ServingCert
from watchcache.metrics import CacheCollector, Metrics, merge_workers, render
from watchcache.resources import ResourceRegistry, ResourceType
from watchcache.server.app import ApiHandler
from watchcache.server.context import ApiContext, ServeConfig, Upstream
from watchcache.server.proxy import ProxyUpstream
from watchcache.server.tunnel import TunnelCollector, TunnelLimits, Tunnels
from watchcache.shard.follow_pb2 import MetricsRequest
from watchcache.shard.follow_pb2_grpc import OwnerStub, add_OwnerServicer_to_server
from watchcache.shard.follower import Followers
from watchcache.shard.owner import FollowServer, OwnerService
from watchcache.shard.ownership import owner_of
from watchcache.sim.auth import LocalReviewClient
from watchcache.sim.churn import Churn, populate
from watchcache.sim.cluster import SimCluster
from watchcache.sim.embedded import EmbeddedUpstream, SimUpstream
from watchcache.sim.faults import FaultInjector
from watchcache.sim.impersonation import impersonate
from watchcache.sim.policy import load_policy
from watchcache.upstream.client import UpstreamClient, UpstreamError
from watchcache.upstream.config import UpstreamConfig
from watchcache.upstream.consistency import ConsistentReads
from watchcache.upstream.discovery import DEFAULT_RESOURCES, resolve
from watchcache.upstream.identity import IdentityOptions, PassthroughIdentity
from watchcache.upstream.reflector import Reflector, ReflectorConfig
from watchcache.watchers.flush import FlushScheduler
from watchcache.watchers.watcher import CloseReason

log = logging.getLogger("watchcache")

# The gRPC channel to another worker (its metrics): a large exposition must not hit gRPC's
# default 4 MB receive limit; this is a unix socket between our own workers.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1)]


@dataclass(frozen=True)
class SimOptions:
    objects: int = 0
    namespaces: int = 1
    nodes: int = 10
    churn: float = 0.0
    seed: int = 0
    state_file: str | None = None
    # Users, tokens and RBAC-like rules: the sim then answers TokenReview/SubjectAccessReview and
    # enforces the policy on its own API, as an apiserver does.
    policy_file: str | None = None
    # Believe X-Remote-* headers over a client certificate from this CA (with one of these CNs,
    # if any), as an apiserver's --requestheader-client-ca-file / --requestheader-allowed-names.
    requestheader_ca_file: str | None = None
    requestheader_allowed_names: tuple[str, ...] = ()
    # With a policy: requests without credentials are anonymous (else 401), as kube's --anonymous-auth.
    anonymous: bool = True


@dataclass(frozen=True)
class ShardOptions:
    """This process is worker ``worker_id`` of ``workers`` (set by the supervisor)."""

    worker_id: int
    workers: int
    shard_dir: str

    def socket_path(self, worker: int) -> str:
        """The worker's gRPC socket (its metrics for the others)."""
        return os.path.join(self.shard_dir, f"w{worker}.sock")

    def follow_socket_path(self, worker: int) -> str:
        """The worker's follow socket (its caches' replication streams)."""
        return os.path.join(self.shard_dir, f"w{worker}.follow.sock")


@dataclass(frozen=True)
class RunOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    serve: ServeConfig = field(default_factory=ServeConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    sim: SimOptions = field(default_factory=SimOptions)
    resources: tuple[str, ...] = ()
    continue_key: bytes = b""
    upstream: UpstreamConfig | None = None
    reflector: ReflectorConfig = field(default_factory=ReflectorConfig)
    shard: ShardOptions | None = None
    # Delegated authn/authz of cached reads (None: anyone who reaches the port may read the cache).
    auth: AuthOptions | None = None
    http: HttpLimits = field(default_factory=HttpLimits)
    # (certificate file, key file, client CA file or None): serve HTTPS.
    tls: tuple[str, str, str | None] | None = None
    # How pass-through requests of client-certificate users reach the upstream (None: refused).
    identity: IdentityOptions | None = None
    # Connection upgrades passed through to the upstream (exec, attach, port-forward).
    tunnels: TunnelLimits = field(default_factory=TunnelLimits)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen wants HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


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
    followers: Followers | None = None
    owner_service: OwnerService | None = None
    # Trusted by the TLS listener besides --client-ca-file: the sim's request-header CA.
    requestheader_ca_file: str | None = None
    # More metric collectors of this mode's components (e.g. the tunnels').
    collectors: list[Collector] = field(default_factory=list)


def _context(
    options: RunOptions, registry: ResourceRegistry, cachers: dict[ResourceType, Cacher], upstream: Upstream
) -> ApiContext:
    # A random key is right for one process; replicas must share a configured one.
    key = options.continue_key or os.urandom(32)
    return ApiContext(
        registry=registry,
        cachers=cachers,
        upstream=upstream,
        codec=ContinueCodec(key),
        flusher=FlushScheduler(asyncio.get_running_loop(), options.serve.watch_flush_interval),
        config=options.serve,
    )


def _sim_cluster(options: RunOptions) -> SimCluster:
    cluster = SimCluster(ResourceRegistry(), options.cache, state_file=options.sim.state_file)
    if not cluster.restored:  # a restart from the journal already has its objects
        sim = options.sim
        populate(cluster, objects=sim.objects, namespaces=sim.namespaces, nodes=sim.nodes, seed=sim.seed)
    return cluster


def _churn_task(cluster: SimCluster, options: RunOptions) -> list[asyncio.Future[None]]:
    if options.sim.churn <= 0:
        return []
    return [asyncio.ensure_future(Churn(cluster, options.sim.churn, seed=options.sim.seed).run())]


async def wire_sim(options: RunOptions) -> Wiring:
    """The simulated cluster: its storage is the cache the read path serves from."""
    cluster = _sim_cluster(options)
    upstream = SimUpstream(cluster)
    ctx = _context(options, cluster.registry, cluster.cachers, upstream)
    upstream.faults = faults = FaultInjector(ctx.flusher)
    if options.sim.policy_file:
        upstream.policy = load_policy(options.sim.policy_file)
        auth = AuthOptions(anonymous=options.sim.anonymous)
        ctx.gate = upstream.gate = Gate.build(LocalReviewClient(upstream.policy), auth)
        ctx.gate.impersonate = impersonate
        log.info("policy %s: requests are authenticated and authorized", options.sim.policy_file)
    requestheader_ca = options.sim.requestheader_ca_file
    if requestheader_ca:
        if ctx.gate is None or not options.tls:
            raise ValueError("--requestheader-client-ca-file needs --policy-file and --tls-cert-file")
        issuers = ca_subjects(requestheader_ca)
        client_ca = options.tls[2]
        if client_ca and any(s in issuers for s in ca_subjects(client_ca)):
            raise ValueError("--requestheader-client-ca-file and --client-ca-file must be CAs with different subjects")
        names = RequestHeaderNames()
        ctx.gate.requestheader = RequestHeaderAuthenticator(issuers, options.sim.requestheader_allowed_names, names)
        log.info("front-proxy authentication: %s from CA %s", ", ".join(names.username), requestheader_ca)
    handler = ApiHandler(ctx)

    def inject(request: Request) -> None:
        error = faults.error_for(request)
        if error is not None:
            raise error

    handler.admission.append(inject)

    async def close() -> None:
        cluster.close()

    wiring = Wiring(ctx, handler, _churn_task(cluster, options), [close], requestheader_ca_file=requestheader_ca)
    wiring.housekeeping.append(faults.tick)
    return wiring


async def wire_embedded(options: RunOptions) -> Wiring:
    """The proxy fed in-process by an embedded simulated cluster (see ``upstream.embedded``)."""
    cluster = _sim_cluster(options)
    registry = cluster.registry.select(list(options.resources)) if options.resources else cluster.registry
    cachers = {t: Cacher(t, options.cache) for t in registry.types}
    upstream = EmbeddedUpstream(cluster, cachers)
    ctx = _context(options, registry, cachers, upstream)
    if options.sim.policy_file:
        upstream.policy = load_policy(options.sim.policy_file)
        upstream.gate = Gate.build(LocalReviewClient(upstream.policy), AuthOptions())
        if options.auth is not None:
            ctx.gate = Gate.build(LocalReviewClient(upstream.policy), options.auth)
    return Wiring(ctx, ApiHandler(ctx), _churn_task(cluster, options))


async def wire_proxy(options: RunOptions) -> Wiring:
    """The proxy in front of a real apiserver: a reflector per resource, pass-through for the rest.

    It listens at once. Cached resources the built-in table knows are registered before
    discovery answers, so their reads get 429 (not a pass-through) until synced;
    discovery then confirms each (or drops it) and adds the others. As worker i of W, it
    reflects only the resources it owns and follows the others from their owners.
    """
    assert options.upstream is not None
    client = UpstreamClient(options.upstream, options.identity)
    await client.start()
    log.info("upstream %s", options.upstream.describe())
    client_ca = options.tls[2] if options.tls else None
    identity = PassthroughIdentity(options.identity, CertAuthenticator() if client_ca else None)
    identity.plain_http = options.tls is None
    if options.tls is None and (options.upstream.is_tls or options.auth is not None):
        log.warning(
            "SERVING PLAIN HTTP in front of %s, which needs credentials: kubectl and client-go (kubeconfig) send no "
            "bearer token or client certificate to an http:// server, so writes, discovery and every other request "
            "that passes through reach the upstream anonymously and fail (401), and a token a client does send "
            "crosses the network in clear. Serve TLS (--tls-cert-file, --tls-private-key-file) and point clients "
            "at https://",
            options.upstream.server,
        )
    if client_ca:
        log.info("client-certificate users' pass-through requests: %s", identity.mode)
    ids = options.resources or DEFAULT_RESOURCES
    shard = options.shard
    known = ResourceRegistry()
    provisional = [t for t in (known.by_id(i) for i in ids) if t is not None]
    registry = ResourceRegistry(tuple(provisional))
    cachers = {t: Cacher(t, options.cache) for t in provisional if _owns(shard, t)}
    consistent = ConsistentReads(client, fresh_wait=options.serve.fresh_wait)
    tunnels = Tunnels(client, options.tunnels, identity)
    ctx = _context(options, registry, cachers, ProxyUpstream(client, consistent, identity, tunnels))
    if options.auth is not None:
        ctx.gate = Gate.for_upstream(client, options.auth)
        log.info("authentication: delegated (TokenReview and SubjectAccessReview against the upstream)")
    else:
        log.warning(
            "AUTHENTICATION IS OFF (--authentication none): anyone who can reach %s:%d can read every cached "
            "object. Use it only for tests and demos, or behind a network policy that admits trusted clients only.",
            options.host,
            options.port,
        )
    ctx.discovered = False
    wiring = Wiring(ctx, ApiHandler(ctx, forward_tables=True, forward_upgrades=True), [], [client.close], consistent)
    wiring.housekeeping.append(client.reload_certificates)
    wiring.collectors.append(TunnelCollector(tunnels))
    tunnels.rejected = wiring.handler.rejected

    async def close_tunnels() -> None:
        tunnels.close_all()

    wiring.cleanup.insert(0, close_tunnels)
    if shard is not None:
        followers = Followers(
            ctx.cachers,
            lambda t: shard.follow_socket_path(owner_of(t.path_id(), shard.workers)),
            shard.worker_id,
            options.cache,
        )
        ctx.on_demand = lambda t: None if _owns(shard, t) else followers.ensure(t)
        grpc_server, wiring.owner_service, follow_server = await _start_owner_service(ctx, shard)

        async def shard_map() -> bytes:
            return _shard_map(ctx, shard, followers)

        wiring.handler.routes["/debug/shards"] = shard_map
        wiring.followers = followers
        wiring.housekeeping.append(followers.drop_idle)
        # Group readiness: a worker is ready when every worker's owned caches have synced, since
        # a request (or a readiness probe) lands on any of them.
        synced = Path(shard.shard_dir, f"w{shard.worker_id}.synced")
        synced.unlink(missing_ok=True)

        def mark_synced() -> None:
            owned = [c for t, c in ctx.cachers.items() if _owns(shard, t)]
            # A worker may own nothing (more workers than resources): synced once discovery is done.
            if ctx.discovered and all(c.ready for c in owned) and not synced.exists():
                synced.write_text(str(os.getpid()))

        def workers_synced() -> tuple[bool, str]:
            missing = [w for w in range(shard.workers) if not Path(shard.shard_dir, f"w{w}.synced").exists()]
            if missing:
                return False, f"[-]workers-synced failed: workers {missing} not synced"
            return True, f"[+]workers-synced ok ({shard.workers} workers)"

        wiring.housekeeping.append(mark_synced)
        wiring.handler.readiness_checks.append(workers_synced)

        async def stop_shard() -> None:
            followers.stop()
            follow_server.close()
            await grpc_server.stop(1.0)

        wiring.cleanup.insert(0, stop_shard)
    wiring.tasks = [
        asyncio.ensure_future(
            _discover_and_reflect(client, consistent, ctx, options, ids, wiring.reflectors, wiring.housekeeping)
        )
    ]
    if identity.mode == "front-proxy":
        wiring.tasks.append(asyncio.ensure_future(identity.learn_upstream_names(client)))
    return wiring


def _owns(shard: ShardOptions | None, resource: ResourceType) -> bool:
    return shard is None or owner_of(resource.path_id(), shard.workers) == shard.worker_id


async def _start_owner_service(
    ctx: ApiContext, shard: ShardOptions
) -> tuple[grpc.aio.Server, OwnerService, asyncio.AbstractServer]:
    """This worker's two sockets: the follow stream of the caches it owns, and gRPC for its metrics."""
    path, follow_path = shard.socket_path(shard.worker_id), shard.follow_socket_path(shard.worker_id)
    for stale in (path, follow_path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)  # left by a predecessor that was killed
    owned = {t.path_id() for t in ctx.cachers}

    def lookup(resource_id: str) -> Cacher | None:
        t = ctx.registry.by_id(resource_id)
        return ctx.cachers.get(t) if t is not None and _owns(shard, t) else None

    follow = FollowServer(lookup)
    follow_server = await asyncio.get_running_loop().create_unix_server(follow.protocol, follow_path)
    server = grpc.aio.server()
    service = OwnerService()
    add_OwnerServicer_to_server(service, server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    log.info("worker %d of %d owns %s", shard.worker_id, shard.workers, ", ".join(sorted(owned)) or "nothing yet")
    return server, service, follow_server


def _shard_map(ctx: ApiContext, shard: ShardOptions, followers: Followers) -> bytes:
    return orjson.dumps(
        {
            "worker": shard.worker_id,
            "workers": shard.workers,
            "pid": os.getpid(),
            "owners": {t.path_id(): owner_of(t.path_id(), shard.workers) for t in ctx.registry.types},
            "owned": sorted(t.path_id() for t in ctx.cachers if _owns(shard, t)),
            "following": sorted(t.path_id() for t in followers.followers),
        }
    )


async def _discover_and_reflect(
    client: UpstreamClient,
    consistent: ConsistentReads,
    ctx: ApiContext,
    options: RunOptions,
    ids: Sequence[str],
    running: list[Reflector],
    housekeeping: list[Callable[[], object]],
) -> None:
    delay = 0.5
    while True:
        try:
            types = await resolve(client, ids, strict=False)
            break
        except (aiohttp.ClientError, OSError, TimeoutError, UpstreamError) as e:
            # Unreachable, or overloaded (5xx/429): keep trying, loudly, as client-go would.
            log.warning("upstream discovery failed (%s); retrying in %.0fs", e, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
    resolved = {(t.group, t.version, t.resource): t for t in types}
    for t in list(ctx.registry.types):
        confirmed = resolved.get((t.group, t.version, t.resource))
        if confirmed is None or confirmed.kind != t.kind or confirmed.namespaced != t.namespaced:
            ctx.cachers.pop(t, None)
            ctx.registry.remove(t)
    for t in types:
        if ctx.registry.get(t.group, t.version, t.resource) is None:
            ctx.registry.add(t)
        if _owns(options.shard, t) and t not in ctx.cachers:
            ctx.cachers[t] = Cacher(t, options.cache)
    owned = [c for t, c in ctx.cachers.items() if _owns(options.shard, t)]
    ctx.discovered = True
    log.info("caching %s", ", ".join(c.resource.path_id() for c in owned))
    running.extend(Reflector(client, c, options.reflector) for c in owned)
    for reflector in running:
        reflector.after_relist = consistent.advance

    def move_past_barriers() -> None:
        # While a relist's group rv is still the cache's head, a watch from the rv a LIST returns
        # would get 410 (see ResourceCache.relist): keep proving progress until the cache moves on.
        for cacher in owned:
            if cacher.cache.unresumable_rv == cacher.rv:
                consistent.advance(cacher)

    housekeeping.append(move_past_barriers)
    reflectors = [asyncio.ensure_future(r.run()) for r in running]
    try:
        await asyncio.gather(*reflectors)
    finally:
        for r in reflectors:
            r.cancel()


async def _serve(name: str, options: RunOptions, wire: Callable[[RunOptions], Awaitable[Wiring]]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    wiring = await wire(options)
    cachers = wiring.ctx.cachers
    shard = options.shard
    metrics = Metrics(delivery_sample=options.serve.delivery_sample)
    wiring.ctx.metrics = metrics
    metrics.registry.register(
        CacheCollector(
            cachers,
            wiring.handler.passed_through,
            consistent=wiring.consistent,
            reflectors=lambda: wiring.reflectors,
            followers=lambda: [f for f, _ in wiring.followers.followers.values()] if wiring.followers else [],
            restarts_file=Path(shard.shard_dir, "restarts.json") if shard else None,
            rejected=wiring.handler.rejected,
            auth=wiring.ctx.gate,
            identity=getattr(wiring.ctx.upstream, "identity", None),
        )
    )
    for collector in wiring.collectors:
        metrics.registry.register(collector)
    wiring.handler.routes["/metrics"] = _metrics_route(metrics, shard, wiring)
    cert = ServingCert(*options.tls, requestheader_ca_file=wiring.requestheader_ca_file) if options.tls else None
    if cert is not None:
        wiring.housekeeping.append(cert.reload_if_changed)
        if cert.client_ca_file and wiring.ctx.gate is not None:
            # Beside a request-header CA, only the client CA's certificates are users.
            issuers = ca_subjects(cert.client_ca_file) if wiring.requestheader_ca_file else None
            wiring.ctx.gate.certs = CertAuthenticator(issuers)
    server = await start_server(
        wiring.handler,
        options.host,
        options.port,
        reuse_port=shard is not None,
        limits=options.http,
        ssl=cert.context if cert else None,
    )
    port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    who = name if shard is None else f"{name} worker {shard.worker_id}"
    log.info(
        "%s ready: listening on %s://%s:%d (%d resources, %d objects cached, %.2fs)",
        who,
        "https" if cert else "http",
        options.host,
        port,
        len(cachers),
        sum(len(c.cache) for c in cachers.values()),
        time.monotonic() - started,
    )
    if shard is not None:
        Path(shard.shard_dir, f"w{shard.worker_id}.ready").write_text(str(os.getpid()))
    tasks = [*wiring.tasks, asyncio.ensure_future(_tick(cachers, wiring.housekeeping, stop))]
    await stop.wait()
    log.info("%s shutting down", who)
    server.close()
    for task in tasks:
        task.cancel()
    # Every watcher that asked for bookmarks gets a last one at the newest rv, so its client
    # resumes from there (on another worker or replica) without relisting; then all end.
    for cacher in list(cachers.values()):
        for watcher in list(cacher.dispatcher.watchers()):
            watcher.bookmark(cacher.rv, final=True)
            watcher.close(CloseReason.SHUTDOWN)
    # In-flight reads (one may be waiting for a resourceVersion) finish with an answer,
    # and watch handlers flush and end their streams; bounded by the longest read wait.
    deadline = time.monotonic() + options.serve.fresh_wait + 1.0
    await asyncio.sleep(0.05)
    while wiring.handler.inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for cacher in list(cachers.values()):
        cacher.stop()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.wait_closed(), 2.0)
    for cleanup in wiring.cleanup:
        await cleanup()
    log.info("%s stopped", who)


def _metrics_route(metrics: Metrics, shard: ShardOptions | None, wiring: Wiring) -> Callable[[], Awaitable[bytes]]:
    """/metrics: this process's metrics, or with workers every worker's, labelled by worker."""

    def own() -> bytes:
        return render(metrics.registry)

    if wiring.owner_service is not None:
        wiring.owner_service.metrics_text = own
    if shard is None:

        async def single() -> bytes:
            return own()

        return single

    async def gathered() -> bytes:
        texts = [(shard.worker_id, own())]
        peers = [w for w in range(shard.workers) if w != shard.worker_id]
        replies = await asyncio.gather(*(_peer_metrics(shard.socket_path(w)) for w in peers), return_exceptions=True)
        texts += [(w, r) for w, r in zip(peers, replies, strict=True) if isinstance(r, bytes)]
        return merge_workers(texts)

    return gathered


async def _peer_metrics(socket_path: str) -> bytes:
    async with grpc.aio.insecure_channel(f"unix:{socket_path}", options=CHANNEL_OPTIONS) as channel:
        reply = await OwnerStub(channel).Metrics(MetricsRequest(), timeout=2.0)
        return bytes(reply.text)


async def _tick(
    cachers: dict[ResourceType, Cacher], housekeeping: list[Callable[[], object]], stop: asyncio.Event
) -> None:
    parent = os.getppid()
    while True:
        await asyncio.sleep(1.0)
        for cacher in list(cachers.values()):
            cacher.tick()
        for job in housekeeping:
            job()
        if os.getppid() != parent:  # the supervisor died: do not outlive it
            log.warning("parent process exited; shutting down")
            stop.set()


def run(options: RunOptions, mode: str) -> None:
    import uvloop

    wire, name = {
        "sim": (wire_sim, "watchcache sim"),
        "embedded": (wire_embedded, "watchcache serve"),
        "proxy": (wire_proxy, "watchcache serve"),
    }[mode]
    uvloop.run(_serve(name, options, wire))
