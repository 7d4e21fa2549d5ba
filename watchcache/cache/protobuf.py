"""Full objects in protobuf, as kube-apiserver writes them: the upstream's own bytes, kept.

A protobuf cache of a resource (``upstream/protobuf.py`` feeds it from a protobuf list+watch of
the upstream) holds ``ProtobufObject``s: each object's message bytes exactly as the upstream
wrote them (``runtime.Unknown.raw`` of a GET, an item of a list, the object of a watch event),
with the attributes filters need read from the wire once (``kubeproto/objects.py``). The
``FullProtobuf`` encoding writes them as kube does, without re-encoding anything:

- GET: ``k8s\\0`` + Unknown{TypeMeta{apiVersion, kind}, raw, "", ""};
- LIST: the same envelope around ``<Kind>List{metadata: ListMeta, items: [object...]}``, each
  item the object's message (no envelope of its own);
- WATCH: length-prefixed ``WatchEvent{type, RawExtension{k8s\\0 + Unknown}}``, built once per
  event and type (``WatchEvent.encoded``) and shared by every watcher; a bookmark is the
  resource's empty object (learned from the upstream's own bookmarks: ``learn_empty``) with
  ObjectMeta{resourceVersion, annotations}; an ERROR event's object is a protobuf Status.

Such a cache serves only this encoding: its objects have no JSON form here (metadata, Tables
and JSON come from the resource's JSON cache).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from watchcache.apierrors import StatusError
from watchcache.cache.encoding import PROTOBUF, Encoding, bookmark_annotations
from watchcache.cache.events import WatchEvent
from watchcache.cache.object import CachedObject, ObjectError, object_key, parse_resource_version
from watchcache.kubeproto import objects, wire
from watchcache.resources import ResourceType


class ProtobufObject(CachedObject):
    """A ``CachedObject`` whose ``body`` is the object's protobuf message (the upstream's bytes)."""

    __slots__ = ()

    def typed_json(self, resource: ResourceType) -> bytes:
        raise TypeError("a protobuf object has no JSON form in the cache")

    def decode(self) -> dict[str, bytes]:
        """Its bytes: a protobuf object is compared by them (``ResourceCache.relist``), never parsed to JSON."""
        return {"protobuf": self.body}

    def with_resource_version(self, rv: int) -> CachedObject:
        body = objects.with_resource_version(self.body, str(rv))
        return ProtobufObject(self.key, self.namespace, self.name, rv, self.labels, self.fields, body)


_TREES: dict[ResourceType, objects.FieldTree] = {}


def _tree(resource: ResourceType) -> objects.FieldTree:
    tree = _TREES.get(resource)
    if tree is None:
        wanted = set(resource.extra_fields)
        known = objects.SELECTABLE.get((resource.group, resource.kind), {})
        missing = wanted - set(known)
        if missing:
            raise ValueError(f"{resource.qualified}: no field numbers for {', '.join(sorted(missing))}")
        tree = _TREES[resource] = objects.field_tree({f: known[f] for f in resource.extra_fields})
    return tree


def protobuf_supported(resource: ResourceType) -> bool:
    """kube serves this resource in protobuf (a built-in kind), and its selectable fields are known here."""
    if resource.custom:
        return False
    known = objects.SELECTABLE.get((resource.group, resource.kind), {})
    return all(f in known for f in resource.extra_fields)


def decode_protobuf_object(resource: ResourceType, raw: bytes) -> ProtobufObject:
    """Read an object's attributes from its message bytes (kept as they are). Raises ``ObjectError``."""
    try:
        attrs = objects.read_object(raw, _tree(resource))
    except (objects.WireError, UnicodeDecodeError) as e:
        raise ObjectError(f"malformed protobuf object: {e}") from None
    if not attrs.name:
        raise ObjectError("object has no metadata.name")
    namespace = attrs.namespace if resource.namespaced else ""
    if resource.namespaced and not namespace:
        raise ObjectError("namespaced object has no metadata.namespace")
    rv = parse_resource_version(attrs.resource_version)
    fields = {"metadata.name": attrs.name}
    if resource.namespace_selectable:
        fields["metadata.namespace"] = namespace
    fields.update(attrs.fields)
    return ProtobufObject(object_key(namespace, attrs.name), namespace, attrs.name, rv, attrs.labels, fields, raw)


