"""A LIST's answer from the snapshot it reads: the page, its continue token, the bytes, shared when identical.

Called in the same step as ``reads.list_snapshot`` returned (no ``await`` in between), so the
snapshot is the state the answer describes. The answer is its envelope plus each item's cached
bytes (``Encoding.list_parts``), never Python objects. An identical LIST at the same snapshot gets
the parts built for the first (``Cacher.list_bodies``: a relist storm); the cacher counts every
LIST here (``Cacher.count_list``).
"""

from __future__ import annotations

from watchcache.cache.continuetoken import ContinueCodec
from watchcache.cache.encoding import Encoding
from watchcache.cache.listing import ListScope, list_page
from watchcache.cache.object import object_key
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.semantics import ListOptions, Mode, ReadPlan
from watchcache.cache.store import Snapshot
from watchcache.dispatch.cacher import Cacher


def list_parts(
    codec: ContinueCodec,
    cacher: Cacher,
    snapshot: Snapshot,
    plan: ReadPlan,
    predicate: SelectionPredicate,
    namespace: str,
    opts: ListOptions,
    encoding: Encoding,
) -> list[bytes]:
    """The parts of the LIST ``plan`` of ``namespace`` ("": all) at ``snapshot``, counted on ``cacher``."""
    resource = cacher.resource
    scope = ListScope.of(namespace if resource.namespaced else None)
    # ListMeta.shardInfo echoes the selector, normalized as kube's Selector.String().
    shard_info = predicate.shard.text if predicate.shard is not None else None
    name = predicate.exact_name()
    if name is not None and (scope.lo or not resource.namespaced):
        # metadata.name=X within one namespace (or cluster-scoped): a key lookup, not a scan.
        obj = snapshot.get(object_key(namespace if resource.namespaced else "", name))
        items = [obj] if obj is not None and predicate.selector_matches(obj) else []
        if plan.mode is Mode.CONTINUE and plan.start:
            items = []
        cacher.count_list(len(items), 1)
        return encoding.list_parts(resource, items, snapshot.rv, None, None, shard_info=shard_info)
    # As kube's watch cache (computeListLimit): resourceVersion=0 ignores limit. client-go counts on
    # it: a paged answer there tells its reflector the watch cache is off (``paginatedResult``), as it
    # is at kube for what kube serves from etcd (events), whose store pages at resourceVersion=0 too.
    limit = 0 if plan.mode is Mode.ANY and not resource.uncached_by_kube else opts.limit
    # A scan: an identical LIST at this snapshot may have built its answer already (a relist storm).
    bodies = cacher.list_bodies
    key = (namespace, opts.label_selector, opts.field_selector, predicate.shard, limit, plan.start, encoding)
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
            token = codec.encode(snapshot.rv, page.next_start, version[1])
        built = (
            encoding.list_parts(resource, page.items, snapshot.rv, token, page.remaining, shard_info=shard_info),
            len(page.items),
            page.scanned,
        )
        if encoding.timeless:
            bodies.put(version, key, built)
    parts, returned, scanned = built
    cacher.count_list(returned, scanned)
    return parts
