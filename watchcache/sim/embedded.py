"""The simulated cluster as an upstream, in-process.

``SimUpstream`` is what ``watchcache sim`` serves from: its own storage *is* the cache,
and it answers what a cache does not (discovery, writes) itself. ``EmbeddedUpstream`` is
what ``watchcache serve`` uses when no apiserver is configured: a simulated cluster in
the same process feeding the proxy's own caches through exactly the ordered stream a
reflector produces (``replace`` once, then ``apply`` per commit and ``progress`` for every
other resource), so the proxy path is exercised without a network hop.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AbstractContextManager

import orjson

from watchcache import apierrors
from watchcache.auth.authn import ANONYMOUS
from watchcache.auth.gate import Gate
from watchcache.cache.object import CachedObject
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.freshness import Reached
from watchcache.http.request import Request
from watchcache.http.response import Response
from watchcache.http.routing import RequestInfo
from watchcache.resources import ResourceType
from watchcache.sim import podlogs, streams
from watchcache.sim.auth import REVIEW_PATHS, SELF_SUBJECT_REVIEW_PATH, handle_review, self_subject_review
from watchcache.sim.cluster import SimCluster
from watchcache.sim.commands import PodFiles
from watchcache.sim.discovery import Discovery
from watchcache.sim.faults import FaultInjector
from watchcache.sim.policy import Policy
from watchcache.sim.writes import handle_write
from watchcache.watchers.watcher import CloseReason

_WRITES = frozenset({"create", "update", "patch", "delete"})


class SimUpstream:
    # The cluster's history is its caches' own: an rv older than their window is compacted.
    answers_old_reads = False
    # Its rv is this cache's own upstream: a read ahead of the cache is ahead of the cluster.
    answers_reads_ahead = False
    # A consistent GET is the cluster's own state: served from its cache like any read.
    delegates_consistent_gets = False

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.discovery = Discovery(cluster.registry)
        self._discovered = cluster.registry_version
        # Set by ``watchcache sim`` (not by the embedded mode): POST /sim/faults.
        self.faults: FaultInjector | None = None
        # With a policy file: TokenReview and SubjectAccessReview, as an apiserver answers them,
        # and the policy enforced on writes too (the read path has its own gate).
        self.policy: Policy | None = None
        self.gate: Gate | None = None
        # What ``kubectl cp`` wrote into the pods (exec sessions run tar on it).
        self.files = PodFiles()

    def send_early(self, request: Request) -> None:
        """Never called: every GET is the cluster's own to answer (``delegates_consistent_gets``)."""
        return None

    # freshness.Progress: writes apply to the caches synchronously and every commit advances
    # every cache's rv, so a cache is always at the cluster's rv and a later rv comes by waiting.
    async def current_rv(self, cacher: Cacher, timeout: float) -> int:
        return self.cluster.rv

    def proving(self, cacher: Cacher) -> AbstractContextManager[asyncio.Future[None] | None]:
        return contextlib.nullcontext()

    def unprovable(self, cacher: Cacher) -> bool:
        return False

    async def prove_scope(self, cacher: Cacher, namespace: str | None, timeout: float) -> Reached:
        return Reached.AT_ONCE

    async def forward(self, request: Request, response: Response, info: RequestInfo | None) -> None:
        if request.method == "POST" and request.path in REVIEW_PATHS and self.policy is not None:
            status, body = handle_review(self.policy, request.path, request.body)
            response.send(status, body)
            return
        if request.method == "POST" and request.path == SELF_SUBJECT_REVIEW_PATH:
            user = await self.gate.authenticate(request, request.peercert) if self.gate is not None else ANONYMOUS
            response.send(201, self_subject_review(user))
            return
        if request.path == "/sim/compact" and request.method == "POST":
            response.send(200, orjson.dumps({"resourceVersion": str(self.compact())}))
            return
        if request.path == "/sim/faults" and self.faults is not None:
            if request.method == "POST":
                response.send(200, self.faults.apply(request.body))
            elif request.method == "DELETE":
                self.faults.clear()
                response.send(200, b"{}")
            else:
                raise apierrors.StatusError(405, "MethodNotAllowed", "POST or DELETE /sim/faults")
            return
        if info is None or not info.canonical:  # (a path kube's mux does not route: its 404 below)
            if self.gate is not None:  # as an apiserver: discovery is authenticated and authorized too
                await self.gate.check_path(request, peercert=request.peercert)
            if self._discovered != self.cluster.registry_version:  # a CRD came or went (sim/crds.py)
                self.discovery = Discovery(self.cluster.registry)
                self._discovered = self.cluster.registry_version
            doc = self.discovery.get(request.path)
            if doc is None:
                raise apierrors.path_not_found()
            if request.method not in ("GET", "HEAD"):
                message = f"the server does not allow this method on the requested resource ({request.method})"
                raise apierrors.StatusError(405, "MethodNotAllowed", message)
            response.send(200, doc)
            return
        resource = self.cluster.registry.get(info.group, info.version, info.resource)
        if resource is None or (info.namespace and not resource.namespaced):
            raise apierrors.path_not_found()
        if resource.group == "" and resource.resource == "pods" and info.subresource in streams.SUBRESOURCES:
            await self._stream(request, response, info, resource)
            return
        if resource.group == "" and resource.resource == "pods" and info.subresource == "log":
            await self._log(request, response, info, resource)
            return
        if info.verb not in _WRITES or info.subresource:
            raise apierrors.method_not_supported(resource.group, resource.resource, info.verb)
        if self.gate is not None:
            await self.gate.check(request, info, peercert=request.peercert)
        content_type = request.headers.get("content-type", "application/json")
        status, body = handle_write(
            self.cluster, request.method, resource, info.namespace, info.name, content_type, request.body
        )
        response.send(status, body)

    async def _stream(self, request: Request, response: Response, info: RequestInfo, pods: ResourceType) -> None:
        """exec, attach, port-forward: what the pod's kubelet would serve behind kube-apiserver."""
        if request.method not in ("GET", "POST"):
            raise apierrors.method_not_supported(pods.group, f"pods/{info.subresource}", info.verb)
        if self.gate is not None:
            await self.gate.check(request, info, peercert=request.peercert)
        obj = self.cluster.get(pods, info.namespace, info.name)
        if obj is None:
            raise apierrors.not_found(pods.group, pods.resource, info.name)
        await streams.serve(self.files, request, response, info, orjson.loads(b"{" + obj.body))

    async def _log(self, request: Request, response: Response, info: RequestInfo, pods: ResourceType) -> None:
        """``kubectl logs``: kube's validation, then what a cluster whose kubelets are unreachable answers."""
        if info.verb != "get":
            raise apierrors.method_not_supported(pods.group, "pods/log", info.verb)
        if self.gate is not None:
            await self.gate.check(request, info, peercert=request.peercert)
        obj = self.cluster.get(pods, info.namespace, info.name)
        if obj is None:
            raise apierrors.not_found(pods.group, pods.resource, info.name)
        pod = orjson.loads(b"{" + obj.body)
        nodes = self.cluster.registry.get("", "v1", "nodes")
        node_name = (pod.get("spec") or {}).get("nodeName") or ""
        node = self.cluster.get(nodes, "", node_name) if nodes is not None and node_name else None
        status = podlogs.answer(pod, request.query_value("container"), orjson.loads(b"{" + node.body) if node else None)
        response.send(status, b"")

    def compact(self) -> int:
        """Compact every resource's history to now and end every watch, as an etcd compaction
        followed by an apiserver restart would: clients resuming from an older rv get 410."""
        rv = self.cluster.compact()
        for cacher in self.cluster.cachers.values():
            for watcher in list(cacher.dispatcher.watchers()):
                watcher.close(CloseReason.SHUTDOWN)
        return rv


class EmbeddedUpstream(SimUpstream):
    def __init__(self, cluster: SimCluster, cachers: dict[ResourceType, Cacher]) -> None:
        super().__init__(cluster)
        self.cachers = cachers
        for resource, cacher in cachers.items():
            source = cluster.cachers[resource].cache
            cacher.replace(list(source.snapshot().iter_range("", None)), cluster.rv)
        cluster.subscribe(self._on_commit)

    def _on_commit(self, resource: ResourceType, changes: list[tuple[str, CachedObject]], rv: int) -> None:
        for other, cacher in self.cachers.items():
            if other is resource:
                cacher.apply(changes)
            else:
                cacher.progress(rv)
