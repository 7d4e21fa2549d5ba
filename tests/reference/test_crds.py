"""The tier's CRD helper against the real apiserver: a CRD found terminating is waited for, then served.

``test_control_plane.py[certificate]`` once failed its setup with ``404 page not found`` creating a
Gizmo: ``[token]`` had just deleted the CRD, which was still terminating, and the setup took "exists
and lists" for "served". Here a custom resource with a finalizer holds the CRD's deletion open for as
long as the test wants, so the helper meets a terminating CRD every time.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from harness.kube.crds import CRDS, delete_crd, ensure_crd
from harness.kube.kit import Api, ApiError, KubeEnv, needs_kube

pytestmark = [pytest.mark.reference, needs_kube]

GROUP = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.crds.reference.watchcache.example.com"
CRD_NAME = f"sprockets.{GROUP}"
SPROCKETS = f"/apis/{GROUP}/v1/sprockets"


def sprocket_crd() -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"plural": "sprockets", "singular": "sprocket", "kind": "Sprocket", "listKind": "SprocketList"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}],
        },
    }


def sprocket(name: str, finalizers: list[str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "finalizers": finalizers or []}
    return {"apiVersion": f"{GROUP}/v1", "kind": "Sprocket", "metadata": meta}


@pytest.mark.timeout(300)
def test_a_crd_found_terminating_is_waited_for_then_created_and_served() -> None:
    kube = KubeEnv.from_environ()
    api = Api(kube.url, kube.token, kube.ca)
    try:
        ensure_crd(api, sprocket_crd())
        api.create(SPROCKETS, sprocket("held", ["example.com/hold"]))  # holds the CRD's deletion open
        api.delete(f"{CRDS}/{CRD_NAME}")
        assert api.get(f"{CRDS}/{CRD_NAME}")["metadata"].get("deletionTimestamp")  # terminating
        assert api.raw("GET", SPROCKETS)[0] == 200  # and still listed: "exists and lists" is not "served"

        done: list[float] = []
        errors: list[BaseException] = []

        def ensure() -> None:
            try:
                ensure_crd(Api(kube.url, kube.token, kube.ca), sprocket_crd())
                done.append(time.monotonic())
            except BaseException as e:  # reported by the test's thread
                errors.append(e)

        waiter = threading.Thread(target=ensure, daemon=True)
        waiter.start()
        waiter.join(3.0)
        assert not done and not errors, "ensure_crd returned while the CRD was terminating"
        released = time.monotonic()
        api.merge_patch(f"{SPROCKETS}/held", {"metadata": {"finalizers": None}})  # the deletion can end
        waiter.join(120.0)
        assert not errors, errors
        assert done and done[0] >= released
        # Served: the first create after it works (it was 404 page not found, or 405 while terminating).
        created = api.create(SPROCKETS, sprocket("after"))
        assert created["metadata"]["name"] == "after"
        assert not api.get(f"{CRDS}/{CRD_NAME}")["metadata"].get("deletionTimestamp")
    finally:
        try:  # a failed test may have left the finalizer that holds the deletion
            api.merge_patch(f"{SPROCKETS}/held", {"metadata": {"finalizers": None}})
        except ApiError as e:
            if e.status not in (404, 405):
                raise
        delete_crd(api, CRD_NAME)
        assert api.raw("GET", f"{CRDS}/{CRD_NAME}")[0] == 404  # nothing half-deleted left behind
        api.close()
