"""The proxy in front of a real apiserver: a reflector per owned resource, pass-through for the rest."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence

import aiohttp

from watchcache.auth.authn import CertAuthenticator
from watchcache.auth.gate import Gate
from watchcache.backoff import Backoff
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.lifecycle import SECRETS, seconds
from watchcache.resources import BUILTIN_GROUPS, FLOWCONTROL, ResourceRegistry, ResourceType
from watchcache.server.app import ApiHandler
from watchcache.server.context import ApiContext
from watchcache.server.metrics import TunnelCollector
from watchcache.server.proxy import ProxyUpstream
from watchcache.server.tables import CRDS_ID
from watchcache.server.tunnel import Tunnels
from watchcache.service.crds import CustomResources
from watchcache.service.flowconfig import FlowConfigSource
from watchcache.service.lifecycle import Wiring, api_context, run
from watchcache.service.ondemand import OnDemandCaches, OnDemandCollector
from watchcache.service.options import RunOptions, cache_policy, first_worker, owns
from watchcache.service.shard import wire_shard
from watchcache.upstream.backfill import UpstreamBackfill
from watchcache.upstream.client import UpstreamClient, UpstreamError
from watchcache.upstream.consistency import ConsistentReads
from watchcache.upstream.discovery import (
    DEFAULT_RESOURCES,
    ResourceResolutionError,
    discover_all,
    parse_resource_id,
    report_skipped,
    resolve,
)
from watchcache.upstream.encodings import JsonFeeds
from watchcache.upstream.failures import LastFailures
from watchcache.upstream.identity import PassthroughIdentity
from watchcache.upstream.metrics import IdentityCollector, ProtobufCollector
from watchcache.upstream.protobuf import ProtobufCaches
from watchcache.upstream.reflector import Reflector

log = logging.getLogger("watchcache")


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
    client_ca = options.tls.client_ca_file if options.tls else None
    identity = PassthroughIdentity(options.identity, CertAuthenticator() if client_ca else None)
    identity.plain_http = options.tls is None
    # Said by one worker of a group: the same flags, the same finding.
    speaks = first_worker(options.shard)
    if speaks and options.tls is None and (options.upstream.is_tls or options.auth is not None):
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
    policy = cache_policy(options)
    ids = [i for i in with_printer_columns(_from_start(options)) if parse_resource_id(i) not in policy.excluded]
    if speaks:
        _say_policy(options)
    known = ResourceRegistry()
    provisional = [t for t in (known.by_id(i) for i in ids) if t is not None]
    registry = ResourceRegistry(tuple(provisional))
    backfill = UpstreamBackfill(client, options.backfill) if options.backfill.enabled else None

    def owned_cacher(t: ResourceType) -> Cacher:
        cacher = Cacher(t, options.cache)
        if backfill is not None:
            cacher.backfills = backfill.backfills(cacher)
        return cacher

    cachers = {t: owned_cacher(t) for t in provisional if owns(options.shard, t)}
    consistent = ConsistentReads(client, fresh_wait=options.serve.fresh_wait)
    tunnels = Tunnels(client, options.tunnels, identity)
    ctx = api_context(options, registry, cachers, ProxyUpstream(client, consistent, identity, tunnels))
    if options.auth is not None:
        ctx.gate = Gate.for_upstream(client, options.auth)
        log.info("authentication: delegated (TokenReview and SubjectAccessReview against the upstream)")
    elif speaks:
        log.warning(
            "AUTHENTICATION IS OFF (--authentication none): anyone who can reach %s:%d can read every cached "
            "object. Use it only for tests and demos, or behind a network policy that admits trusted clients only.",
            options.host,
            options.port,
        )
    protobuf = ProtobufCaches(
        client,
        options.cache,
        options.reflector,
        owns=lambda t: owns(options.shard, t),
        idle_timeout=options.reflector.encoding_idle,
        after_relist=consistent.advance,
        backfill=backfill,
    )
    ctx.protobuf = protobuf.serving
    feeds = JsonFeeds(protobuf.synced, idle=options.reflector.encoding_idle)
    ctx.discovered = False
    ctx.upstream_continue_tokens = True
    ctx.upstream_failures = LastFailures(options.upstream.server, client.tokens.describe)
    ctx.upstream_description = options.upstream.describe()
    wiring = Wiring(ctx, ApiHandler(ctx, forward_tables=True, forward_upgrades=True), [], [client.close], consistent)
    wiring.housekeeping.append(client.reload_certificates)
    wiring.housekeeping.append(protobuf.drop_idle)
    wiring.housekeeping.append(feeds.tick)
    wiring.ctx.more_cachers = protobuf.cachers
    wiring.collectors += [
        TunnelCollector(tunnels),
        IdentityCollector(identity),
        ProtobufCollector(protobuf, lambda: wiring.ctx.more_cachers()),
    ]
    tunnels.rejected = wiring.handler.rejected

    async def close_tunnels() -> None:
        tunnels.close_all()

    async def stop_proofs() -> None:
        consistent.stop()  # probe watches and their pumps
        protobuf.stop()  # the protobuf caches' reflectors

    wiring.cleanup.insert(0, close_tunnels)
    wiring.cleanup.insert(0, stop_proofs)

    # ---- on-demand caching (service/ondemand.py): the kinds a read starts, and --resources all's.
    def start_owned(t: ResourceType) -> tuple[Cacher, Callable[[], None]]:
        cacher = owned_cacher(t)
        reflector = Reflector(client, cacher, options.reflector, ctx.upstream_failures)
        reflector.after_relist = consistent.advance
        wiring.reflectors.append(reflector)
        # Suspended while only protobuf clients read the kind, as a configured kind's feed; its end
        # (a bug, or its kind gone) does not end the others'.
        feeds.add(reflector, optional=True)

        def stop() -> None:
            feeds.remove(cacher)
            if reflector in wiring.reflectors:
                wiring.reflectors.remove(reflector)

        return cacher, stop

    ondemand = OnDemandCaches(ctx, policy, start_owned, lambda t: owns(options.shard, t))
    ctx.on_demand = ondemand.cacher
    ctx.never_cached = lambda t: policy.refusal(t) is not None
    protobuf_serving = protobuf.serving

    async def protobuf_for(t: ResourceType) -> Cacher | None:
        """The protobuf cache of a kind on-demand caching allows (not refused, not over the budget)."""
        if policy.refusal(t) is not None or t in ondemand.too_big:
            return None
        return await protobuf_serving(t)

    ctx.protobuf = protobuf_for
    wiring.housekeeping.append(ondemand.housekeeping)
    if policy.on_demand or policy.all_kinds:
        wiring.housekeeping.append(CustomResources(ondemand).housekeeping)
    more = wiring.ctx.more_cachers
    wiring.ctx.more_cachers = lambda: [*more(), *ondemand.cachers()]
    wiring.handler.caching = ondemand.status
    wiring.collectors.append(OnDemandCollector(ondemand))

    def drop_protobuf(t: ResourceType) -> None:
        # The kind's protobuf cache goes with it (its bytes were the kind's too).
        entry = protobuf.caches.pop(t, None)
        if entry is not None:
            entry[1].cancel()
            entry[0].stop()

    ondemand.on_drop.append(drop_protobuf)

    async def stop_ondemand() -> None:
        ondemand.stop()

    wiring.cleanup.insert(0, stop_ondemand)
    # ---- end of on-demand caching.
    if options.shard is not None:
        await wire_shard(wiring, options, options.shard, protobuf, ondemand)
    wiring.tasks = [
        asyncio.ensure_future(
            _discover_and_reflect(
                client,
                consistent,
                ctx,
                options,
                ids,
                wiring.reflectors,
                wiring.housekeeping,
                owned_cacher,
                ondemand,
                feeds,
            )
        )
    ]
    if identity.mode == "front-proxy":
        wiring.tasks.append(asyncio.ensure_future(identity.learn_upstream_names(client)))
    if wiring.handler.flow_control is not None:  # API Priority and Fairness: the upstream's configuration
        kinds = {t.resource: t for t in FLOWCONTROL}

        def watch(plural: str, params: Mapping[str, str], on_lines: Callable[[list[bytes]], None]) -> Awaitable[None]:
            return client.watch_into(kinds[plural], params, on_lines, stall_timeout=options.reflector.stall_timeout)

        source = FlowConfigSource(wiring.handler.flow_control, client.get_json, watch)
        wiring.tasks.append(asyncio.ensure_future(source.run()))
    return wiring


async def _discover_and_reflect(
    client: UpstreamClient,
    consistent: ConsistentReads,
    ctx: ApiContext,
    options: RunOptions,
    ids: Sequence[str],
    running: list[Reflector],
    housekeeping: list[Callable[[], object]],
    owned_cacher: Callable[[ResourceType], Cacher],
    ondemand: OnDemandCaches,
    feeds: JsonFeeds,
) -> None:
    backoff = Backoff(0.5, 10.0)
    failures = ctx.upstream_failures
    assert failures is not None
    policy = ondemand.policy
    while True:
        try:
            resolved = await resolve(client, ids, strict=False)
            # Every list-watchable kind, for the reads that start caches (and --resources all).
            served = await discover_all(client) if policy.on_demand or policy.all_kinds else []
            break
        except (aiohttp.ClientError, OSError, TimeoutError, UpstreamError) as e:
            # Unreachable, refused, or overloaded (5xx/429): keep trying, loudly (with a hint), as
            # client-go would; with jitter, so that the workers of a group do not all ask again at once.
            delay = backoff.next()
            failures.failed(None, "discovery", e, delay)
            await asyncio.sleep(delay)
    failures.succeeded(None)
    if first_worker(options.shard):  # every worker resolves the same ids: one says what is skipped
        report_skipped(resolved.skipped, requested=bool(options.resources))
    types = resolved.types
    by_gvr = {(t.group, t.version, t.resource): t for t in types}
    for t in list(ctx.registry.types):
        confirmed = by_gvr.get((t.group, t.version, t.resource))
        if confirmed is None or confirmed.kind != t.kind or confirmed.namespaced != t.namespaced:
            ctx.cachers.pop(t, None)
            ctx.registry.remove(t)
    for t in types:
        if ctx.registry.get(t.group, t.version, t.resource) is None:
            ctx.registry.add(t)
        if owns(options.shard, t) and t not in ctx.cachers:
            ctx.cachers[t] = owned_cacher(t)
    for t in served:
        if ctx.registry.get(t.group, t.version, t.resource) is None:
            ctx.registry.add(t)
    owned = [c for t, c in ctx.cachers.items() if owns(options.shard, t)]
    ctx.discovered = True
    log.info("caching %s", ", ".join(c.resource.path_id() for c in owned))
    if policy.on_demand and first_worker(options.shard):
        later = [t for t in served if policy.started_by_read(t) and t not in ctx.cachers]
        log.info(
            "caching on demand (at a kind's first read; stopped after %s unread): %d more kinds the upstream serves",
            seconds(policy.idle),
            len(later),
        )
    ondemand.start_all(served)
    running.extend(Reflector(client, c, options.reflector, failures) for c in owned)
    for reflector in running:
        reflector.after_relist = consistent.advance

    def move_past_barriers() -> None:
        # While a relist's group rv is still the cache's head, a watch from the rv a LIST returns
        # would get 410 (see ResourceCache.relist): keep proving progress until the cache moves on.
        for t, cacher in list(ctx.cachers.items()):
            if not owns(options.shard, t):
                continue
            if cacher.cache.unresumable_rv == cacher.rv:
                consistent.advance(cacher)

    housekeeping.append(move_past_barriers)
    await feeds.run(running)  # suspended while only protobuf clients read a resource


def with_printer_columns(ids: Sequence[str]) -> Sequence[str]:
    """``ids``, and the CRDs if a custom resource is among them: kubectl's Tables of a custom resource
    are printed with its CRD's columns (``server/tables.py``), which the cache of CRDs follows."""
    custom = False
    for i in ids:
        try:
            custom |= parse_resource_id(i)[0] not in BUILTIN_GROUPS
        except ResourceResolutionError:
            continue  # reported where the ids are resolved
    if custom and CRDS_ID not in ids:
        log.info("caching %s too: the printer columns of the custom resources' Tables", CRDS_ID)
        return [*ids, CRDS_ID]
    return ids


def _from_start(options: RunOptions) -> Sequence[str]:
    """The ids cached from the start: ``--resources``, else the defaults (``--resources all``: the
    defaults too, which readiness waits for; the rest start at once, see ``CachePolicy``)."""
    if options.resources and options.resources != ("all",):
        return options.resources
    return DEFAULT_RESOURCES


def _say_policy(options: RunOptions) -> None:
    """At start, once per group: what is cached besides ``--resources``, and Secrets' fate."""
    policy = cache_policy(options)
    if policy.secrets_on_demand or SECRETS in policy.from_start or not (policy.on_demand or policy.all_kinds):
        return
    log.info(
        "secrets pass through, never cached: --authentication none would serve them to anyone who reaches "
        "the port (name them in --resources to cache them anyway)"
    )


def run_proxy(options: RunOptions, listener: socket.socket | None = None) -> None:
    run("watchcache serve", options, wire_proxy, listener)
