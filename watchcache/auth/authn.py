"""Who is asking: bearer tokens checked with the upstream's ``TokenReview``; client certificates.

Follows kube-apiserver's request authentication (``k8s.io/apiserver/pkg/authentication``):

- ``Authorization: Bearer <token>`` (scheme case-insensitive; the token is the second
  space-separated word). No header, another scheme, or an empty token: no credentials,
  so the request is anonymous if the caller allows it.
- A token the upstream does not authenticate: 401 ``Unauthorized`` (never anonymous, as
  kube's ``union.NewFailOnError`` ensures).
- **Fail closed.** A review that gets no answer (upstream unreachable, timeout, non-2xx,
  malformed answer) is also a 401, exactly what kube-apiserver answers when its token
  webhook fails. It is not cached: the next request asks again.
- Authenticated users get the group ``system:authenticated`` added (kube's
  ``AuthenticatedGroupAdder``) unless they already carry it or ``system:unauthenticated``.

Answers are cached (allow 10 s, deny 2 s by default) under an HMAC-SHA256 of the token
with a per-process random key, as kube's cached token authenticator does: neither the
token nor a plain digest a stolen heap dump could be matched against is kept, and tokens
never appear in logs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from watchcache.apierrors import StatusError
from watchcache.auth.cache import ReviewCache
from watchcache.auth.review import TOKEN_REVIEW_PATH, ReviewClient, ReviewError

if TYPE_CHECKING:
    from watchcache.http.request import Request

log = logging.getLogger("watchcache.auth")

ANONYMOUS_USER = "system:anonymous"
UNAUTHENTICATED_GROUP = "system:unauthenticated"
AUTHENTICATED_GROUP = "system:authenticated"


@dataclass(frozen=True)
class UserInfo:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    def extra_items(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """``extra`` in a canonical, hashable form (for cache keys)."""
        return tuple(sorted(self.extra.items()))


ANONYMOUS = UserInfo(ANONYMOUS_USER, "", (UNAUTHENTICATED_GROUP,))


def unauthorized() -> StatusError:
    """kube-apiserver's answer to failed authentication: ``apierrors.NewUnauthorized("Unauthorized")``."""
    return StatusError(401, "Unauthorized", "Unauthorized")


