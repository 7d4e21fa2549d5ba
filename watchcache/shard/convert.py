"""CachedObject and events to and from the replication stream's messages (no JSON parsing)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from watchcache.cache.events import ADDED, DELETED, MODIFIED, WatchEvent
from watchcache.cache.object import CachedObject, object_key
from watchcache.shard import follow_pb2 as pb

_TO_PB = {ADDED: pb.Change.ADDED, MODIFIED: pb.Change.MODIFIED, DELETED: pb.Change.DELETED}
_FROM_PB = {v: k for k, v in _TO_PB.items()}


def object_to_pb(obj: CachedObject) -> pb.Object:
    return pb.Object(
        namespace=obj.namespace,
        name=obj.name,
        resource_version=obj.rv,
        labels=obj.labels,
        fields=obj.fields,
        body=obj.body,
    )


def object_from_pb(msg: pb.Object) -> CachedObject:
    return CachedObject(
        object_key(msg.namespace, msg.name),
        msg.namespace,
        msg.name,
        msg.resource_version,
        dict(msg.labels),
        dict(msg.fields),
        msg.body,
    )


def changes_to_pb(events: Iterable[WatchEvent]) -> list[pb.Change]:
    return [pb.Change(type=_TO_PB[e.type], object=object_to_pb(e.object)) for e in events]


def changes_from_pb(changes: Sequence[pb.Change]) -> list[tuple[str, CachedObject]]:
    return [(_FROM_PB[c.type], object_from_pb(c.object)) for c in changes]
