"""Who a pass-through request reaches the upstream as: always the client, never someone else.

A client that sends a bearer token (or nothing) is forwarded as it came: the token goes
through untouched on a connection that presents no identity of the proxy's, so the upstream
authenticates the client itself — the same TokenReview-free path, audiences, expiry and
audit identity as if it had called the apiserver directly, and the proxy is trusted with
nothing. A client the proxy authenticated by its certificate (``--client-ca-file``) cannot
be forwarded that way: its TLS handshake ends at the proxy. Its requests go out:

- ``front-proxy``: over a connection presenting watchcache's front-proxy client certificate
  (``--proxy-client-cert-file``/``--proxy-client-key-file``, kube-apiserver's names) with
  ``X-Remote-User``/``X-Remote-Group``/``X-Remote-Extra-*`` naming the user, as kube's
  aggregation layer calls extension apiservers. The upstream believes those headers because
  it trusts the certificate (``--requestheader-client-ca-file``, ``--requestheader-allowed-names``).
  The client's own ``Impersonate-*`` headers still reach it and are authorized against the user.
- ``impersonate``: with the proxy's own identity and ``Impersonate-User``/``Impersonate-Group``
  (the proxy needs ``impersonate`` on users and groups). A client's own ``Impersonate-*``
  cannot be nested under the proxy's, so such a request is refused.
- ``refuse`` (the default without a front-proxy certificate): 403, with what to configure.
  Never the wrong identity: forwarding without credentials would make the user anonymous.

Request-header identity headers from the client (``X-Remote-*`` and every configured or
upstream-published name) are dropped from every forwarded request, whatever the mode.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from watchcache.apierrors import StatusError
from watchcache.auth.authn import CertAuthenticator, UserInfo
from watchcache.auth.requestheader import RequestHeaderNames
from watchcache.quoting import go_quote

if TYPE_CHECKING:
    from watchcache.http.request import Request

log = logging.getLogger("watchcache.upstream.identity")

MODES = ("refuse", "front-proxy", "impersonate")
AUTHENTICATION_CONFIGMAP = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"
_AUTHENTICATED = "system:authenticated"


class JsonReader(Protocol):
    """What ``learn_upstream_names`` reads through: ``upstream.client.UpstreamClient``, which imports this module."""

    async def get_json(self, path: str, *, timeout: float = 30.0) -> Any: ...


class Route(enum.Enum):
    """Which connection pool, i.e. which TLS identity, a forwarded request goes out on."""

    CLIENT = "client"  # no identity of the proxy's: the client's own credentials only
    FRONT_PROXY = "front-proxy"  # the front-proxy client certificate
    PROXY = "proxy"  # the proxy's own identity (impersonation)


@dataclass(frozen=True)
class IdentityOptions:
    mode: str = "refuse"
    proxy_client_cert_file: str | None = None
    proxy_client_key_file: str | None = None
    names: RequestHeaderNames = field(default_factory=RequestHeaderNames)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--client-cert-passthrough must be one of {', '.join(MODES)}")
        if bool(self.proxy_client_cert_file) != bool(self.proxy_client_key_file):
            raise ValueError("--proxy-client-cert-file and --proxy-client-key-file go together")
        if self.mode == "front-proxy" and not self.proxy_client_cert_file:
            raise ValueError(
                "--client-cert-passthrough=front-proxy needs --proxy-client-cert-file and --proxy-client-key-file"
            )


def cannot_present(user: UserInfo) -> StatusError:
    """403 for a certificate user when no way to present them upstream is configured."""
    message = (
        f"User {go_quote(user.username)} (authenticated by a client certificate) cannot be passed through to the "
        "upstream: this watchcache has no way to present that identity to it. Operator: give watchcache a front-proxy "
        "client certificate the upstream trusts (--proxy-client-cert-file and --proxy-client-key-file; upstream "
        "--requestheader-client-ca-file and --requestheader-allowed-names), or use "
        "--client-cert-passthrough=impersonate; or connect with a bearer token"
    )
    return StatusError(403, "Forbidden", f"forbidden: {message}", details={})


PLAIN_HTTP_HINT = (
    "this request reached watchcache over plain HTTP without credentials and the upstream refused it: kubectl and "
    "client-go (kubeconfig) send no bearer token or client certificate to an http:// server. Connect to watchcache "
    "over https:// (it serves TLS with --tls-cert-file and --tls-private-key-file)"
)


def plain_http_unauthorized() -> StatusError:
    """The upstream's 401 for a credential-less request that came over plain HTTP, with why and what to do."""
    return StatusError(401, "Unauthorized", f"Unauthorized: {PLAIN_HTTP_HINT}")


