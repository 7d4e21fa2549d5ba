"""What went wrong talking to the upstream, in words an operator can act on.

Every failed request of the proxy's own (discovery, a reflector's LIST or WATCH) is classified
once: a reason for the metrics (``watchcache_upstream_errors_total{reason}``), a log level, and a
hint naming the fix — the RBAC verb and resource a 403 lacks, "the upstream does not speak TLS"
for a plain-HTTP port behind ``https://``, an untrusted certificate, a refused connection. The
last failure per resource is kept (``LastFailures``) for ``/readyz?verbose`` and ``/debug/cache``.
"""

from __future__ import annotations

import logging
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from watchcache.resources import ResourceType
from watchcache.upstream.client import UpstreamError, WatchStalled
from watchcache.upstream.credentials import CredentialError

log = logging.getLogger("watchcache.upstream")

# Reasons (metric label values), from the most actionable.
UNAUTHORIZED = "unauthorized"  # 401: the proxy's credential is refused
FORBIDDEN = "forbidden"  # 403: RBAC
NOT_TLS = "not-tls"  # https:// to a plain-HTTP port
CERTIFICATE = "certificate"  # the upstream's certificate is not trusted (or the name does not match)
CREDENTIAL = "credential"  # the exec plugin (or token file) could not give a credential
REFUSED = "refused"  # nothing listens there / unreachable
TIMEOUT = "timeout"
NOT_FOUND = "not-found"  # 404 on a resource: the upstream does not serve it
THROTTLED = "throttled"  # 429
SERVER = "server-error"  # 5xx
STALLED = "stalled"  # a watch went silent (re-established at once; not a failure of the upstream)
OTHER = "other"
REASONS = (UNAUTHORIZED, FORBIDDEN, NOT_TLS, CERTIFICATE, CREDENTIAL, REFUSED, TIMEOUT, NOT_FOUND, THROTTLED,
           SERVER, STALLED, OTHER)  # fmt: skip
# Configuration problems: retrying will not fix them, someone must act.
_ERRORS = frozenset({UNAUTHORIZED, FORBIDDEN, NOT_TLS, CERTIFICATE, CREDENTIAL, NOT_FOUND})

# kube's 403 message: `pods is forbidden: User "x" cannot list resource "pods" in API group "" at the cluster scope`.
_FORBIDDEN = re.compile(r'User "(?P<user>[^"]*)" cannot (?P<verb>\w+) resource "(?P<resource>[^"]*)"')


@dataclass(frozen=True)
class Failure:
    """One classified failure: when, what the upstream or the connection said, and what to do."""

    reason: str
    message: str
    hint: str
    at: float  # wall clock
    verb: str  # the proxy's request: list, watch, discovery
    # A failure a cluster's own life explains (a custom resource's CRD deleted while its cache ran):
    # logged as a warning, not as a configuration error someone must act on.
    churn: bool = False

    @property
    def level(self) -> int:
        return logging.ERROR if self.reason in _ERRORS and not self.churn else logging.WARNING

    def as_json(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {
            "reason": self.reason,
            "verb": self.verb,
            "message": self.message,
            "hint": self.hint,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)),
            "seconds_ago": round(now - self.at, 1),
        }

    def line(self) -> str:
        return f"{self.verb}: {self.message}" + (f" ({self.hint})" if self.hint else "")


