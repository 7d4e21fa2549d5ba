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

kube makes a PartialObjectMetadata from its *internal* object, and two conversions to the
internal types move an annotation into a field: a DaemonSet's
``deprecated.daemonset.template.generation`` and a Deployment's (non-empty)
``deprecated.deployment.rollback.to``. Their metadata is written without them, as kube writes it
(the full objects keep them: converting back to apps/v1 restores them). A custom resource's
metadata, stored with sorted keys as kube writes unstructured objects, is written in ObjectMeta's
field order, as kube writes the typed ObjectMeta it converts it to.
"""

from __future__ import annotations

from typing import Any

import orjson

from watchcache.cache.object import CachedObject
from watchcache.kubeproto import wire
from watchcache.quoting import go_json_escape
from watchcache.resources import ResourceType

_LEADING = b'"metadata":'
_START = len(_LEADING)


# (group, kind) -> the annotation its conversion to kube's internal type moves into a field, and
# whether an empty value stays (a Deployment's rollback annotation moves only when non-empty).
_INTERNAL_ONLY = {
    ("apps", "DaemonSet"): ("deprecated.daemonset.template.generation", False),
    ("apps", "Deployment"): ("deprecated.deployment.rollback.to", True),
}


# ObjectMeta's fields in its Go struct's order, and those of the structs in it. A custom resource's
# metadata is stored as kube writes unstructured objects (sorted keys); its PartialObjectMetadata is
# the typed ObjectMeta kube converts that to, written in this order.
_OBJECT_META = (
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
    "ownerReferences", "finalizers", "managedFields",
)  # fmt: skip
_OWNER_REFERENCE = ("apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion")
_MANAGED_FIELDS_ENTRY = ("manager", "operation", "apiVersion", "time", "fieldsType", "fieldsV1", "subresource")


def _ordered(fields: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    out = {k: fields[k] for k in order if k in fields}
    out.update((k, v) for k, v in fields.items() if k not in out)  # (none that kube's schema keeps)
    return out


def _typed(meta: dict[str, Any]) -> dict[str, Any]:
    out = _ordered(meta, _OBJECT_META)
    for key, order in (("ownerReferences", _OWNER_REFERENCE), ("managedFields", _MANAGED_FIELDS_ENTRY)):
        items = out.get(key)
        if isinstance(items, list):
            out[key] = [_ordered(item, order) if isinstance(item, dict) else item for item in items]
    return out


def _metadata_of(
    obj: CachedObject, resource: ResourceType | None, decoded: dict[str, Any] | None = None
) -> dict[str, Any]:
    meta = (decoded if decoded is not None else orjson.loads(b"{" + obj.body)).get("metadata")
    if not isinstance(meta, dict):
        return {}
    if resource is not None and resource.custom:
        meta = _typed(meta)
    moved = _INTERNAL_ONLY.get((resource.group, resource.kind)) if resource is not None else None
    annotations = meta.get("annotations")
    if moved is not None and isinstance(annotations, dict) and moved[0] in annotations:
        key, keeps_empty = moved
        if not (keeps_empty and annotations[key] == ""):
            meta = dict(meta)  # ``decoded`` may be the caller's
            rest = {k: v for k, v in annotations.items() if k != key}
            if rest:
                meta["annotations"] = rest
            else:
                del meta["annotations"]
    return meta


def metadata_json(obj: CachedObject, resource: ResourceType | None = None) -> bytes:
    """The JSON of ``obj``'s metadata (an ObjectMeta), as kube writes it in a PartialObjectMetadata.

    ``resource``: the object's (None only where it is known to be neither of the kinds above)."""
    derived = obj.meta_json
    if derived is None:
        return derive_metadata_json(obj, resource)
    if isinstance(derived, int):
        return obj.body[_START:derived]
    return derived


def derive_metadata_json(
    obj: CachedObject, resource: ResourceType | None, decoded: dict[str, Any] | None = None
) -> bytes:
    """Derive (and keep) ``metadata_json``; ``decoded``: the object already parsed by the caller (a
    Table's row is derived from the same parse), else it is parsed here."""
    encoded = go_json_escape(orjson.dumps(_metadata_of(obj, resource, decoded)))
    end = _START + len(encoded)
    body = obj.body
    if body.startswith(_LEADING) and body[_START:end] == encoded:
        obj.meta_json = end
        return encoded
    obj.meta_json = encoded
    return encoded


def metadata_protobuf(obj: CachedObject, resource: ResourceType | None = None) -> bytes:
    """``obj``'s ObjectMeta in protobuf."""
    derived = obj.meta_pb
    if derived is None:
        derived = obj.meta_pb = wire.object_meta(_metadata_of(obj, resource))
    return derived
