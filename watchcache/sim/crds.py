"""CustomResourceDefinitions in the simulated cluster (``watchcache sim --crds``), as apiextensions serves them.

A CRD created (or updated) is Established at once, with its names accepted as given, and every
served version becomes a resource of the cluster: stored, listed, watched, written and in
discovery like a built-in kind, as an unstructured object (its field selectors are name and
namespace). Deleting a CRD deletes its objects first (a DELETED event each, as kube's
``customresourcecleanup`` finalizer does), then the resource: its watches end and its paths
answer 404. A version no longer served goes the same way. What is not simulated: schemas and
validation, conversion (every version holds its own objects), subresources, and the journal
(``--state-file``: the cluster refuses the two together).
"""

from __future__ import annotations

from typing import Any

from watchcache.resources import ResourceType
from watchcache.upstream.discovery import resource_types_from_crd

CRDS = ResourceType(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    False,
    "customresourcedefinition",
    ("crd", "crds"),
    categories=("api-extensions",),
)


def crd_status(obj: dict[str, Any]) -> None:
    """What the apiextensions controllers write at once here: Established, names accepted, stored versions."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    versions = [v.get("name") for v in spec.get("versions") or () if isinstance(v, dict) and v.get("storage")]
    conditions = [
        {"type": t, "status": "True", "reason": r, "message": m}
        for t, r, m in (
            ("NamesAccepted", "NoConflicts", "no conflicts found"),
            ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        )
    ]
    obj["status"] = {"conditions": conditions, "acceptedNames": spec.get("names") or {}, "storedVersions": versions}


def served(crds: list[dict[str, Any]]) -> dict[tuple[str, str, str], ResourceType]:
    """The resources ``crds`` make the cluster serve, by (group, version, resource)."""
    out: dict[tuple[str, str, str], ResourceType] = {}
    for crd in crds:
        for t in resource_types_from_crd(crd):
            out[(t.group, t.version, t.resource)] = t
    return out
