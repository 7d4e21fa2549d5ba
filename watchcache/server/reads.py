"""GET and LIST from the cache: choose the rv per the tables, wait if needed, write cached bytes.

Response bodies are never built as Python objects: a LIST is its envelope plus each
item's cached bytes, handed to the transport as a list of buffers (``writelines``).
"""

from __future__ import annotations

from collections.abc import Sequence

from watchcache import apierrors
from watchcache.cache.continuetoken import UnverifiedContinueToken
from watchcache.cache.encoding import FULL_JSON, Encoding
from watchcache.cache.listing import ListScope, list_page
from watchcache.cache.object import object_key
from watchcache.cache.predicate import SelectionPredicate, UnsupportedField
from watchcache.cache.semantics import ListOptions, Mode, ReadPlan, plan_get, plan_list
from watchcache.cache.store import ResourceVersionTooNew, ResourceVersionTooOld, Snapshot
from watchcache.dispatch import freshness
from watchcache.dispatch.backfill import BackfillFailed, reach_back
from watchcache.dispatch.cacher import Cacher
from watchcache.http.response import Response
from watchcache.http.routing import RequestInfo
from watchcache.selectors import SelectorError
from watchcache.selectors.shards import ShardSelectorError
from watchcache.server.context import ApiContext, ListBodies, PassThrough
from watchcache.server.negotiation import PassReason
from watchcache.server.seats import waiting

CONTINUE_TOO_OLD = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list."
)


async def ensure_ready(ctx: ApiContext, cacher: Cacher) -> None:
    """Until a cache has synced, its reads get 429 with Retry-After (as kube while initialising)."""
    wait = ctx.config.ready_wait if cacher.ready_wait is None else cacher.ready_wait
    if cacher.ready or await cacher.wait_ready(wait):
        return
    raise apierrors.too_many_requests(
        f"storage is (re)initializing: the cache of {cacher.resource.qualified} is not synced yet", 1
    )


async def wait_fresh(
    ctx: ApiContext, cacher: Cacher, plan: ReadPlan, namespace: str | None, *, get: bool = False
) -> None:
    """Block (at most ``--fresh-wait``) until the cache can serve ``plan`` (``freshness``).

    "Most Recent": a GET goes to the upstream, as kube sends it to etcd; a LIST waits for its
    scope's proof (``freshness.reach_scope``) and passes through without one. A requested rv
    the cache does not reach in time is 504 "Too large resource version".
    """
    if plan.mode is Mode.MOST_RECENT:
        if get and ctx.upstream.delegates_consistent_gets:
            raise PassThrough(PassReason.CONSISTENT_GET)
        if not await reach_consistent(ctx, cacher, namespace):
            raise PassThrough(PassReason.CONSISTENT_READ)
        return
    if plan.mode in (Mode.NOT_OLDER_THAN, Mode.EXACT, Mode.CONTINUE) and not await reach_rv(ctx, cacher, plan.rv):
        raise apierrors.too_large_resource_version(plan.rv, cacher.rv)


async def reach_consistent(ctx: ApiContext, cacher: Cacher, namespace: str | None) -> bool:
    """``freshness.reach_scope`` with this server's ``--fresh-wait``, observed in the metrics; no seat held."""
    with waiting():
        wait = await freshness.reach_scope(cacher, namespace or None, ctx.upstream, ctx.config.fresh_wait)
    if ctx.metrics is not None:
        ctx.metrics.waited(cacher.resource, wait, consistent=True)
    return wait.reached


async def reach_rv(ctx: ApiContext, cacher: Cacher, target: int) -> bool:
    """``freshness.reach`` of a requested rv with this server's ``--fresh-wait``, in the metrics; no seat held."""
    if cacher.rv >= target:
        return True
    with waiting():
        wait = await freshness.reach(cacher, target, ctx.upstream, ctx.config.fresh_wait)
    if ctx.metrics is not None:
        ctx.metrics.waited(cacher.resource, wait, consistent=False)
    return wait.reached


