"""The gate's review of a request the cache answers (or of one of this server's own paths), written as kube writes it.

Delegated authentication and authorization (``auth/gate.py``) decide; this module runs the
review without the request's in-flight seat (a TokenReview or SubjectAccessReview is a wait,
``server/seats.py``) and encodes its 401/403 for the client's Accept, as kube-apiserver does
(protobuf for client-go's typed clients).
"""

from __future__ import annotations

from watchcache import apierrors
from watchcache.auth.authn import bearer_token
from watchcache.auth.gate import Gate
from watchcache.http.request import Request
from watchcache.http.routing import RequestInfo
from watchcache.server import fairness, seats
from watchcache.server.negotiation import Endpoint, pretty_requested, render_error


async def authorize(gate: Gate, request: Request, info: RequestInfo | None, endpoint: Endpoint) -> None:
    """Review a cached read (``info``), or this server's own path (None); raises the Status that refuses it."""
    known = fairness.authenticated.get()  # authenticated already, for flow control
    try:
        if isinstance(known, apierrors.StatusError):
            raise known
        with seats.waiting():  # a TokenReview or SubjectAccessReview, unless cached
            if info is None:
                await gate.check_path(request, peercert=request.peercert, user=known)
            else:
                await gate.check(request, info, peercert=request.peercert, user=known)
    except apierrors.StatusError as e:
        pretty = pretty_requested(request.query, request.headers, endpoint)
        raise render_error(e, request.headers.get("accept"), endpoint, pretty=pretty) from None


def has_credentials(request: Request) -> bool:
    """The request carries a bearer token or a client certificate (else the upstream sees it as anonymous)."""
    return request.peercert is not None or bearer_token(request.headers) is not None
