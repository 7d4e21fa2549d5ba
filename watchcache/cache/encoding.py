"""How cached objects and events are written for one kind of client.

``FULL_JSON`` is the objects as stored (every typed client, kubectl, informers); the
others are ``PartialObjectMetadata`` of ``meta.k8s.io`` v1 or v1beta1, in JSON or in
protobuf (metadata informers). An encoding turns cached bytes into GET bodies, LIST
pieces, watch frames and bookmarks without re-encoding objects: the metadata of an
object is derived once (``cache/metadata.py``) and each watch frame once per event and
encoding (cached on the ``WatchEvent``), then shared by every watcher of that encoding.

Watchers of different encodings never share frames: the dispatcher groups watchers by
(predicate, encoding). All of it is invariant 5 (encode once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import orjson

from watchcache.apierrors import StatusError
from watchcache.cache.events import ADDED, BOOKMARK, ERROR, WatchEvent, json_frame, json_frame_ends
from watchcache.cache.metadata import metadata_json, metadata_protobuf
from watchcache.cache.object import CachedObject
from watchcache.cache.zeros import BOOKMARK_TAILS
from watchcache.kubeproto import wire
from watchcache.resources import ResourceType

JSON = "application/json"
PROTOBUF = "application/vnd.kubernetes.protobuf"


def json_list_meta(
    rv: int,
    continue_token: str | None,
    remaining: int | None,
    *,
    unstructured: bool = False,
    shard_info: str | None = None,
) -> bytes:
    """ListMeta; ``unstructured`` (a custom resource's list, as kube writes it): ``"continue": ""`` on
    the last page, which typed lists omit. ``shard_info``: the shardSelector a typed list was
    filtered by (``{"selector": ...}`` after remainingItemCount, in ListMeta's field order)."""
    if unstructured:
        # Go's map order, as kube writes an UnstructuredList: continue, remainingItemCount, resourceVersion.
        meta = b'{"continue":"' + (continue_token or "").encode() + b'",'
        if continue_token is not None and remaining is not None:
            meta += b'"remainingItemCount":' + str(remaining).encode() + b","
        return meta + b'"resourceVersion":"' + str(rv).encode() + b'"}'
    meta = b'{"resourceVersion":"' + str(rv).encode() + b'"'
    if continue_token is not None:
        meta += b',"continue":"' + continue_token.encode() + b'"'
        if remaining is not None:
            meta += b',"remainingItemCount":' + str(remaining).encode()
    if shard_info is not None:
        meta += b',"shardInfo":{"selector":' + orjson.dumps(shard_info) + b"}"
    return meta + b"}"


# A BOOKMARK so annotated announces a relist diff ending at the annotation's rv (see
# ``Cacher.relist``): a watchcache tier in front applies the diff as one relist of its own.
RELIST_DIFF_ANNOTATION = "watchcache.io/relist-diff-end"


def bookmark_annotations(initial_events_end: bool, relist_diff_end: int | None) -> dict[str, str]:
    """A bookmark's annotations: the end of initial events, the end of a relist diff."""
    out = {}
    if initial_events_end:
        out["k8s.io/initial-events-end"] = "true"
    if relist_diff_end is not None:
        out[RELIST_DIFF_ANNOTATION] = str(relist_diff_end)
    return out


def bookmark_meta(
    rv: int, initial_events_end: bool, relist_diff_end: int | None = None, *, unstructured: bool = False
) -> bytes:
    """A bookmark's ``"metadata":{...}``: ObjectMeta's field order, or (``unstructured``, a custom
    resource's) Go's map order, annotations first."""
    version = b'"resourceVersion":"' + str(rv).encode() + b'"'
    annotations = bookmark_annotations(initial_events_end, relist_diff_end)
    if not annotations:
        return b'"metadata":{' + version + b"}"
    noted = b'"annotations":' + orjson.dumps(annotations, option=orjson.OPT_SORT_KEYS)
    return b'"metadata":{' + (noted + b"," + version if unstructured else version + b"," + noted) + b"}"


def bookmark_tail(resource: ResourceType) -> bytes:
    """What follows a bookmark's metadata in kube's: the kind's zero-valued fields (``cache/zeros.py``)."""
    return BOOKMARK_TAILS.get((resource.group, resource.version, resource.kind), b"")


class Encoding:
    """One representation of a resource's objects; stateless, shared (singletons below)."""

    name = "json"
    content_type = JSON
    watch_content_type = JSON
    # What ends a GET's or LIST's answer: kube's JSON encoder (json.Encoder.Encode) writes a newline
    # after every object; protobuf has nothing after its message.
    answer_end = b"\n"
    # Applied to a watcher's first frame when it is written (a Table's column definitions), or None.
    lead: Callable[[bytes], bytes] | None = None
    # A body that depends only on the snapshot, so identical LISTs at one snapshot may share it. A
    # Table's ages come from each request's clock, as kube's do: never shared.
    timeless = True

    def __repr__(self) -> str:
        return f"Encoding({self.name})"

    def object_parts(self, resource: ResourceType, obj: CachedObject) -> Sequence[bytes]:
        """A GET body."""
        return (resource.typed_prefix, obj.body)

    def list_parts(
        self,
        resource: ResourceType,
        items: Sequence[CachedObject],
        rv: int,
        continue_token: str | None,
        remaining: int | None,
        *,
        shard_info: str | None = None,
    ) -> list[bytes]:
        """A LIST body in pieces, each an immutable cached buffer or a small envelope piece.

        ``shard_info``: the list was filtered by this shardSelector. kube says so on typed lists
        only: an UnstructuredList (a custom resource's) has no shardInfo to set."""
        if resource.custom:
            # An UnstructuredList, written as Go writes a map: sorted keys, and items that keep their
            # kind and apiVersion.
            head = b'{"apiVersion":"' + resource.api_version.encode() + b'","items":['
            end = (
                b'],"kind":"'
                + resource.list_kind.encode()
                + b'","metadata":'
                + json_list_meta(rv, continue_token, remaining, unstructured=True)
                + b"}"
            )
            first = resource.typed_prefix
        else:
            head = (
                b'{"kind":"'
                + resource.list_kind.encode()
                + b'","apiVersion":"'
                + resource.api_version.encode()
                + b'","metadata":'
                + json_list_meta(rv, continue_token, remaining, shard_info=shard_info)
                + b',"items":['
            )
            end, first = b"]}", b"{"
        parts = [head]
        sep, rest = first, b"," + first
        for obj in items:
            parts.append(sep)
            parts.append(obj.body)
            sep = rest
        parts.append(end)
        return parts

    def event_frame(self, event: WatchEvent, as_type: str) -> bytes:
        return event.frame(as_type)

    def build_frame(self, resource: ResourceType, source: CachedObject, as_type: str) -> bytes:
        """A watch frame of type ``as_type`` for object ``source``; called once per event (see events.py)."""
        return json_frame(as_type, resource.typed_prefix, source.body)

    def initial_parts(self, resource: ResourceType, obj: CachedObject) -> Sequence[bytes]:
        """One ADDED frame of the initial events, in pieces (the object's bytes are not copied)."""
        head, tail = json_frame_ends(ADDED, resource.typed_prefix)
        return (head, obj.body, tail)

    def initial_events(
        self, resource: ResourceType, objects: Iterable[CachedObject], matches: Callable[[CachedObject], bool]
    ) -> tuple[list[bytes], int]:
        """The ADDED frames of a watch's initial events for the ``objects`` that match, in pieces, and their count.

        Full JSON (this class) is ``initial_parts`` inlined, a shared head and tail around each
        object's own bytes: a watch from a 5,000-pod list costs 15,000 appends, no copy.
        """
        parts: list[bytes] = []
        append = parts.append
        head, tail = json_frame_ends(ADDED, resource.typed_prefix)
        count = 0
        for obj in objects:
            if matches(obj):
                append(head)
                append(obj.body)
                append(tail)
                count += 1
        return parts, count

    def bookmark_frame(
        self, resource: ResourceType, rv: int, *, initial_events_end: bool = False, relist_diff_end: int | None = None
    ) -> bytes:
        meta = bookmark_meta(rv, initial_events_end, relist_diff_end, unstructured=resource.custom)
        return json_frame(BOOKMARK, resource.typed_prefix, meta, bookmark_tail(resource), b"}")

    def error_frame(self, error: StatusError) -> bytes:
        return json_frame(ERROR, error.json())


FULL_JSON = Encoding()


class _PartialObjectMetadata(Encoding):
    """The PartialObjectMetadata encodings' common part: initial events from ``initial_parts``, one object at a time."""

    def initial_events(
        self, resource: ResourceType, objects: Iterable[CachedObject], matches: Callable[[CachedObject], bool]
    ) -> tuple[list[bytes], int]:
        parts: list[bytes] = []
        initial_parts = self.initial_parts
        count = 0
        for obj in objects:
            if matches(obj):
                parts.extend(initial_parts(resource, obj))
                count += 1
        return parts, count


class MetadataJson(_PartialObjectMetadata):
    """PartialObjectMetadata(List) in JSON: ``{"kind":"PartialObjectMetadata",...,"metadata":{...}}``."""

    def __init__(self, version: str) -> None:
        self.name = f"metadata-json-{version}"
        api_version = f"meta.k8s.io/{version}".encode()
        self.prefix = b'{"kind":"PartialObjectMetadata","apiVersion":"' + api_version + b'",'
        self.list_prefix = b'{"kind":"PartialObjectMetadataList","apiVersion":"' + api_version + b'","metadata":'
        self.item_head = self.prefix + b'"metadata":'
        self._initial_ends = json_frame_ends(ADDED, self.item_head, b"}")

    def object_parts(self, resource: ResourceType, obj: CachedObject) -> Sequence[bytes]:
        return (self.item_head, metadata_json(obj, resource), b"}")

    def list_parts(
        self,
        resource: ResourceType,
        items: Sequence[CachedObject],
        rv: int,
        continue_token: str | None,
        remaining: int | None,
        *,
        shard_info: str | None = None,
    ) -> list[bytes]:
        # kube's PartialObjectMetadataList copies resourceVersion, continue and remainingItemCount: no shardInfo.
        # Its items are a nil slice when nothing matched: ``null`` in JSON, not ``[]``.
        meta = self.list_prefix + json_list_meta(rv, continue_token, remaining)
        if not items:
            return [meta + b',"items":null}']
        parts = [meta + b',"items":[']
        head = self.item_head
        between = b"}," + head
        for i, obj in enumerate(items):
            parts.append(between if i else head)
            parts.append(metadata_json(obj, resource))
        parts.append(b"}]}")
        return parts

    def event_frame(self, event: WatchEvent, as_type: str) -> bytes:
        return event.encoded(self, as_type)

    def build_frame(self, resource: ResourceType, source: CachedObject, as_type: str) -> bytes:
        return json_frame(as_type, self.item_head, metadata_json(source, resource), b"}")

    def initial_parts(self, resource: ResourceType, obj: CachedObject) -> Sequence[bytes]:
        head, tail = self._initial_ends
        return (head, metadata_json(obj, resource), tail)

    def bookmark_frame(
        self, resource: ResourceType, rv: int, *, initial_events_end: bool = False, relist_diff_end: int | None = None
    ) -> bytes:
        return json_frame(BOOKMARK, self.prefix, bookmark_meta(rv, initial_events_end, relist_diff_end), b"}")


class MetadataProtobuf(_PartialObjectMetadata):
    """PartialObjectMetadata(List) in protobuf: ``k8s\\0`` + Unknown; watch frames length-prefixed."""

    content_type = PROTOBUF
    watch_content_type = PROTOBUF + ";stream=watch"
    answer_end = b""

    def __init__(self, version: str) -> None:
        self.name = f"metadata-protobuf-{version}"
        api_version = f"meta.k8s.io/{version}"
        self.type_meta = wire.type_meta(api_version, "PartialObjectMetadata")
        self.list_type_meta = wire.type_meta(api_version, "PartialObjectMetadataList")

    def _envelope(self, om: bytes) -> bytes:
        # PartialObjectMetadata{metadata: om}, wrapped.
        inner = wire.delimited(1, len(om))
        return wire.envelope_head(self.type_meta, len(inner) + len(om)) + inner + om + wire.envelope_tail()

    def object_parts(self, resource: ResourceType, obj: CachedObject) -> Sequence[bytes]:
        return (self._envelope(metadata_protobuf(obj, resource)),)

    def list_parts(
        self,
        resource: ResourceType,
        items: Sequence[CachedObject],
        rv: int,
        continue_token: str | None,
        remaining: int | None,
        *,
        shard_info: str | None = None,
    ) -> list[bytes]:
        # No shardInfo, as in JSON (kube copies three ListMeta fields to PartialObjectMetadataList).
        lm = wire.list_meta(str(rv), continue_token or "", remaining if continue_token is not None else None)
        body: list[bytes] = [wire.delimited(1, len(lm)), lm]
        for obj in items:
            om = metadata_protobuf(obj, resource)
            inner = wire.delimited(1, len(om))
            # items (field 2) of PartialObjectMetadataList: PartialObjectMetadata{metadata (1): om}
            body.append(wire.delimited(2, len(inner) + len(om)) + inner)
            body.append(om)
        size = sum(map(len, body))
        return [wire.envelope_head(self.list_type_meta, size), *body, wire.envelope_tail()]

    def event_frame(self, event: WatchEvent, as_type: str) -> bytes:
        return event.encoded(self, as_type)

    def build_frame(self, resource: ResourceType, source: CachedObject, as_type: str) -> bytes:
        return wire.watch_frame(as_type.encode(), self._envelope(metadata_protobuf(source, resource)))

    def initial_parts(self, resource: ResourceType, obj: CachedObject) -> Sequence[bytes]:
        return (wire.watch_frame(b"ADDED", self._envelope(metadata_protobuf(obj, resource))),)

    def bookmark_frame(
        self, resource: ResourceType, rv: int, *, initial_events_end: bool = False, relist_diff_end: int | None = None
    ) -> bytes:
        meta: dict[str, object] = {"resourceVersion": str(rv)}
        annotations = bookmark_annotations(initial_events_end, relist_diff_end)
        if annotations:
            meta["annotations"] = annotations
        return wire.watch_frame(b"BOOKMARK", self._envelope(wire.object_meta(meta)))

    def error_frame(self, error: StatusError) -> bytes:
        return wire.watch_frame(b"ERROR", wire.status_body(error.to_status()))


METADATA_JSON = {v: MetadataJson(v) for v in ("v1", "v1beta1")}
METADATA_PROTOBUF = {v: MetadataProtobuf(v) for v in ("v1", "v1beta1")}
