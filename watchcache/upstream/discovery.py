"""Which resources to cache, and what the upstream's discovery says about each.

``--resources pods,configmaps,apps/v1/deployments`` names them; discovery supplies the kind,
the scope and the verbs (a resource must support list and watch to be cached). Selectable
fields and the watcher trigger field come from the built-in table for the types kube
defines them for; other types (CRDs) select on metadata.name/namespace only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from watchcache.resources import BUILTIN, ResourceType
from watchcache.upstream.client import UpstreamClient, UpstreamError

log = logging.getLogger("watchcache.upstream.discovery")

# Secrets are left out until requests are authorised per user (docs/deploy.md).
DEFAULT_RESOURCES = (
    "pods",
    "nodes",
    "namespaces",
    "services",
    "configmaps",
    "serviceaccounts",
    "endpoints",
    "apps/v1/deployments",
    "apps/v1/replicasets",
    "apps/v1/statefulsets",
    "apps/v1/daemonsets",
    "discovery.k8s.io/v1/endpointslices",
)

_BUILTIN = {(t.group, t.version, t.resource): t for t in BUILTIN}


class ResourceResolutionError(ValueError):
    pass


def parse_resource_id(text: str) -> tuple[str, str, str]:
    """``pods`` → ("", "v1", "pods"); ``v1/pods``; ``apps/v1/deployments`` → ("apps", "v1", "deployments")."""
    parts = [p for p in text.strip().split("/") if p]
    if len(parts) == 1:
        return "", "v1", parts[0]
    if len(parts) == 2:
        return "", parts[0], parts[1]
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    raise ResourceResolutionError(
        f"cannot parse resource {text!r}: use RESOURCE, VERSION/RESOURCE or GROUP/VERSION/RESOURCE"
    )


def resource_type_from(group: str, version: str, entry: dict[str, Any]) -> ResourceType:
    known = _BUILTIN.get((group, version, entry["name"]))
    if known is not None and known.kind == entry.get("kind"):
        return known
    return ResourceType(
        group,
        version,
        entry["name"],
        entry["kind"],
        bool(entry.get("namespaced")),
        entry.get("singularName") or entry["kind"].lower(),
        tuple(entry.get("shortNames") or ()),
        categories=tuple(entry.get("categories") or ()),
        known_fields=False,
    )


@dataclass(frozen=True)
class Resolved:
    """What discovery said about the ids: the types to cache, and the ids skipped with why."""

    types: list[ResourceType]
    skipped: list[tuple[str, str]]


async def resolve(client: UpstreamClient, ids: Sequence[str], *, strict: bool) -> Resolved:
    """ResourceTypes for ``ids``; unknown or unwatchable ones raise if ``strict``, else are skipped
    (the caller says so: ``report_skipped``)."""
    documents: dict[tuple[str, str], dict[str, dict[str, Any]] | None] = {}
    out: list[ResourceType] = []
    skipped: list[tuple[str, str]] = []
    for text in ids:
        group, version, name = parse_resource_id(text)
        if (group, version) not in documents:
            path = f"/apis/{group}/{version}" if group else f"/api/{version}"
            try:
                doc = await client.get_json(path)
                documents[(group, version)] = {r["name"]: r for r in doc.get("resources", [])}
            except UpstreamError as e:
                if e.code != 404:
                    raise
                documents[(group, version)] = None
        entries = documents[(group, version)]
        entry = entries.get(name) if entries else None
        problem = None
        if entry is None:
            problem = f"the upstream does not serve {text}"
        elif not {"list", "watch"} <= set(entry.get("verbs") or ()):
            problem = f"{text} does not support list and watch"
        if problem:
            if strict:
                raise ResourceResolutionError(problem)
            skipped.append((text, problem))
            continue
        assert entry is not None
        out.append(resource_type_from(group, version, entry))
    return Resolved(out, skipped)


def report_skipped(skipped: Sequence[tuple[str, str]], *, requested: bool) -> None:
    """Say which resources are not cached, at the level an operator expects.

    Named in ``--resources``: a WARNING each (the flag asks for something the upstream does not
    serve: fix one or the other). Among the defaults: one INFO line — a cluster that does not serve
    one of them (a simulator, an apiserver with an API group turned off) is nothing to act on.
    """
    if not skipped:
        return
    if requested:
        for text, problem in skipped:
            log.warning("not caching %s (--resources): %s", text, problem)
        return
    log.info(
        "not caching %s: default resources the upstream does not serve (or not with list and watch)",
        ", ".join(text for text, _ in skipped),
    )


async def discover_all(client: UpstreamClient) -> list[ResourceType]:
    """Every list-watchable resource the upstream serves, each version of each group (kube's watch
    cache serves them all): ``/api``, ``/apis``, then each group version's resource list.

    Subresources (``pods/status``) are left out, as are resources without both list and watch. A
    group version that fails (an aggregated API that is down answers 503) is skipped with a log
    line: its kinds pass through, and the next discovery tries again.
    """
    versions: list[tuple[str, str]] = []
    try:
        core = await client.get_json("/api")
        groups = await client.get_json("/apis")
    except UpstreamError as e:
        if e.code != 404:
            raise  # retried by the caller
        log.info("the upstream serves no discovery index (%s): only --resources are cached", e)
        return []
    versions += [("", v) for v in core.get("versions") or ()]
    for group in groups.get("groups") or ():
        versions += [(group["name"], gv["version"]) for gv in group.get("versions") or ()]
    out: list[ResourceType] = []
    for group, version in versions:
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            doc = await client.get_json(path)
        except UpstreamError as e:
            log.info("discovery of %s: %s; its resources pass through", path, e)
            continue
        for entry in doc.get("resources") or ():
            if "/" in entry.get("name", "/") or not {"list", "watch"} <= set(entry.get("verbs") or ()):
                continue
            out.append(resource_type_from(group, version, entry))
    return out


def resource_types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The resources a CustomResourceDefinition (decoded JSON) makes the upstream serve: one per
    served version, once the CRD is Established (kube's apiextensions handler serves it from then on,
    also while it terminates: its instances' deletions are read as any change)."""
    conditions = (crd.get("status") or {}).get("conditions") or ()
    if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
        return []
    spec = crd.get("spec") or {}
    # The names kube serves under: the accepted ones (a name another CRD holds is not accepted).
    names = (crd.get("status") or {}).get("acceptedNames") or spec.get("names") or {}
    group, plural, kind = spec.get("group") or "", names.get("plural") or "", names.get("kind") or ""
    if not (group and plural and kind):
        return []
    entry = {
        "name": plural,
        "kind": kind,
        "namespaced": spec.get("scope") == "Namespaced",
        "singularName": names.get("singular") or kind.lower(),
        "shortNames": names.get("shortNames") or (),
        "categories": names.get("categories") or (),
    }
    return [resource_type_from(group, v["name"], entry) for v in spec.get("versions") or () if v.get("served")]
