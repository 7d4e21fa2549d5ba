"""Delegated authentication and authorization of cached reads and of the proxy's own endpoints.

The proxy answers GET/LIST/WATCH from its cache with data it read under its own identity,
so before a cached byte goes out it must establish who the client is and whether the
upstream would let that client read it — the way an aggregated apiserver delegates:

1. **Authentication**: a verified client certificate (``CertAuthenticator``), else the
   bearer token checked with the upstream's ``TokenReview`` (``TokenAuthenticator``), else
   anonymous (``system:anonymous`` / ``system:unauthenticated``) when allowed. (The
   simulated cluster, standing for an apiserver, also believes a front proxy's
   ``X-Remote-*`` headers first and resolves ``Impersonate-*``: its gate is a subclass,
   ``sim.gate.ApiserverGate``.)
2. **Authorization**: the upstream's ``SubjectAccessReview`` for the request's attributes
   (``SubjectAccessReviewer``), skipped for ``always_allow_groups`` (``system:masters``).

``Gate.check`` does both for a resource request and ``Gate.check_path`` for a path the proxy
answers itself (``/metrics``, ``/debug/...``: ``nonResourceAttributes``, as kube-apiserver
authorizes its own), and raise kube's 401/403 (or a 500 when the upstream cannot answer:
fail closed). Requests that pass through are not gated here: the upstream
decides with the client's own credentials.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

from watchcache.auth.authn import (
    ANONYMOUS,
    CertAuthenticator,
    TokenAuthenticator,
    UserInfo,
    bearer_token,
    unauthorized,
)
from watchcache.auth.authz import (
    Attributes,
    NonResourceAttributes,
    ResourceAttributes,
    SubjectAccessReviewer,
    forbidden,
)
from watchcache.auth.review import ReviewClient, UpstreamReviewClient, UpstreamSession

if TYPE_CHECKING:
    from watchcache.http.request import Request
    from watchcache.http.routing import RequestInfo

__all__ = ["AuthOptions", "Gate"]


@dataclass(frozen=True)
class AuthOptions:
    """Tunables of the gate; flag names in ``watchcache.auth.options``."""

    anonymous: bool = True
    token_allow_ttl: float = 10.0
    token_deny_ttl: float = 2.0
    access_allow_ttl: float = 10.0
    access_deny_ttl: float = 2.0
    always_allow_groups: tuple[str, ...] = ("system:masters",)
    audiences: tuple[str, ...] = ()
    max_cache_entries: int = 10_000
    review_timeout: float = 10.0


def _one_request(request: Request) -> None:
    """kube's UnauthenticatedHTTP2DOSMitigation: an HTTP/2 connection whose request was anonymous or
    refused (401) serves no further request (GOAWAY after this one): HTTP/2 is cheap to abuse for a
    client nobody authenticated (CVE-2023-44487, CVE-2023-39325)."""
    if request.http_version == "2":
        request.close_connection = True


class Gate:
    """Authenticate, then authorize, a cached read; counts outcomes in plain ints for metrics.

    Counters: ``allowed``, ``denied`` (403), ``unauthenticated`` (401: bad or uncheckable
    credentials, or none when anonymous is off), ``anonymous`` (requests let through as
    anonymous to authorization), ``failed`` (500: no authorization decision). Review and
    cache counters live on ``tokens.cache`` / ``access.cache`` (``reviews``, ``hits``,
    ``joined``); ``stats()`` collects them all.
    """

    #: Whether ``authenticate`` resolves ``Impersonate-*`` itself (an apiserver's gate: the simulator's).
    #: The proxy's does not: it passes impersonating requests through, for the upstream to decide.
    resolves_impersonation: ClassVar[bool] = False

    def __init__(
        self,
        tokens: TokenAuthenticator | None,
        access: SubjectAccessReviewer,
        *,
        certs: CertAuthenticator | None = None,
        anonymous: bool = True,
        always_allow_groups: Iterable[str] = ("system:masters",),
    ) -> None:
        self.tokens = tokens
        self.access = access
        self.certs = certs
        self.anonymous_enabled = anonymous
        self.always_allow_groups = frozenset(always_allow_groups)
        self.allowed = 0
        self.denied = 0
        self.unauthenticated = 0
        self.anonymous = 0
        self.failed = 0

    @classmethod
    def build(
        cls,
        client: ReviewClient,
        options: AuthOptions | None = None,
        *,
        certs: CertAuthenticator | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> Self:
        """A gate sending both reviews through ``client`` (a test fake, or the sim's ``LocalReviewClient``)."""
        options = options or AuthOptions()
        tokens = TokenAuthenticator(
            client,
            allow_ttl=options.token_allow_ttl,
            deny_ttl=options.token_deny_ttl,
            audiences=options.audiences,
            max_entries=options.max_cache_entries,
            clock=clock,
        )
        access = SubjectAccessReviewer(
            client,
            allow_ttl=options.access_allow_ttl,
            deny_ttl=options.access_deny_ttl,
            max_entries=options.max_cache_entries,
            clock=clock,
        )
        return cls(
            tokens,
            access,
            certs=certs,
            anonymous=options.anonymous,
            always_allow_groups=options.always_allow_groups,
        )

    @classmethod
    def for_upstream(
        cls, upstream: UpstreamSession, options: AuthOptions | None = None, *, certs: CertAuthenticator | None = None
    ) -> Self:
        """A gate reviewing through the upstream with the proxy's own identity (``upstream.session``)."""
        options = options or AuthOptions()
        return cls.build(UpstreamReviewClient(upstream, timeout=options.review_timeout), options, certs=certs)

    def authenticated_now(self, request: Request, peercert: Mapping[str, Any] | None = None) -> UserInfo | None:
        """``authenticate``'s user when it is known without a wait: a bearer token's, reviewed and
        allowed within the TTL (most requests). None: await ``authenticate`` (a certificate, no
        token, a review to make, a refusal to answer). No coroutine: every request asks."""
        if (peercert and self.certs is not None) or self.tokens is None:
            return None
        token = bearer_token(request.headers)
        return None if token is None else self.tokens.cached(token)

    async def authenticate(self, request: Request, peercert: Mapping[str, Any] | None = None) -> UserInfo:
        """The request's user (anonymous included); raises 401. Order as kube's: x509, then token."""
        user = None
        if self.certs is not None and peercert:
            user = self.certs.authenticate(peercert)
        if user is None and self.tokens is not None:
            try:
                user = await self.tokens.authenticate(request)
            except Exception:
                self.unauthenticated += 1
                _one_request(request)
                raise
        if user is None:
            _one_request(request)
            if not self.anonymous_enabled:
                self.unauthenticated += 1
                raise unauthorized()
            self.anonymous += 1
            user = ANONYMOUS
        return user

    async def check(
        self,
        request: Request,
        info: RequestInfo,
        *,
        peercert: Mapping[str, Any] | None = None,
        user: UserInfo | None = None,
    ) -> UserInfo:
        """Authenticate and authorize a cached read of ``info``; the user, or raise 401/403/500.
        Its callers await it before the read's first byte (invariant 9).

        ``peercert`` is ``getpeercert()`` of a TLS connection whose context verifies client
        certificates (None for plain HTTP). ``user``: already authenticated (for flow control).
        """
        if user is None:
            user = await self.authenticate(request, peercert)
        attrs = ResourceAttributes.from_request_info(
            info, request.query_value("fieldSelector"), request.query_value("labelSelector")
        )
        await self.authorize(user, attrs)
        return user

    async def check_path(
        self, request: Request, *, peercert: Mapping[str, Any] | None = None, user: UserInfo | None = None
    ) -> UserInfo:
        """Authenticate and authorize a request for a non-resource path the proxy answers itself
        (``/metrics``, ``/debug/...``), as kube-apiserver does its own: verb = the lower-cased method."""
        if user is None:
            user = await self.authenticate(request, peercert)
        await self.authorize(user, NonResourceAttributes(request.method.lower(), request.path))
        return user

    async def authorize(self, user: UserInfo, attrs: Attributes) -> None:
        """Raise kube's 403 unless ``user`` may do ``attrs`` (500 when the upstream cannot say)."""
        if self.always_allow_groups.intersection(user.groups):
            self.allowed += 1
            return
        try:
            decision = await self.access.authorize(user, attrs)
        except Exception:
            self.failed += 1
            raise
        if not decision.allowed:
            self.denied += 1
            raise forbidden(user, attrs, decision.reason)
        self.allowed += 1

    def stats(self) -> dict[str, int]:
        """Every counter, for a metrics collector reading them at scrape time."""
        out = {
            "allowed": self.allowed,
            "denied": self.denied,
            "unauthenticated": self.unauthenticated,
            "anonymous": self.anonymous,
            "failed": self.failed,
            "access_reviews": self.access.cache.reviews,
            "access_cache_hits": self.access.cache.hits,
            "access_joined": self.access.cache.joined,
            "access_failures": self.access.failures,
        }
        if self.tokens is not None:
            out.update(
                token_reviews=self.tokens.cache.reviews,
                token_cache_hits=self.tokens.cache.hits,
                token_joined=self.tokens.cache.joined,
                token_failures=self.tokens.failures,
            )
        return out

    @property
    def reviews_sent(self) -> int:
        return self.access.cache.reviews + (self.tokens.cache.reviews if self.tokens is not None else 0)

    @property
    def cache_hits(self) -> int:
        return self.access.cache.hits + (self.tokens.cache.hits if self.tokens is not None else 0)
