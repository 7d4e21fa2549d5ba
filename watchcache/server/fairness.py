"""API Priority and Fairness in front of the handler: who the client is, which flow, wait or 429.

kube-apiserver runs its APF filter after authentication and before everything else of a
request (``WithPriorityAndFairness``); so does ``ApiHandler`` with this module: the user is
authenticated (the gate's TokenReview, cached; never refused here: a failed authentication
classifies the request as anonymous and the error is raised again where the request is
authorized, or the upstream answers it for a pass-through), the request is classified, and it
waits in its level's queues for a seat (``watchcache.fairness``). It holds only its head while
it waits: a request whose body is still to come is admitted from the end of its head, before its
body is read (``ApiHandler.admit``, the HTTP layer's ``Admit`` hook), and its body is read once dispatched.

A 429 comes only when its flow's queues are full or its wait passes its budget (kube's body:
plain text, not a ``Status``; its Retry-After grows with the level's refusals, ``fairness/dropped.py``): a quarter of
--request-timeout, at most a minute, as kube's ``getRequestWaitContext``; 15 s for a watch,
which has no deadline. Every answer after classification carries the two
``X-Kubernetes-PF-*`` response headers, as kube's ``setResponseHeaders``, unless the upstream
(a pass-through) sent its own.

Without a gate (--authentication none) nobody is authenticated: a bearer token's SHA-256
prefix, or the client certificate's common name and organizations, stand for the user so that
clients still get flows of their own; any other request is anonymous.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from watchcache import apierrors
from watchcache.auth.authn import ANONYMOUS, AUTHENTICATED_GROUP, UserInfo, bearer_token
from watchcache.fairness.classify import Classification, RequestDigest
from watchcache.fairness.controller import FlowControl, Grant, Rejected
from watchcache.fairness.width import estimate
from watchcache.http.routing import RequestInfo, parse_request_info
from watchcache.server.options import parse_bool

if TYPE_CHECKING:
    from watchcache.auth.gate import Gate
    from watchcache.http.request import Request
    from watchcache.http.response import Response

__all__ = ["ClassifiedResponse", "admit", "authenticated", "wait_budget"]

FLOW_SCHEMA_UID = "X-Kubernetes-PF-FlowSchema-UID"
PRIORITY_LEVEL_UID = "X-Kubernetes-PF-PriorityLevel-UID"
_WATCH_WAIT = 15.0  # kube's defaultRequestWaitLimit: a request without a deadline
_MAX_WAIT = 60.0

#: The request's user as authenticated for classification, or the authentication's error: the
#: gate's review of a cached read reuses it instead of authenticating again.
authenticated: contextvars.ContextVar[UserInfo | apierrors.StatusError | None] = contextvars.ContextVar(
    "watchcache_authenticated", default=None
)


def wait_budget(request_timeout: float, long_running: bool) -> float:
    """How long a request may wait in its queue (kube: a quarter of its deadline, at most 1 min)."""
    if long_running or request_timeout <= 0:
        return _WATCH_WAIT
    return min(request_timeout / 4, _MAX_WAIT)


def _unverified_user(request: Request) -> UserInfo:
    """Without a gate: a stand-in user from the credentials the request carries, for its flow only."""
    token = bearer_token(request.headers)
    if token is not None:
        digest = hashlib.sha256(token.encode()).hexdigest()[:16]
        return UserInfo(f"token:{digest}", "", (AUTHENTICATED_GROUP,))
    cert = request.peercert
    if cert:
        cn, orgs = "", []
        for rdn in cert.get("subject", ()):
            for attr, value in rdn:
                if attr == "commonName":
                    cn = value
                elif attr == "organizationName":
                    orgs.append(value)
        if cn:
            return UserInfo(cn, "", (*orgs, AUTHENTICATED_GROUP))
    return ANONYMOUS


async def _user(gate: Gate | None, request: Request) -> UserInfo:
    if gate is None:
        return _unverified_user(request)
    user = gate.authenticated_now(request, request.peercert)
    if user is None:
        try:
            user = await gate.authenticate(request, request.peercert)
        except apierrors.StatusError as e:
            authenticated.set(e)
            return ANONYMOUS
    authenticated.set(user)
    return user


def digest(request: Request, info: RequestInfo | None, user: UserInfo) -> RequestDigest:
    if info is None or not info.is_resource_request:
        verb = request.method.lower() if info is None else info.verb
        return RequestDigest(user.username, user.groups, verb, False, path=request.path)
    return RequestDigest(
        user.username,
        user.groups,
        info.verb,
        True,
        api_group=info.group,
        resource=info.resource,
        subresource=info.subresource,
        namespace=info.namespace,
    )


def request_info(request: Request) -> RequestInfo:
    raw = request.raw_path.split(b"?", 1)[0].decode("latin-1")
    return parse_request_info(request.method, raw, parse_bool(request.query_value("watch")))


def width(control: FlowControl, c: Classification, request: Request, info: RequestInfo | None) -> int:
    """The request's work estimate in seats (``fairness/width.py``: a LIST by its resource's objects)."""
    if info is None or not info.is_resource_request:
        return 1
    return estimate(
        info.verb,
        info.name,
        request.query_value,
        lambda: control.object_stats(info.group, info.version, info.resource),
        control.max_seats(c.priority_level.name),
    )


_PF_LOWER = (PRIORITY_LEVEL_UID.lower(), FLOW_SCHEMA_UID.lower())  # the names of ``headers_of``'s lines


def headers_of(c: Classification) -> tuple[tuple[str, str], ...]:
    return ((PRIORITY_LEVEL_UID, c.priority_level.uid), (FLOW_SCHEMA_UID, c.flow_schema.uid))


class ClassifiedResponse:
    """The response with the PF headers added to its head (not where the upstream sent its own)."""

    def __init__(self, response: Response, classification: Classification) -> None:
        self._response = response
        self._headers = headers_of(classification)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)

    def _with(self, headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        if not headers:
            return [*self._headers]
        present = {name.lower() for name, _ in headers}
        return [*headers, *(h for h, lower in zip(self._headers, _PF_LOWER, strict=True) if lower not in present)]

    def send(self, status: int, body: Any, *, content_type: str = "application/json", headers: Any = ()) -> None:
        self._response.send(status, body, content_type=content_type, headers=self._with(headers))

    async def send_stream(
        self, status: int, parts: Any, *, content_type: str = "application/json", headers: Any = (), **kw: Any
    ) -> None:
        await self._response.send_stream(status, parts, content_type=content_type, headers=self._with(headers), **kw)

    def start_chunked(self, status: int, *, content_type: str = "application/json", headers: Any = ()) -> None:
        self._response.start_chunked(status, content_type=content_type, headers=self._with(headers))


async def admit(
    control: FlowControl, gate: Gate | None, request: Request, info: RequestInfo | None, wait: float
) -> tuple[Grant | int, Classification | None]:
    """Authenticate, classify and queue ``request`` for at most ``wait`` s: its grant, or the Retry-After
    of kube's 429, and its classification for the PF headers (None when authentication failed: kube
    answers those before flow control, so they carry no PF headers; here they still queue, as
    anonymous)."""
    user = await _user(gate, request)
    c = control.classify(digest(request, info, user))
    shown = None if isinstance(authenticated.get(), apierrors.StatusError) else c
    try:
        return await control.admit(c, wait, width(control, c, request, info)), shown
    except Rejected:
        return control.retry_after(c), shown


#: kube's ``tooManyRequests`` (maxinflight.go) through Go's ``http.Error``: plain text, not a Status.
REJECTED_BODY = b"Too many requests, please try again later.\n"
REJECTED_TYPE = "text/plain; charset=utf-8"


def rejected_headers(retry_after: int) -> tuple[tuple[str, str], ...]:
    """The 429's headers besides the PF ones: kube's Retry-After, and http.Error's nosniff."""
    return (("Retry-After", str(retry_after)), ("X-Content-Type-Options", "nosniff"))


def readiness(control: FlowControl) -> tuple[bool, str]:
    """The /readyz?verbose line naming the configuration in force (never failing: defaults always apply)."""
    return True, f"[+]priority-and-fairness ok (configuration: {control.source})"
