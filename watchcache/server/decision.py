"""Who answers a request: the cache, in which representation, or the upstream, and why.

A request is served from the cache when it is a get/list/watch of a cached resource (no
subresource, no impersonation the gate cannot resolve) and the representation kube-apiserver
would choose for its Accept header is one the cache writes (``server/negotiation.py``). The
decision per (Accept, verb, group) is memoized: headers are few and repeated. What a cached read
then waits for is ``dispatch/reads.py``'s to decide.
"""

from __future__ import annotations

from watchcache.cache.encoding import Encoding
from watchcache.http.request import Request
from watchcache.http.routing import RequestInfo
from watchcache.resources import ResourceType
from watchcache.server.context import ApiContext
from watchcache.server.negotiation import Endpoint, NotAcceptable, PassReason, ProtobufRequest, TableRequest, choose

_READ_VERBS = frozenset({"get", "list", "watch"})
_NEGOTIATED_MAX = 1024

Decision = Encoding | TableRequest | ProtobufRequest | PassReason


def _impersonating(headers: dict[str, str]) -> bool:
    """An ``Impersonate-*`` header among the request's (lower-case names, none with a line feed): one
    search of the names joined, not a generator per name, for every request."""
    return "\nimpersonate-" in "\n" + "\n".join(headers)


class Decisions:
    """The decisions of one handler: its endpoint's negotiation, memoized (bounded whatever headers clients invent)."""

    def __init__(self, ctx: ApiContext, endpoint: Endpoint, *, forward_upgrades: bool) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        # True in front of a real apiserver: every upgrade request is the upstream's to answer
        # (a tunnel, or kube's own answer), even on a path the cache serves.
        self.forward_upgrades = forward_upgrades
        # (accept, verb, group) -> decision.
        self._negotiated: dict[tuple[str | None, str, str], Decision] = {}

    def decide(self, request: Request, info: RequestInfo) -> Decision | NotAcceptable:
        """How the cache answers this request (an encoding), why it does not, or kube's 406 for it."""
        if request.upgrade is not None and self.forward_upgrades:
            return PassReason.UPGRADE
        if not info.canonical or (not request.query_utf8 and self.endpoint.passes_through):
            # A target the cache would read otherwise than kube (``http/routing.py``, ``parse_query``):
            # the upstream's answer is kube's, byte for byte. The simulated cluster, the upstream itself,
            # reads a query that is not UTF-8 with U+FFFD (its answer is the nearest it has).
            return PassReason.NON_CANONICAL
        if not info.is_resource_request:
            return PassReason.NON_RESOURCE
        gate = self.ctx.gate
        if (gate is None or not gate.resolves_impersonation) and _impersonating(request.headers):
            # kubectl --as: the upstream decides what the impersonated user sees (unless this
            # server is the upstream: the simulated cluster's gate resolves impersonation itself).
            return PassReason.IMPERSONATION
        if info.verb not in _READ_VERBS:
            return PassReason.WRITE
        if info.subresource:
            return PassReason.SUBRESOURCE
        resource = self.ctx.registry.get(info.group, info.version, info.resource)
        if resource is None or (
            resource not in self.ctx.cachers and (self.ctx.on_demand is None or self.ctx.never_cached(resource))
        ):
            # Decided before any review: the upstream authorizes its client; a SubjectAccessReview here
            # (cached or not) would only cost this proxy's CPU (5% of it under a flood of pass-throughs).
            return PassReason.UNCACHED_RESOURCE
        accept = request.headers.get("accept")
        key = (accept, info.verb, resource.group)
        decision = self._negotiated.get(key)
        if decision is None:
            try:
                decision = choose(accept, self.endpoint, info.verb, resource)
            except NotAcceptable as e:
                return e
            if len(self._negotiated) >= _NEGOTIATED_MAX:
                self._negotiated.clear()
            self._negotiated[key] = decision
        if (
            info.verb == "get"
            and self.ctx.upstream.delegates_consistent_gets
            and not request.query_value("resourceVersion")
        ):
            # A consistent GET goes upstream (``dispatch/reads.py``: kube reads it from etcd), whatever
            # its encoding: decided here, it costs no review (the upstream authorizes its client), no
            # wait for the cache to sync and no protobuf cache made for it.
            return PassReason.CONSISTENT_GET
        return decision

    def cache_for(self, resource: ResourceType | None) -> bool:
        """True when a cache of ``resource`` is here, or has just been made (a follower of its owner).

        Called only once the request is authorized: a follower is a full replica of the resource
        (memory, and a stream from its owner), which no unauthorized client may make a worker build.
        """
        if resource is None:
            return False
        return resource in self.ctx.cachers or (
            self.ctx.on_demand is not None and self.ctx.on_demand(resource) is not None
        )
