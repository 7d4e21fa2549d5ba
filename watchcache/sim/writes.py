"""The sim's write endpoint, independent of HTTP: method + path parts + body in, status + JSON out.

The server routes POST/PUT/PATCH/DELETE on a resource path here; reads never come
here (they go through the shared read path). Errors are raised as ``StatusError``
so the server renders them like any other API error.
"""

from __future__ import annotations

from typing import Any

import orjson

from watchcache import apierrors
from watchcache.resources import ResourceType
from watchcache.sim.cluster import SimCluster

_JSON_TYPES = frozenset({"", "application/json"})
_COLLECTION_ACTIONS = {"PUT": "update", "PATCH": "patch", "DELETE": "deletecollection"}


def handle_write(
    cluster: SimCluster,
    method: str,
    resource: ResourceType,
    namespace: str,
    name: str,
    content_type: str,
    body: bytes,
) -> tuple[int, bytes]:
    """Apply one write; returns (201 for a create else 200, the typed object as JSON)."""
    method = method.upper()
    if method == "POST":
        if name:
            raise apierrors.method_not_supported(resource.group, resource.resource, "create")
        _require_json(content_type)
        if resource.namespaced and not namespace:
            # kube serves no create on the all-namespaces path of a namespaced resource.
            raise apierrors.method_not_supported(resource.group, resource.resource, "create")
        cached = cluster.create(resource, namespace, _decode_object(resource.kind, body))
        return 201, resource.typed_prefix + cached.body
    if method not in _COLLECTION_ACTIONS:
        raise apierrors.method_not_supported(resource.group, resource.resource, method.lower())
    if not name:
        raise apierrors.method_not_supported(resource.group, resource.resource, _COLLECTION_ACTIONS[method])
    if method == "PUT":
        _require_json(content_type)
        cached = cluster.update(resource, namespace, name, _decode_object(resource.kind, body))
    elif method == "PATCH":
        cached = cluster.patch(resource, namespace, name, content_type, body)
    else:
        _check_delete_preconditions(cluster, resource, namespace, name, body)
        cached = cluster.delete(resource, namespace, name)
    return 200, resource.typed_prefix + cached.body


def _require_json(content_type: str) -> None:
    """The sim speaks JSON only (kube also takes YAML and protobuf); no Content-Type means JSON, as in kube."""
    if content_type.split(";", 1)[0].strip().lower() not in _JSON_TYPES:
        raise apierrors.unsupported_media_type(content_type)


def _decode_object(kind: str, body: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise apierrors.bad_request(
            f"the object provided is unrecognized (must be of type {kind}): "
            f"couldn't get version/kind; json parse error: {err}"
        ) from None
    if not isinstance(obj, dict):
        raise apierrors.bad_request(
            f"the object provided is unrecognized (must be of type {kind}): "
            f"couldn't get version/kind; json parse error: expected a JSON object"
        )
    return obj


def _check_delete_preconditions(
    cluster: SimCluster, resource: ResourceType, namespace: str, name: str, body: bytes
) -> None:
    """DeleteOptions.preconditions (uid, resourceVersion): 409 if the stored object no longer matches."""
    if not body.strip():
        return
    options = _decode_object("DeleteOptions", body)
    preconditions = options.get("preconditions")
    if not isinstance(preconditions, dict):
        return
    current = cluster.get(resource, namespace, name)
    if current is None:
        return  # delete() reports the 404
    meta = current.decode()["metadata"]
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        wanted = preconditions.get(field)
        if wanted is not None and wanted != meta.get(field):
            raise apierrors.conflict(
                resource.group,
                resource.resource,
                name,
                f"Precondition failed: {label} in precondition: {wanted}, {label} in object meta: {meta.get(field)}",
            )
