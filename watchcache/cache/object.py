"""The cached object: JSON bytes encoded once, plus the attributes filters need (invariant 5).

An object enters the cache exactly once (from the reflector, the simulated cluster or
a follower stream); its JSON is encoded then and shared by every LIST page, GET and
watch frame afterwards. The attributes selectors look at (namespace, name, labels,
selectable fields) are extracted at the same moment, so filtering never parses JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from watchcache.quoting import go_json_escape
from watchcache.resources import ResourceType


class CachedObject:
    """Immutable by convention: shared by the current state, history and in-flight responses.

    ``body`` is the object's JSON *without* its opening ``{`` and without ``kind`` and
    ``apiVersion``: a LIST item is ``b"{" + body`` (kube omits TypeMeta on list items)
    and a typed object is ``resource.typed_prefix + body`` — both written as separate
    buffers, never joined.
    """

    __slots__ = (
        "body",
        "fields",
        "key",
        "labels",
        "meta_json",
        "meta_pb",
        "name",
        "namespace",
        "rv",
        "table_row",
        "uid_hash",
    )

    def __init__(
        self,
        key: str,
        namespace: str,
        name: str,
        rv: int,
        labels: Mapping[str, str],
        fields: Mapping[str, str],
        body: bytes,
    ) -> None:
        self.key = key
        self.namespace = namespace
        self.name = name
        self.rv = rv
        self.labels = labels
        self.fields = fields
        self.body = body
        # Derived on first use by cache/metadata.py, once per object: where the metadata ends in
        # ``body`` (or its own JSON, if it is not body's first field), and its protobuf ObjectMeta.
        self.meta_json: int | bytes | None = None
        self.meta_pb: bytes | None = None
        # Derived on first use by printers/row.py: (printer, its row of this object) for Tables.
        self.table_row: tuple[object, Any] | None = None
        # Derived on first use by cache/shardhash.py: metadata.uid's FNV-1a hash, for shardSelectors.
        self.uid_hash: int | None = None

    def __repr__(self) -> str:
        return f"CachedObject({self.key!r}, rv={self.rv})"

    def typed_json(self, resource: ResourceType) -> bytes:
        """The full typed object; for tests and cold paths (hot paths use writelines)."""
        return resource.typed_prefix + self.body

    def decode(self) -> dict[str, Any]:
        """Parse the object back (cold paths only: writes in the simulated cluster, tests)."""
        decoded: dict[str, Any] = orjson.loads(b"{" + self.body)
        return decoded

    def with_resource_version(self, rv: int) -> CachedObject:
        """The same object stamped with another resourceVersion (a selector-leave DELETED)."""
        obj = self.decode()
        obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
        out = CachedObject(self.key, self.namespace, self.name, rv, self.labels, self.fields, _encode_body(obj))
        out.uid_hash = self.uid_hash
        return out


def object_key(namespace: str, name: str) -> str:
    """``namespace/name`` (or ``name``): sorts like kube's etcd keys, so lists come out in kube's order."""
    return f"{namespace}/{name}" if namespace else name


def _encode_body(obj: Mapping[str, Any]) -> bytes:
    """The body as kube's encoder writes it (Go escapes ``<``, ``>``, ``&``; orjson does not)."""
    encoded = go_json_escape(orjson.dumps(obj))
    if encoded == b"{}":
        raise ValueError("object has no fields")
    return encoded[1:]


class ObjectError(ValueError):
    """The object cannot be cached (no name, or a resourceVersion that is not a uint64)."""


def encode_object(resource: ResourceType, obj: dict[str, Any], body: bytes | None = None) -> CachedObject:
    """Encode ``obj`` once and extract its filter attributes. Mutates ``obj`` (drops TypeMeta).

    ``body``: the object's JSON as the upstream sent it, already cut to the cache's form
    (``body_in_event``); then ``obj`` is not encoded again.
    """
    obj.pop("kind", None)
    obj.pop("apiVersion", None)
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise ObjectError("object has no metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("object has no metadata.name")
    namespace = (meta.get("namespace") or "") if resource.namespaced else ""
    if not isinstance(namespace, str) or (resource.namespaced and not namespace):
        raise ObjectError("namespaced object has no metadata.namespace")
    rv = parse_resource_version(meta.get("resourceVersion"))
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        raise ObjectError("metadata.labels is not a map")
    fields = resource.extract_fields(obj)
    if body is None:
        body = _encode_body(obj)
    return CachedObject(object_key(namespace, name), namespace, name, rv, labels, fields, body)


_EVENT_HEADS = {t: b'{"type":"' + t.encode() + b'","object":' for t in ("ADDED", "MODIFIED", "DELETED")}


def body_in_event(resource: ResourceType, line: bytes, event_type: str, keys: int) -> bytes | None:
    """The object's body cut out of one JSON watch event line, or None if the line is not in the expected form.

    The upstream already encoded the object: re-encoding what was just parsed cost ~4 µs per
    3 KB pod, and its bytes are the ones kube-apiserver itself serves. The line must be
    ``{"type":"T","object":`` + the typed object + ``}``, with exactly those two keys
    (``keys``, counted by the caller's parse of the same line, so the line is valid JSON), and
    the object must start with its TypeMeta, in kube's order for built-in types or the sorted
    order of unstructured objects; anything else (None) is encoded from the parse instead.
    """
    head = _EVENT_HEADS.get(event_type)
    if head is None or keys != 2 or not line.startswith(head) or not line.endswith(b"}}"):
        return None
    start = len(head)
    for prefix in resource.object_prefixes:
        if line.startswith(prefix, start):
            body = line[start + len(prefix) : -1]
            return body if body != b"}" else None
    return None


def parse_resource_version(value: object) -> int:
    """Upstream resourceVersions are etcd revisions: decimal uint64 strings, as kube's versioner parses them."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise ObjectError(f"invalid resourceVersion {value!r}")
