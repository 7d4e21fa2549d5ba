"""Reading built-in objects from kube-apiserver's protobuf wire, without their schemas.

The proxy keeps the upstream's own protobuf bytes of each object (docs/representations.md,
"Representations"), so what it must read from them is small and fixed by the API: every
built-in kind's message has its ``ObjectMeta`` at field 1 and every list its ``ListMeta`` at
field 1 and its ``items`` at field 2; ObjectMeta's name (1), namespace (3), resourceVersion
(6) and labels (11, a map: entries of key 1 and value 2); and the few selectable fields
kube defines beyond metadata, each a path of field numbers (``SELECTABLE``). These numbers
are public facts of the Kubernetes API (its ``generated.proto`` files); the reading is ours.

Everything here works on spans of one ``bytes`` (no copies until a value is taken), and
raises ``WireError`` on a malformed buffer: the caller drops that object, as the JSON
reflector drops a malformed event.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from watchcache.kubeproto.wire import MAGIC, delimited

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5

# ObjectMeta's fields the cache reads or writes.
META = 1
META_NAME, META_NAMESPACE, META_RESOURCE_VERSION, META_LABELS, META_ANNOTATIONS = 1, 3, 6, 11, 12


class WireError(ValueError):
    """Not a well-formed protobuf message (or not the one expected)."""


def _varint(buf: bytes, i: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while i < end:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            break
    raise WireError("truncated or overlong varint")


def fields(buf: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int, int]]:
    """Each field of the message in ``buf[start:end]``: (number, wire type, a, b).

    For a length-delimited field ``buf[a:b]`` is its payload; for a varint ``a`` is its value
    (``b`` where it ends); fixed-size fields give their span. Groups (deprecated, unused by
    Kubernetes) are refused.
    """
    if end is None:
        end = len(buf)
    i = start
    while i < end:
        # One-byte varints inline: nearly every tag and most lengths (a call per varint was a third
        # of the cost of reading a pod).
        key = buf[i]
        if key < 0x80:
            i += 1
        else:
            key, i = _varint(buf, i, end)
        number, kind = key >> 3, key & 7
        if kind == LEN:
            if i < end and buf[i] < 0x80:
                size = buf[i]
                i += 1
            else:
                size, i = _varint(buf, i, end)
            if i + size > end:
                raise WireError("length-delimited field runs past its message")
            yield number, kind, i, i + size
            i += size
        elif kind == VARINT:
            value, i = _varint(buf, i, end)
            yield number, kind, value, i
        elif kind in (FIXED64, FIXED32):
            size = 8 if kind == FIXED64 else 4
            if i + size > end:
                raise WireError("fixed field runs past its message")
            yield number, kind, i, i + size
            i += size
        else:
            raise WireError(f"unsupported wire type {kind}")


# --------------------------------------------------------------------- envelopes


@dataclass(frozen=True, slots=True)
class Unknown:
    """A ``k8s\\0`` body: its TypeMeta and its message bytes (``raw``)."""

    api_version: str
    kind: str
    raw: bytes


def unknown(body: bytes) -> Unknown:
    """Parse a whole protobuf body (``k8s\\0`` + runtime.Unknown)."""
    if not body.startswith(MAGIC):
        raise WireError("no k8s protobuf magic")
    api_version = kind = ""
    raw = b""
    for number, kind_, a, b in fields(body, len(MAGIC)):
        if number == 1 and kind_ == LEN:
            for n, k, x, y in fields(body, a, b):
                if k == LEN and n == 1:
                    api_version = body[x:y].decode()
                elif k == LEN and n == 2:
                    kind = body[x:y].decode()
        elif number == 2 and kind_ == LEN:
            raw = body[a:b]
    return Unknown(api_version, kind, raw)


@dataclass(frozen=True, slots=True)
class ListPage:
    """A list message: its ListMeta's values and each item's message bytes."""

    resource_version: str
    continue_token: str
    remaining: int | None
    items: list[bytes]


def list_page(raw: bytes) -> ListPage:
    rv = token = ""
    remaining: int | None = None
    items: list[bytes] = []
    append = items.append
    for number, kind, a, b in fields(raw):
        if kind != LEN:
            continue
        if number == 2:
            append(raw[a:b])
        elif number == 1:
            for n, k, x, y in fields(raw, a, b):
                if n == 2 and k == LEN:
                    rv = raw[x:y].decode()
                elif n == 3 and k == LEN:
                    token = raw[x:y].decode()
                elif n == 4 and k == VARINT:
                    remaining = x
    return ListPage(rv, token, remaining, items)


def split_frames(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete length-prefixed frames of a watch stream in ``data``, and the bytes of the next one."""
    frames: list[bytes] = []
    i, n = 0, len(data)
    while n - i >= 4:
        size = int.from_bytes(data[i : i + 4], "big")
        if n - i - 4 < size:
            break
        frames.append(data[i + 4 : i + 4 + size])
        i += 4 + size
    return frames, data[i:]