def cannot_nest_impersonation(user: UserInfo) -> StatusError:
    message = (
        f"User {go_quote(user.username)} (authenticated by a client certificate) cannot impersonate through this "
        "watchcache: it impersonates certificate users itself (--client-cert-passthrough=impersonate) and "
        "impersonation does not nest. Operator: use --client-cert-passthrough=front-proxy"
    )
    return StatusError(403, "Forbidden", f"forbidden: {message}", details={})


class PassthroughIdentity:
    """Decides, per forwarded request, the route and the identity headers; raises 403 rather than
    forward a request under another identity than its client's."""

    def __init__(self, options: IdentityOptions | None = None, certs: CertAuthenticator | None = None) -> None:
        self.options = options or IdentityOptions()
        self.mode = self.options.mode
        self.certs = certs
        # Set when the proxy serves plain HTTP: a 401 for a request without credentials then says why.
        self.plain_http = False
        # What is sent, and (with every other name) stripped; the upstream's published names join it.
        self.names = self.options.names
        # Forwarded requests by route, and refusals (for metrics).
        self.forwarded: dict[str, int] = {}
        self.refused = 0

    def outgoing(self, request: Request, headers: Iterable[tuple[str, str]]) -> tuple[Route, list[tuple[str, str]]]:
        """The route and the header lines (lower-case names in, hop-by-hop already removed) for
        forwarding ``request``; raises the 403 when its user cannot be presented."""
        names = self.names
        lines = [(k, v) for k, v in headers if not names.is_identity_header(k)]
        user = self.certs.authenticate(request.peercert) if self.certs is not None and request.peercert else None
        route = Route.CLIENT
        if user is not None:
            if self.mode == "front-proxy":
                # The certificate is the client's credential (kube's x509 authenticator runs
                # before the token one); a token it also sent is not forwarded.
                lines = [(k, v) for k, v in lines if k != "authorization"]
                lines += names.headers_for(user)
                route = Route.FRONT_PROXY
            elif self.mode == "impersonate":
                if any(k.startswith("impersonate-") for k, _ in lines):
                    self.refused += 1
                    raise cannot_nest_impersonation(user)
                lines = [(k, v) for k, v in lines if k != "authorization"]
                lines.append(("Impersonate-User", user.username))
                # kube adds system:authenticated to an impersonated user itself.
                lines += [("Impersonate-Group", g) for g in user.groups if g != _AUTHENTICATED]
                route = Route.PROXY
            else:
                self.refused += 1
                raise cannot_present(user)
        self.forwarded[route.value] = self.forwarded.get(route.value, 0) + 1
        return route, lines

    def explain(self, request: Request, status: int) -> StatusError | None:
        """A clearer answer than the upstream's bare 401 to a credential-less request over plain HTTP."""
        if status == 401 and self.plain_http and "authorization" not in request.headers:
            return plain_http_unauthorized()
        return None

    async def learn_upstream_names(self, client: JsonReader) -> None:
        """Read the request-header names the upstream believes (``extension-apiserver-authentication``,
        readable with kube's ``extension-apiserver-authentication-reader`` Role), so that every one of
        them is stripped from clients and the first of each is the one sent."""
        try:
            data = await client.get_json(AUTHENTICATION_CONFIGMAP, timeout=10.0)
            published = names_from_configmap(data.get("data") or {})
        except Exception as e:
            log.warning(
                "cannot read the upstream's request-header configuration (%s: %s); sending and stripping the "
                "--requestheader-* names %s. Bind watchcache to the Role kube-system/"
                "extension-apiserver-authentication-reader so it strips every name the upstream believes",
                AUTHENTICATION_CONFIGMAP,
                e,
                _describe(self.names),
            )
            return
        if published is None:
            log.error(
                "the upstream publishes no request-header configuration: it does not believe front-proxy "
                "certificates, so --client-cert-passthrough=front-proxy requests will be refused by it"
            )
            return
        self.names = self.options.names.merged(published)
        log.info("front-proxy identity headers: %s", _describe(self.names))


def names_from_configmap(data: dict[str, Any]) -> RequestHeaderNames | None:
    """The names in ``extension-apiserver-authentication`` (JSON lists), None if it has none."""

    def field_list(key: str) -> list[str]:
        raw = data.get(key)
        if not raw:
            return []
        value = orjson.loads(raw)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key} is not a JSON list of strings")
        return value

    username = field_list("requestheader-username-headers")
    if not username:
        return None
    return RequestHeaderNames.from_lists(
        username,
        field_list("requestheader-group-headers"),
        field_list("requestheader-extra-headers-prefix"),
        field_list("requestheader-uid-headers"),
    )


def _describe(names: RequestHeaderNames) -> str:
    return f"user {list(names.username)}, group {list(names.group)}, extra {list(names.extra_prefix)}" + (
        f", uid {list(names.uid)}" if names.uid else ""
    )
