"""A test's CustomResourceDefinition on the shared apiserver: created when it is served, deleted when it is gone.

A CRD's deletion is not instant: the apiserver marks it Terminating, deletes its custom resources
(the ``customresourcecleanup`` finalizer), and only then removes it and stops serving its resource.
Meanwhile ``GET`` of the CRD answers 200 and a LIST of its resource still answers 200, so "exists and
lists" is not "served": a module that found the CRD of a module before it (or of a run before it)
still terminating went on, and its first create got ``404 page not found`` once the deletion ended
(``test_control_plane.py[certificate]``, after ``[token]`` deleted the Gizmo CRD). So a test waits
for a deletion it finds to end before it creates, waits until the new CRD is Established and its
resource is in discovery and answers a LIST, and waits for its own deletion to end, leaving nothing
half-deleted behind it.
"""

from __future__ import annotations

import json
from typing import Any

from harness.kube.kit import Api, ApiError, wait_for

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
# A deletion removes every custom resource of the CRD first; the tests' CRDs hold a few dozen.
DELETION_TIMEOUT = 120.0
SERVED_TIMEOUT = 60.0


def ensure_crd(api: Api, crd: dict[str, Any]) -> None:
    """``crd`` created (after a deletion of it still under way has ended) and served: Established,
    NamesAccepted, its resource listed by discovery and a LIST of it answered."""
    name = crd["metadata"]["name"]
    current = _get(api, name)
    if current is not None and current["metadata"].get("deletionTimestamp"):
        wait_gone(api, name)
        current = None
    if current is None:
        try:
            api.create(CRDS, {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", **crd})
        except ApiError as e:
            if e.status != 409:  # created meanwhile by another worker of this run
                raise
    spec = crd["spec"]
    group, plural = spec["group"], spec["names"]["plural"]
    version = next(v["name"] for v in spec["versions"] if v.get("served"))
    wait_for(lambda: _served(api, name, group, version, plural), SERVED_TIMEOUT, f"the CRD {name} served")


def delete_crd(api: Api, name: str) -> None:
    """Delete the CRD ``name`` and wait until it is gone (its custom resources with it)."""
    api.delete(f"{CRDS}/{name}")
    wait_gone(api, name)


def wait_gone(api: Api, name: str) -> None:
    wait_for(lambda: _get(api, name) is None, DELETION_TIMEOUT, f"the CRD {name} deleted")


def _get(api: Api, name: str) -> dict[str, Any] | None:
    try:
        crd: dict[str, Any] = api.get(f"{CRDS}/{name}")
    except ApiError as e:
        if e.status == 404:
            return None
        raise
    return crd


def _served(api: Api, name: str, group: str, version: str, plural: str) -> bool:
    crd = _get(api, name)
    if crd is None or crd["metadata"].get("deletionTimestamp"):
        return False
    conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
    if conditions.get("Established") != "True" or conditions.get("NamesAccepted") != "True":
        return False
    status, _, body = api.raw("GET", f"/apis/{group}/{version}")
    if status != 200 or not any(r.get("name") == plural for r in _json(body).get("resources") or []):
        return False
    return api.raw("GET", f"/apis/{group}/{version}/{plural}?limit=1")[0] == 200  # across namespaces


def _json(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