def watch_event(frame: bytes) -> tuple[str, bytes]:
    """A WatchEvent's type and its object's whole body (``k8s\\0`` + Unknown)."""
    event_type = ""
    obj = b""
    for number, kind, a, b in fields(frame):
        if kind != LEN:
            continue
        if number == 1:
            event_type = frame[a:b].decode()
        elif number == 2:
            for n, k, x, y in fields(frame, a, b):
                if n == 1 and k == LEN:
                    obj = frame[x:y]
    return event_type, obj


# --------------------------------------------------------------------- objects

# The selectable fields kube defines beyond metadata (its ``ToSelectableFields``), for the kinds the
# proxy knows them of (resources.py): each a path of field numbers and the value's type.
SELECTABLE: Mapping[tuple[str, str], Mapping[str, tuple[tuple[int, ...], str]]] = {
    ("", "Pod"): {
        "spec.nodeName": ((2, 10), "string"),
        "spec.restartPolicy": ((2, 3), "string"),
        "spec.schedulerName": ((2, 19), "string"),
        "spec.serviceAccountName": ((2, 8), "string"),
        "spec.hostNetwork": ((2, 11), "bool"),
        "status.phase": ((3, 1), "string"),
        "status.podIP": ((3, 6), "string"),
        "status.nominatedNodeName": ((3, 11), "string"),
    },
    ("", "Namespace"): {"status.phase": ((3, 1), "string")},
    ("", "Secret"): {"type": ((3,), "string")},
    ("", "Node"): {"spec.unschedulable": ((2, 4), "bool")},
    ("", "Service"): {"spec.clusterIP": ((2, 3), "string"), "spec.type": ((2, 4), "string")},
}


@dataclass(frozen=True, slots=True)
class ObjectAttributes:
    """What the cache keeps of an object besides its bytes (``CachedObject``'s attributes)."""

    name: str
    namespace: str
    resource_version: str
    labels: dict[str, str]
    fields: dict[str, str]


# A field tree: number → (a name to record it under, its type) or a subtree.
_Tree = dict[int, "tuple[str, str] | _Tree"]


@dataclass(frozen=True, slots=True)
class FieldTree:
    """Selectable fields as a tree of field numbers (each submessage walked once), with their zero values."""

    nodes: _Tree
    # A field absent from the wire has its zero value, as kube's decoder leaves it.
    zeros: Mapping[str, str]


def field_tree(selectable: Mapping[str, tuple[tuple[int, ...], str]]) -> FieldTree:
    tree: _Tree = {}
    zeros: dict[str, str] = {}
    for name, (path, kind) in selectable.items():
        node = tree
        for number in path[:-1]:
            child = node.setdefault(number, {})
            if not isinstance(child, dict):
                raise ValueError(f"{name}: field {number} is both a value and a message")
            node = child
        node[path[-1]] = (name, kind)
        zeros[name] = "false" if kind == "bool" else ""
    return FieldTree(tree, zeros)


def _select(buf: bytes, a: int, b: int, tree: _Tree, out: dict[str, str]) -> None:
    for number, kind, x, y in fields(buf, a, b):
        node = tree.get(number)
        if node is None:
            continue
        if isinstance(node, dict):
            if kind == LEN:
                _select(buf, x, y, node, out)
        elif node[1] == "bool":
            if kind == VARINT:
                out[node[0]] = "true" if x else "false"
        elif kind == LEN:
            out[node[0]] = buf[x:y].decode()


