"""An object's metadata, as PartialObjectMetadata clients receive it, derived once per object.

Metadata informers (kube-controller-manager's garbage collector, quota and namespace
controllers, many operators) read ``PartialObjectMetadata``: the object's ``metadata``
and nothing else. Both forms are derived on the first request that needs them and kept
on the ``CachedObject``, so every later LIST item, GET and watch frame reuses them:

* JSON: the ``metadata`` value is the first field of a cached body (kube writes ObjectMeta
  right after TypeMeta, which the cache strips), so only *where it ends* is stored, an int:
  no copy of the bytes is kept. A body whose metadata is not first keeps its own copy.
* protobuf: ObjectMeta's message bytes (``kubeproto.wire.object_meta``), stored — they
  cannot be a slice of the JSON. About the size of the JSON metadata, for objects some
  protobuf metadata client has asked for.

Deriving parses the object's JSON once (``orjson.loads``): paid per object on first use,
never per watcher or per request, and never by deployments without metadata clients
(invariant 5).
"""

from __future__ import annotations

from typing import Any

import orjson

from watchcache.cache.object import CachedObject
from watchcache.kubeproto import wire

_LEADING = b'"metadata":'
_START = len(_LEADING)


def _metadata_of(obj: CachedObject) -> dict[str, Any]:
    meta = orjson.loads(b"{" + obj.body).get("metadata")
    return meta if isinstance(meta, dict) else {}


def metadata_json(obj: CachedObject) -> bytes:
    """The JSON of ``obj``'s metadata (an ObjectMeta), as kube writes it in a PartialObjectMetadata."""
    derived = obj.meta_json
    if derived is None:
        encoded = orjson.dumps(_metadata_of(obj))
        end = _START + len(encoded)
        body = obj.body
        if body.startswith(_LEADING) and body[_START:end] == encoded:
            obj.meta_json = end
            return encoded
        obj.meta_json = encoded
        return encoded
    if isinstance(derived, int):
        return obj.body[_START:derived]
    return derived


def metadata_protobuf(obj: CachedObject) -> bytes:
    """``obj``'s ObjectMeta in protobuf."""
    derived = obj.meta_pb
    if derived is None:
        derived = obj.meta_pb = wire.object_meta(_metadata_of(obj))
    return derived
