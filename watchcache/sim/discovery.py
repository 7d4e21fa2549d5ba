"""Discovery documents (``/api``, ``/apis``, ``/api/v1``, ``/apis/G/V``, ``/version``) from the registry.

kubectl and client-go need them before any request. They are built once per server
(the registry is fixed) and served as bytes.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from watchcache.resources import ResourceRegistry, ResourceType

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-watchcache",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _resource_entry(t: ResourceType, verbs: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": t.resource,
        "singularName": t.singular,
        "namespaced": t.namespaced,
        "kind": t.kind,
        "verbs": verbs,
    }
    if t.short_names:
        entry["shortNames"] = list(t.short_names)
    if t.categories:
        entry["categories"] = list(t.categories)
    return entry


class Discovery:
    def __init__(self, registry: ResourceRegistry, verbs: list[str] = VERBS) -> None:
        self.documents: dict[str, bytes] = {}
        groups = registry.group_versions()
        self.documents["/api"] = orjson.dumps(
            {
                "kind": "APIVersions",
                "versions": groups.get("", ["v1"]),
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
            }
        )
        group_docs = []
        for group, versions in groups.items():
            if not group:
                continue
            gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
            doc = {"name": group, "versions": gvs, "preferredVersion": gvs[0]}
            group_docs.append(doc)
            self.documents[f"/apis/{group}"] = orjson.dumps({"kind": "APIGroup", "apiVersion": "v1", **doc})
        self.documents["/apis"] = orjson.dumps({"kind": "APIGroupList", "apiVersion": "v1", "groups": group_docs})
        for group, versions in groups.items():
            for version in versions:
                gv = f"{group}/{version}" if group else version
                path = f"/apis/{gv}" if group else f"/api/{version}"
                resources = [_resource_entry(t, verbs) for t in registry.in_group_version(group, version)]
                self.documents[path] = orjson.dumps(
                    {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
                )
        self.documents["/version"] = orjson.dumps(VERSION_INFO)
        self._add_openapi_v3(registry, groups)

    def _add_openapi_v3(self, registry: ResourceRegistry, groups: dict[str, list[str]]) -> None:
        """A minimal OpenAPI v3: enough for kubectl to see that writes take ``fieldValidation``.

        kubectl validates objects it creates either on the server (if the PATCH operation
        of the kind lists the ``fieldValidation`` parameter) or on the client (needs the
        full schemas). Declaring the parameter lets ``kubectl create -f`` work; schemas
        for ``kubectl apply``'s strategic merge come from the real upstream through the proxy.
        """
        index: dict[str, Any] = {}
        for group, versions in groups.items():
            for version in versions:
                gv_path = f"apis/{group}/{version}" if group else f"api/{version}"
                paths: dict[str, Any] = {}
                for t in registry.in_group_version(group, version):
                    gvk = {"group": group, "version": version, "kind": t.kind}
                    scope = "/namespaces/{namespace}" if t.namespaced else ""
                    paths[f"/{gv_path}{scope}/{t.resource}/{{name}}"] = {
                        "patch": {
                            "x-kubernetes-group-version-kind": gvk,
                            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                            "responses": {"200": {"description": "OK"}},
                        }
                    }
                doc = {
                    "openapi": "3.0.0",
                    "info": {"title": "Kubernetes", "version": VERSION_INFO["gitVersion"]},
                    "paths": paths,
                }
                body = orjson.dumps(doc)
                self.documents[f"/openapi/v3/{gv_path}"] = body
                index[gv_path] = {
                    "serverRelativeURL": f"/openapi/v3/{gv_path}?hash={hashlib.sha256(body).hexdigest()[:32].upper()}"
                }
        self.documents["/openapi/v3"] = orjson.dumps({"paths": index})

    def get(self, path: str) -> bytes | None:
        return self.documents.get(path.rstrip("/") or "/")