async def backfill_for(cacher: Cacher, plan: ReadPlan) -> BackfillFailed | None:
    """An exact read (Exact, a continue token) older than the window: bring the window back first.

    Call after ``wait_fresh`` (which cannot lower the window's start), right before ``snapshot_for``.
    Returns why the window could not reach back (``snapshot_for`` then answers as it would have).
    """
    if plan.mode in (Mode.EXACT, Mode.CONTINUE) and plan.rv < cacher.cache.oldest_rv:
        with waiting():
            return await reach_back(cacher, plan.rv)
    return None


def snapshot_for(ctx: ApiContext, cacher: Cacher, plan: ReadPlan, backfill: BackfillFailed | None = None) -> Snapshot:
    """The snapshot a plan reads (call right after ``wait_fresh``, without awaiting between).

    A continue token's pages read its rv exactly (invariant 4), inside the window or 410 (invariant 3).
    ``backfill``: why a backfill for ``plan`` failed, said in the 410 when it was a limit.
    """
    cache = cacher.cache
    if plan.mode in (Mode.EXACT, Mode.CONTINUE):
        try:
            if plan.mode is Mode.CONTINUE and cache.group_size(plan.rv) > plan.group:
                # The rest of a group at rv arrived after the first page: rv no longer names the
                # state that page read (see ResourceCache, "Groups").
                raise ResourceVersionTooOld(plan.rv, cache.oldest_rv)
            return cache.snapshot(plan.rv)
        except ResourceVersionTooOld:
            if plan.mode is Mode.CONTINUE:
                # As kube: the 410 carries an "inconsistent" token that goes on from the same
                # key at the newest rv, for clients that accept a list that is not one snapshot.
                token = ctx.codec.encode(cache.rv, plan.start, cache.group_size(cache.rv)) if plan.start else None
                raise apierrors.resource_expired(CONTINUE_TOO_OLD, list_continue=token) from None
            if ctx.upstream.answers_old_reads:
                raise PassThrough(PassReason.OLD_EXACT_READ) from None
            raise apierrors.resource_expired(_too_old(apierrors.LIST_TOO_OLD, backfill)) from None
        except ResourceVersionTooNew as e:  # the cache moved backwards: a relist restarted it
            raise apierrors.too_large_resource_version(e.requested, e.current) from None
    return cache.snapshot()


def _too_old(message: str, backfill: BackfillFailed | None) -> str:
    """kube's message, and why the history could not be fetched when it was a limit of this proxy's."""
    if backfill is None or backfill.outcome in (BackfillFailed.OFF, BackfillFailed.GONE, BackfillFailed.RELIST):
        return message
    return f"{message} (the proxy could not fetch the older history: {backfill})"


def parse_predicate(cacher: Cacher, namespace: str, opts: ListOptions) -> SelectionPredicate:
    try:
        return SelectionPredicate.parse(
            cacher.resource, namespace, opts.label_selector, opts.field_selector, opts.shard_selector
        )
    except UnsupportedField as e:
        if e.custom:  # perhaps one of the CRD's selectableFields: the upstream knows
            raise PassThrough(PassReason.FIELD_SELECTOR) from None
        raise apierrors.bad_request(str(e)) from None
    except ShardSelectorError as e:
        # kube's registry returns a plain error, which its handler writes as a 500 with no reason.
        raise apierrors.StatusError(500, "", f"invalid shard selector: {e}") from None
    except SelectorError as e:
        raise apierrors.bad_request(str(e)) from None


async def serve_get(
    ctx: ApiContext,
    cacher: Cacher,
    info: RequestInfo,
    opts: ListOptions,
    response: Response,
    encoding: Encoding = FULL_JSON,
    *,
    headers: Sequence[tuple[str, str]] = (),
) -> None:
    plan = plan_get(opts.resource_version)
    await ensure_ready(ctx, cacher)
    await wait_fresh(ctx, cacher, plan, info.namespace, get=True)
    resource = cacher.resource
    obj = cacher.cache.get(object_key(info.namespace if resource.namespaced else "", info.name))
    if obj is None:
        raise apierrors.not_found(resource.group, resource.resource, info.name)
    response.send(200, encoding.object_parts(resource, obj), content_type=encoding.content_type, headers=headers)