class FullProtobuf(Encoding):
    """Full objects in protobuf from a protobuf cache (see the module doc)."""

    name = "protobuf"
    content_type = PROTOBUF
    watch_content_type = PROTOBUF + ";stream=watch"
    answer_end = b""

    def __init__(self) -> None:
        self._type_meta: dict[tuple[str, str], bytes] = {}
        # Per resource: the upstream's empty object around its ObjectMeta (a bookmark's template).
        self._empty: dict[ResourceType, tuple[bytes, bytes]] = {}

    def type_meta(self, api_version: str, kind: str) -> bytes:
        key = (api_version, kind)
        field = self._type_meta.get(key)
        if field is None:
            field = self._type_meta[key] = wire.type_meta(api_version, kind)
        return field

    def learn_empty(self, resource: ResourceType, bookmark_raw: bytes) -> None:
        """Keep the upstream's bookmark object (``kind``'s empty object) as the template of ours.

        kube's bookmark is a new empty object of the kind with only its resourceVersion (and
        annotations) set, marshalled whole: every non-pointer field of its spec and status is
        written with its zero value, which only the kind's schema knows. The upstream's own
        bookmark carries exactly those bytes around its ObjectMeta.
        """
        if resource not in self._empty:
            self._empty[resource] = objects.without_meta(bookmark_raw)

    def knows_empty(self, resource: ResourceType) -> bool:
        return resource in self._empty

    def _head(self, resource: ResourceType, raw_len: int) -> bytes:
        return wire.envelope_head(self.type_meta(resource.api_version, resource.kind), raw_len)

    def envelope(self, resource: ResourceType, raw: bytes) -> bytes:
        return self._head(resource, len(raw)) + raw + wire.envelope_tail()

    def object_parts(self, resource: ResourceType, obj: CachedObject) -> Sequence[bytes]:
        return (self._head(resource, len(obj.body)), obj.body, wire.envelope_tail())

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
        lm = wire.list_meta(
            str(rv), continue_token or "", remaining if continue_token is not None else None, shard_info
        )
        body: list[bytes] = [wire.delimited(1, len(lm)) + lm]
        append = body.append
        size = len(body[0])
        for obj in items:
            raw = obj.body
            tag = wire.delimited(2, len(raw))
            append(tag)
            append(raw)
            size += len(tag) + len(raw)
        head = wire.envelope_head(self.type_meta(resource.api_version, resource.list_kind), size)
        return [head, *body, wire.envelope_tail()]

    def event_frame(self, event: WatchEvent, as_type: str) -> bytes:
        return event.encoded(self, as_type)

    def build_frame(self, resource: ResourceType, source: CachedObject, as_type: str) -> bytes:
        return wire.watch_frame(as_type.encode(), self.envelope(resource, source.body))

    def _frame_ends(self, resource: ResourceType, event_type: bytes, raw_len: int) -> tuple[bytes, bytes]:
        """The bytes of ``wire.watch_frame(event_type, envelope(raw))`` before and after ``raw``."""
        head = self._head(resource, raw_len)
        tail = wire.envelope_tail()
        obj_len = len(head) + raw_len + len(tail)
        ext = wire.delimited(1, obj_len)
        event = wire.delimited(1, len(event_type)) + event_type + wire.delimited(2, len(ext) + obj_len)
        size = len(event) + len(ext) + obj_len
        return size.to_bytes(4, "big") + event + ext + head, tail

    def initial_parts(self, resource: ResourceType, obj: CachedObject) -> Sequence[bytes]:
        head, tail = self._frame_ends(resource, b"ADDED", len(obj.body))
        return (head, obj.body, tail)

    def initial_events(
        self, resource: ResourceType, objects_: Iterable[CachedObject], matches: Callable[[CachedObject], bool]
    ) -> tuple[list[bytes], int]:
        """ADDED frames in pieces around each object's own bytes (not copied), as full JSON's."""
        parts: list[bytes] = []
        append = parts.append
        ends = self._frame_ends
        count = 0
        for obj in objects_:
            if matches(obj):
                head, tail = ends(resource, b"ADDED", len(obj.body))
                append(head)
                append(obj.body)
                append(tail)
                count += 1
        return parts, count

    def bookmark_frame(
        self, resource: ResourceType, rv: int, *, initial_events_end: bool = False, relist_diff_end: int | None = None
    ) -> bytes:
        meta: dict[str, object] = {"resourceVersion": str(rv)}
        annotations = bookmark_annotations(initial_events_end, relist_diff_end)
        if annotations:
            meta["annotations"] = annotations
        om = wire.object_meta(meta)
        before, after = self._empty.get(resource, (b"", b""))
        raw = before + wire.delimited(objects.META, len(om)) + om + after
        return wire.watch_frame(b"BOOKMARK", self.envelope(resource, raw))

    def error_frame(self, error: StatusError) -> bytes:
        return wire.watch_frame(b"ERROR", wire.status_body(error.to_status()))


FULL_PROTOBUF = FullProtobuf()