def _map_entry(buf: bytes, a: int, b: int) -> tuple[str, str]:
    """One entry of a ``map<string, string>`` field: its key (1) and value (2)."""
    key = value = ""
    for n, k, x, y in fields(buf, a, b):
        if k == LEN and n == 1:
            key = buf[x:y].decode()
        elif k == LEN and n == 2:
            value = buf[x:y].decode()
    return key, value


def read_object(raw: bytes, tree: FieldTree | None = None) -> ObjectAttributes:
    """Name, namespace, resourceVersion, labels and the fields of ``tree`` of one object's message."""
    name = namespace = rv = ""
    labels: dict[str, str] = {}
    selected = dict(tree.zeros) if tree is not None else {}
    nodes = tree.nodes if tree is not None else None
    for number, kind, a, b in fields(raw):
        if kind != LEN:
            continue
        if number == META:
            for n, k, x, y in fields(raw, a, b):
                if k != LEN:
                    continue
                if n == META_NAME:
                    name = raw[x:y].decode()
                elif n == META_NAMESPACE:
                    namespace = raw[x:y].decode()
                elif n == META_RESOURCE_VERSION:
                    rv = raw[x:y].decode()
                elif n == META_LABELS:
                    key, value = _map_entry(raw, x, y)
                    labels[key] = value
        elif nodes:
            node = nodes.get(number)
            if node is None:
                continue
            if isinstance(node, dict):
                _select(raw, a, b, node, selected)
            else:
                selected[node[0]] = raw[a:b].decode()
    return ObjectAttributes(name, namespace, rv, labels, selected)


def _meta_span(raw: bytes) -> tuple[int, int, int]:
    """Where field 1 (ObjectMeta) starts (its tag), and its payload's span."""
    i = 0
    for number, kind, a, b in fields(raw):
        if number == META and kind == LEN:
            return i, a, b
        i = b
    raise WireError("object has no metadata")


def with_meta(raw: bytes, meta: bytes) -> bytes:
    """``raw`` with its ObjectMeta replaced by ``meta`` (a message's bytes), the other fields as they were."""
    tag, _, b = _meta_span(raw)
    return raw[:tag] + delimited(META, len(meta)) + meta + raw[b:]


def without_meta(raw: bytes) -> tuple[bytes, bytes]:
    """The bytes before and after an object's ObjectMeta field: an empty object's are a bookmark's template."""
    tag, _, b = _meta_span(raw)
    return raw[:tag], raw[b:]


def with_resource_version(raw: bytes, rv: str) -> bytes:
    """``raw`` with ObjectMeta.resourceVersion set to ``rv``, every other byte as it was.

    kube writes the fields of a message in field order, always including a non-pointer string
    such as resourceVersion; so the object re-marshalled with another rv (what kube's cacher sends
    for a selector-leave DELETED: the previous state at the new rv) is this one splice.
    """
    _, a, b = _meta_span(raw)
    value = rv.encode()
    field = delimited(META_RESOURCE_VERSION, len(value)) + value
    start = end = -1
    i = a
    for number, _, _, y in fields(raw, a, b):
        if number == META_RESOURCE_VERSION:
            start, end = i, y
            break
        if number > META_RESOURCE_VERSION:
            start = end = i
            break
        i = y
    if start < 0:
        start = end = b
    meta = raw[a:start] + field + raw[end:b]
    return with_meta(raw, meta)


def bookmark_meta(raw: bytes) -> tuple[str, dict[str, str]]:
    """A bookmark object's resourceVersion and annotations (ObjectMeta field 12, a map)."""
    rv = ""
    annotations: dict[str, str] = {}
    _, a, b = _meta_span(raw)
    for n, k, x, y in fields(raw, a, b):
        if k != LEN:
            continue
        if n == META_RESOURCE_VERSION:
            rv = raw[x:y].decode()
        elif n == META_ANNOTATIONS:
            key, value = _map_entry(raw, x, y)
            annotations[key] = value
    return rv, annotations