async def serve_list(
    ctx: ApiContext,
    cacher: Cacher,
    info: RequestInfo,
    opts: ListOptions,
    response: Response,
    encoding: Encoding = FULL_JSON,
    *,
    headers: Sequence[tuple[str, str]] = (),
) -> None:
    try:
        plan = plan_list(opts, ctx.codec)
    except UnverifiedContinueToken as e:
        if ctx.upstream_continue_tokens:
            # The next page of a list the upstream answered (a consistent read passed through):
            # its token, its to validate, with the client's own credentials.
            raise PassThrough(PassReason.UPSTREAM_CONTINUE) from None
        raise apierrors.bad_request(f"invalid continue token: {e}") from None
    predicate = parse_predicate(cacher, info.namespace, opts)
    await ensure_ready(ctx, cacher)
    resource = cacher.resource
    scope = ListScope.of(info.namespace if resource.namespaced else None)
    # As kube's watch cache (computeListLimit): resourceVersion=0 ignores limit. client-go counts on
    # it: a paged answer there tells its reflector the watch cache is off (``paginatedResult``).
    limit = 0 if plan.mode is Mode.ANY else opts.limit
    await wait_fresh(ctx, cacher, plan, info.namespace if resource.namespaced else None)
    backfill = await backfill_for(cacher, plan)
    # From here to send(): synchronous, so the snapshot cannot change under us.
    snapshot = snapshot_for(ctx, cacher, plan, backfill)
    # ListMeta.shardInfo echoes the selector, normalized as kube's Selector.String().
    shard_info = predicate.shard.text if predicate.shard is not None else None
    name = predicate.exact_name()
    if name is not None and (scope.lo or not resource.namespaced):
        # metadata.name=X within one namespace (or cluster-scoped): a key lookup, not a scan.
        obj = snapshot.get(object_key(info.namespace if resource.namespaced else "", name))
        items = [obj] if obj is not None and predicate.selector_matches(obj) else []
        page_items, next_start, remaining, scanned = items, None, None, 1
        if plan.mode is Mode.CONTINUE and plan.start:
            page_items = []
    else:
        # A scan: an identical LIST at this snapshot may have built its answer already (a relist storm).
        bodies = ctx.list_bodies.get(resource)
        if bodies is None:
            bodies = ctx.list_bodies[resource] = ListBodies()
        key = (info.namespace, opts.label_selector, opts.field_selector, predicate.shard, limit, plan.start, encoding)
        version = (snapshot.rv, cacher.cache.group_size(snapshot.rv))
        built = bodies.get(version, key) if encoding.timeless else None
        if built is None:
            filter_fn = predicate.selector_matches if predicate.filters else None
            indexed = predicate.exact_field(snapshot.index_field)  # a kubelet's spec.nodeName=<node>
            # kube counts the unfiltered rest when only a shardSelector filters (see SelectionPredicate).
            count_rest = predicate.empty and predicate.shard is not None
            page = list_page(
                snapshot, scope, filter_fn, limit=limit, start=plan.start, indexed=indexed, count_rest=count_rest
            )
            token = None
            if page.next_start is not None:
                token = ctx.codec.encode(snapshot.rv, page.next_start, version[1])
            built = (
                encoding.list_parts(resource, page.items, snapshot.rv, token, page.remaining, shard_info=shard_info),
                len(page.items),
                page.scanned,
            )
            if encoding.timeless:
                bodies.put(version, key, built)
        parts, returned, scanned = built
        cacher.lists += 1
        cacher.list_fetched += scanned
        cacher.list_returned += returned
        # The parts are immutable cached bytes: the snapshot stays consistent while they are written.
        await response.send_stream(200, parts, content_type=encoding.content_type, headers=headers)
        return
    cacher.lists += 1
    cacher.list_fetched += scanned
    cacher.list_returned += len(page_items)
    token = None
    if next_start is not None:
        token = ctx.codec.encode(snapshot.rv, next_start, cacher.cache.group_size(snapshot.rv))
    parts = encoding.list_parts(resource, page_items, snapshot.rv, token, remaining, shard_info=shard_info)
    # The parts are immutable cached bytes: the snapshot stays consistent while they are written.
    await response.send_stream(200, parts, content_type=encoding.content_type, headers=headers)
