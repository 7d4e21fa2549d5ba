"""PATCH bodies for the sim: JSON merge patch, JSON patch, and an approximation of strategic merge.

* ``application/merge-patch+json``: RFC 7386, below (maps merge, ``null`` deletes).
* ``application/json-patch+json``: RFC 6902 through the ``jsonpatch`` library; a patch
  that is malformed is a 400, one that does not apply (a failed ``test``, a missing
  path) a 422, as kube answers.
* ``application/strategic-merge-patch+json``: applied as a merge patch after removing
  the strategic directives (``$patch``, ``$retainKeys``, ``$setElementOrder/…``,
  ``$deleteFromPrimitiveList/…``); a map or list element carrying ``$patch: delete`` is
  deleted. Lists are therefore replaced whole rather than merged by their merge key
  (kube merges ``containers`` by name): enough for ``kubectl label/annotate/scale``
  and status patches, not for patching one container of many.
* ``application/apply-patch+yaml`` (server-side apply) and anything else: 415.
"""

from __future__ import annotations

from typing import Any

import jsonpatch
import jsonpointer
import orjson

from watchcache import apierrors
from watchcache.apierrors import StatusError

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
PATCH_TYPES = frozenset({MERGE_PATCH, JSON_PATCH, STRATEGIC_MERGE_PATCH})


def parse_patch(content_type: str, body: bytes) -> tuple[str, Any]:
    """The patch's media type and decoded document; 415 for an unsupported type, 400 for bad JSON."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type not in PATCH_TYPES:
        raise apierrors.unsupported_media_type(content_type)
    try:
        return media_type, orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise apierrors.bad_request(f"error decoding patch: {err}") from None


def apply_patch(media_type: str, document: Any, target: dict[str, Any]) -> dict[str, Any]:
    """Apply a parsed patch to ``target`` (which it may share structure with; pass a fresh decode)."""
    if media_type == JSON_PATCH:
        patched = _apply_json_patch(target, document)
    else:
        if media_type == STRATEGIC_MERGE_PATCH:
            document = strip_strategic_directives(document)
        if not isinstance(document, dict):
            raise apierrors.bad_request("invalid JSON document: a merge patch must be a JSON object")
        patched = merge_patch(target, document)
    if not isinstance(patched, dict):
        raise apierrors.bad_request("the patched document is not a JSON object")
    return patched


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strip_strategic_directives(patch: Any) -> Any:
    """Turn a strategic merge patch into the merge patch the sim applies (see the module docstring)."""
    if isinstance(patch, list):
        return [strip_strategic_directives(v) for v in patch if not _dropped_element(v)]
    if not isinstance(patch, dict):
        return patch
    if patch.get("$patch") == "delete":
        return None  # merge-patch null: delete the map
    return {k: strip_strategic_directives(v) for k, v in patch.items() if not k.startswith("$")}


def _dropped_element(value: Any) -> bool:
    """A list element that is only directives, or asks for its own deletion."""
    if not isinstance(value, dict) or not value:
        return False
    return value.get("$patch") == "delete" or all(k.startswith("$") for k in value)


def _apply_json_patch(target: dict[str, Any], document: Any) -> Any:
    if not isinstance(document, list) or not all(isinstance(op, dict) for op in document):
        raise apierrors.bad_request("json: cannot unmarshal patch: a JSON patch must be an array of operations")
    try:
        ops = jsonpatch.JsonPatch(document)
    except (jsonpatch.InvalidJsonPatch, jsonpointer.JsonPointerException) as err:
        raise apierrors.bad_request(str(err)) from None
    try:
        return ops.apply(target)
    except jsonpatch.InvalidJsonPatch as err:
        raise apierrors.bad_request(str(err)) from None
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, KeyError, IndexError, TypeError) as err:
        # kube answers a patch that does not apply with a bare 422.
        raise StatusError(422, "Invalid", str(err) or type(err).__name__) from None