def _ssl_reason(e: BaseException) -> str | None:
    """The OpenSSL reason of an SSL error anywhere in ``e``'s chain."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return str(getattr(seen, "reason", "") or seen)
        inner = getattr(seen, "os_error", None) or getattr(seen, "certificate_error", None)
        seen = inner if isinstance(inner, BaseException) else (seen.__cause__ or seen.__context__)
    return None


def classify(
    e: BaseException, verb: str, resource: ResourceType | None, server: str, identity: str = "", now: float = 0.0
) -> Failure:
    """The failure ``e`` of the proxy's ``verb`` (list, watch, discovery) on ``resource``, with a hint."""
    at = now or time.time()
    what = resource.qualified if resource is not None else "discovery"
    if isinstance(e, UpstreamError):
        message = f"{e.code} {e.reason or 'error'}: {str(e).split(': ', 1)[-1]}"
        if e.code == 401:
            return Failure(UNAUTHORIZED, message, (
                f"the upstream refuses watchcache's own credential ({identity or 'none'}): expired or revoked "
                "token, or a client certificate it does not trust"), at, verb)  # fmt: skip
        if e.code == 403:
            m = _FORBIDDEN.search(message)
            user = m.group("user") if m else "watchcache's identity"
            needed = m.group("verb") if m else verb
            group = resource.group if resource is not None else ""
            target = f'"{resource.resource}" in API group "{group}"' if resource is not None else "discovery"
            return Failure(FORBIDDEN, message, (
                f"RBAC: grant {user} the verbs get, list and watch on {target}, cluster-wide "
                f"(it lacks {needed}; deploy/kubernetes/base/rbac.yaml), or drop {what} from --resources"
            ), at, verb)  # fmt: skip
        if e.code == 404:
            if resource is not None and resource.custom:
                # Its CRD (or APIService) went away while it was cached: its cache stops when the CRD
                # cache shows it (service/crds.py), so a relist or two in between is expected.
                return Failure(NOT_FOUND, message, (
                    f"the upstream no longer serves {what}: its CustomResourceDefinition was deleted or stopped "
                    "serving this version (its cache stops with it), or drop it from --resources"), at, verb,
                    churn=True)  # fmt: skip
            return Failure(NOT_FOUND, message, f"the upstream does not serve {what}: drop it from --resources", at,
                           verb)  # fmt: skip
        if e.code == 429:
            return Failure(THROTTLED, message, "the upstream's priority and fairness is throttling watchcache", at,
                           verb)  # fmt: skip
        if e.code >= 500:
            return Failure(SERVER, message, "the upstream is failing; watchcache retries with backoff", at, verb)
        return Failure(OTHER, message, "", at, verb)
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, WatchStalled):
        return Failure(STALLED, text, "a silent watch is re-established at once", at, verb)
    ssl_reason = _ssl_reason(e)
    if ssl_reason is not None:
        if "WRONG_VERSION_NUMBER" in ssl_reason or "record layer failure" in ssl_reason:
            return Failure(NOT_TLS, text, (
                f"the upstream does not speak TLS at {server}: use http:// for a plain-HTTP port, or the "
                "apiserver's TLS port"), at, verb)  # fmt: skip
        if "CERTIFICATE_VERIFY_FAILED" in ssl_reason or "certificate" in ssl_reason.lower():
            return Failure(CERTIFICATE, text, (
                "the upstream's certificate is not signed by the configured certificate authority, or does not "
                "name the host dialled: check certificate-authority(-data) and tls-server-name"), at, verb)  # fmt: skip
        return Failure(OTHER, text, f"TLS with {server} failed", at, verb)
    if isinstance(e, CredentialError):
        return Failure(CREDENTIAL, str(e), "the exec credential plugin could not give a credential", at, verb)
    if isinstance(e, aiohttp.ClientConnectorError | ConnectionRefusedError):
        return Failure(REFUSED, text, f"nothing accepts connections at {server} (or a proxy in between)", at, verb)
    if isinstance(e, TimeoutError | aiohttp.ServerTimeoutError):
        return Failure(TIMEOUT, text or "timeout", f"the upstream at {server} did not answer in time", at, verb)
    return Failure(OTHER, text, "", at, verb)


class LastFailures:
    """The last failure per resource (None: discovery), counted by reason; logged when it changes."""

    def __init__(self, server: str, identity: Callable[[], str] = str) -> None:
        self.server = server
        self.identity = identity
        self.last: dict[ResourceType | None, Failure] = {}
        # Cleared by a success: the resource's requests work again (the failure stays in ``last``).
        self.failing: set[ResourceType | None] = set()
        self.counts: dict[tuple[ResourceType | None, str], int] = {}
        self._logged: dict[ResourceType | None, tuple[str, float]] = {}

    def failed(self, resource: ResourceType | None, verb: str, e: BaseException, retry_in: float) -> Failure:
        failure = classify(e, verb, resource, self.server, self.identity())
        self.last[resource] = failure
        self.failing.add(resource)
        key = (resource, failure.reason)
        self.counts[key] = self.counts.get(key, 0) + 1
        if failure.reason != STALLED:
            # The first time, then once a minute while the same failure lasts (the backoff tops out at 30 s).
            logged = self._logged.get(resource)
            if logged is None or logged[0] != failure.message or failure.at - logged[1] >= 60.0:
                self._logged[resource] = (failure.message, failure.at)
                what = f"{verb} of {resource.qualified}" if resource is not None else verb
                hint = f" ({failure.hint})" if failure.hint else ""
                log.log(failure.level, "upstream %s failed (%s): %s%s; retrying in %.1fs", what, failure.reason,
                        failure.message, hint, retry_in)  # fmt: skip
        return failure

    def succeeded(self, resource: ResourceType | None) -> None:
        if resource in self.failing:
            self.failing.discard(resource)
            what = resource.qualified if resource is not None else "discovery"
            log.info("upstream requests of %s work again", what)

    def for_resource(self, resource: ResourceType | None) -> Failure | None:
        return self.last.get(resource)
