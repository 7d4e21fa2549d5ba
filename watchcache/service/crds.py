"""Custom resources follow their CRDs live: created, changed and deleted without a restart.

The proxy caches the CustomResourceDefinitions themselves from the start (on demand's machinery,
never idle: ``Why.CRDS``) and, each tick, when that cache has moved, derives from every CRD the
resources it makes the upstream serve (``resource_types_from_crd``: one per served version, once
Established) and brings the registry to that set:

- a CRD created after start: its kinds are registered, so their first read starts their cache;
- a CRD deleted (gone from the upstream, after its instances were deleted and their DELETED events
  delivered), or a version no longer served: the kind's cache stops, its watches end (kube stops its
  cacher and ends them likewise) and the kind is unregistered: its reads pass through (kube's 404);
- a kind that changed (scope, kind name, short names): its cache stops and starts again at its next
  read with the new type. Printer columns are read from the CRD cache at each Table
  (``server/tables.py``) and a CRD's ``selectableFields`` are the upstream's to apply (a custom
  resource's field selector passes through), so both follow without anything here.

Every worker does this with its own copy of the CRDs (the owner's cache, or its follower), so each
drops its own caches. Aggregated APIs (APIService) are not CRDs: their kinds are those discovery
found at start.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from watchcache.dispatch.lifecycle import GVR, CachePolicy, Why
from watchcache.resources import ResourceRegistry, ResourceType
from watchcache.service.ondemand import OnDemandCaches
from watchcache.upstream.discovery import resource_types_from_crd
from watchcache.watchers.watcher import CloseReason

log = logging.getLogger("watchcache.crds")

CRDS: GVR = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")


class CustomResources:
    """Keeps the registry's custom resources equal to what the upstream's CRDs define (module doc)."""

    def __init__(self, ondemand: OnDemandCaches) -> None:
        self.ondemand = ondemand
        self.ctx = ondemand.ctx
        # The kinds CRDs defined at the last sync (only these may be removed: an aggregated API's
        # kinds have no CRD).
        self.known: dict[GVR, ResourceType] = {}
        # (cache, rv, events at rv) of the CRD cache at the last sync.
        self._seen: tuple[object, int, int] | None = None
        self.added = 0
        self.removed = 0
        self.changed = 0

    def housekeeping(self) -> None:
        """Each tick: start following the CRDs if need be, and sync if they changed."""
        if not self.ctx.discovered:
            return
        registry = self.ctx.registry
        crds = registry.get(*CRDS)
        if crds is None or self.ondemand.policy.refusal(crds) is not None:
            return
        cacher = self.ondemand.pin(crds, Why.CRDS)
        if cacher is None or not cacher.ready:
            return
        version = (cacher, cacher.rv, len(cacher.cache))
        if version == self._seen:
            return
        self._seen = version
        objects = [orjson.loads(b"{" + o.body) for o in cacher.cache.snapshot().iter_range("", None)]
        self.sync(registry, objects)

    def sync(self, registry: ResourceRegistry, crds: list[dict[str, Any]]) -> None:
        """Bring ``registry`` to the kinds ``crds`` define (see the module doc)."""
        desired: dict[GVR, ResourceType] = {}
        for crd in crds:
            for t in resource_types_from_crd(crd):
                desired[CachePolicy.gvr(t)] = t
        for gvr, old in self.known.items():
            if gvr not in desired:
                self._stop(old, "its CRD was deleted or no longer serves this version")
                registry.remove(old)
                self.removed += 1
        for gvr, new in desired.items():
            current = registry.get(*gvr)
            if current == new:
                continue
            if current is not None:
                self._stop(current, "its CRD changed")
                self.changed += 1
            else:
                self.added += 1
                log.info("custom resource %s: served by the upstream, cached from its first read", new.path_id())
            registry.add(new)
        self.known = desired

    def _stop(self, resource: ResourceType, why: str) -> None:
        """End the cache of ``resource`` here and its watches, as kube ends them when a CRD goes."""
        if self.ondemand.drop(resource, "crd", why):
            return
        cacher = self.ctx.cachers.get(resource)  # cached from the start (--resources): watches end
        if cacher is not None:
            for watcher in list(cacher.dispatcher.watchers()):
                watcher.close(CloseReason.CACHE_STOPPED)
            log.info("custom resource %s: %s; its watches ended", resource.path_id(), why)