def with_authenticated_group(user: UserInfo) -> UserInfo:
    """kube's ``AuthenticatedGroupAdder``."""
    if user.username == ANONYMOUS_USER:
        return user
    if AUTHENTICATED_GROUP in user.groups or UNAUTHENTICATED_GROUP in user.groups:
        return user
    return UserInfo(user.username, user.uid, (*user.groups, AUTHENTICATED_GROUP), user.extra)


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The bearer token of a request (lower-case header names), parsed as kube's ``bearertoken``
    authenticator does; None when the request carries none."""
    auth = headers.get("authorization", "").strip()
    if not auth:
        return None
    parts = auth.split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer":
        return None
    return parts[1] or None


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ReviewError(f"TokenReview answer: {what} is not a list of strings")
    return tuple(value)


def user_from_token_review(answer: Mapping[str, Any], audiences: Sequence[str] = ()) -> UserInfo | None:
    """The user a ``TokenReview`` answer authenticates (groups as given), None if it does not.

    Raises ReviewError for an answer that is not a TokenReview status. With ``audiences``,
    the token must be valid for at least one of them (``status.audiences``).
    """
    status = answer.get("status")
    if not isinstance(status, dict):
        raise ReviewError("TokenReview answer has no status")
    if status.get("authenticated") is not True:
        return None
    if audiences and not set(_strings(status.get("audiences"), "status.audiences")) & set(audiences):
        return None
    user = status.get("user")
    if not isinstance(user, dict):
        raise ReviewError("TokenReview answer: authenticated without status.user")
    username = user.get("username")
    if not isinstance(username, str) or not username:
        raise ReviewError("TokenReview answer: authenticated without a username")
    uid = user.get("uid") or ""
    if not isinstance(uid, str):
        raise ReviewError("TokenReview answer: status.user.uid is not a string")
    raw_extra = user.get("extra") or {}
    if not isinstance(raw_extra, dict):
        raise ReviewError("TokenReview answer: status.user.extra is not an object")
    extra = {str(k): _strings(v, f"status.user.extra[{k!r}]") for k, v in raw_extra.items()}
    return UserInfo(username, uid, _strings(user.get("groups"), "status.user.groups"), extra)


class TokenAuthenticator:
    """Bearer tokens checked with ``TokenReview``, cached, one review in flight per token."""

    def __init__(
        self,
        client: ReviewClient,
        *,
        allow_ttl: float = 10.0,
        deny_ttl: float = 2.0,
        audiences: Sequence[str] = (),
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.audiences = tuple(audiences)
        self.cache: ReviewCache[bytes, UserInfo | None] = ReviewCache(
            allow_ttl=allow_ttl, deny_ttl=deny_ttl, max_entries=max_entries, clock=clock
        )
        self._key = os.urandom(32)
        # Requests that failed because a review got no answer (each one a 401).
        self.failures = 0

    def token_key(self, token: str) -> bytes:
        """The cache key of a token: keyed BLAKE2b (a MAC) under this authenticator's random key, so the
        cache never holds a token and its keys say nothing without the key.

        Not HMAC-SHA256 through OpenSSL 3: each call fetches the digest by name from the providers,
        2 µs in a tight loop but 15–19 µs per request in the proxy between requests (cProfile and py-spy
        of consistent GETs), where BLAKE2b is CPython's own code (1.5 µs)."""
        return hashlib.blake2b(token.encode("utf-8", "surrogateescape"), key=self._key, digest_size=32).digest()

    async def authenticate(self, request: Request) -> UserInfo | None:
        """The request's user; None without a bearer token. Raises 401 for a token that does
        not authenticate or cannot be checked."""
        token = bearer_token(request.headers)
        if token is None:
            return None
        return await self.authenticate_token(token)

    def cached(self, token: str) -> UserInfo | None:
        """The token's user if its review allowed it within the TTL, known at once (a hit); None:
        ``authenticate_token`` answers (a review, a cached refusal, an expired entry)."""
        return self.cache.allowed(self.token_key(token))

    async def authenticate_token(self, token: str) -> UserInfo:
        try:
            user = await self.cache.get(self.token_key(token), lambda: self._review(token), lambda u: u is not None)
        except Exception:
            self.failures += 1
            raise unauthorized() from None
        if user is None:
            raise unauthorized()
        return user

    async def _review(self, token: str) -> UserInfo | None:
        spec: dict[str, Any] = {"token": token}
        if self.audiences:
            spec["audiences"] = list(self.audiences)
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        try:
            answer = await self.client.post(TOKEN_REVIEW_PATH, body)
            user = user_from_token_review(answer, self.audiences)
        except Exception as e:
            # Never let the token reach a log line, even inside an upstream's error message.
            log.warning("token review failed, answering 401: %s", str(e).replace(token, "<token>"))
            raise
        if user is None:
            log.debug("token review: not authenticated")
            return None
        log.debug("token review: authenticated %s", user.username)
        return with_authenticated_group(user)


CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


class CertAuthenticator:
    """Users from verified client certificates, as kube's x509 authenticator maps them:
    subject CommonName → username, Organizations → groups (plus ``system:authenticated``),
    and the extra ``authentication.kubernetes.io/credential-id: X509SHA256=<hex>`` when the
    certificate's fingerprint is known (``peercert["x509sha256"]``, set by the HTTP layer).

    Takes the dict ``ssl.SSLSocket.getpeercert()`` returns; that dict is only non-empty
    for a certificate the TLS layer verified, so the server's ``SSLContext`` must load the
    client CA and use ``verify_mode = CERT_OPTIONAL`` (token clients send no certificate).
    With ``issuers`` (CA subjects, as ``getpeercert()`` renders them), only certificates
    issued by one of those CAs count: a server that also trusts a request-header CA must not
    take a front-proxy certificate for a user. A certificate without a CommonName
    authenticates nobody (None), as in kube.
    """

    def __init__(self, issuers: Sequence[Any] | None = None) -> None:
        self.issuers = None if issuers is None else [distinguished_name(i) for i in issuers]

    def authenticate(self, peercert: Mapping[str, Any] | None) -> UserInfo | None:
        if not peercert:
            return None
        if self.issuers is not None and distinguished_name(peercert.get("issuer")) not in self.issuers:
            return None
        common_name = ""
        organizations: list[str] = []
        for rdn in peercert.get("subject") or ():
            for attr, value in rdn:
                if attr == "commonName":
                    common_name = value  # the last one wins, as Go's pkix.Name.FillFromRDNSequence
                elif attr == "organizationName":
                    organizations.append(value)
        if not common_name:
            return None
        fingerprint = peercert.get("x509sha256")
        extra: dict[str, tuple[str, ...]] = {CREDENTIAL_ID: (f"X509SHA256={fingerprint}",)} if fingerprint else {}
        return with_authenticated_group(UserInfo(common_name, "", tuple(organizations), extra))


def distinguished_name(name: Any) -> tuple[tuple[tuple[str, str], ...], ...]:
    """A subject or issuer of ``getpeercert()`` in a comparable form."""
    return tuple(tuple((str(a), str(v)) for a, v in rdn) for rdn in name or ())
