"""The simulated cluster's gate: an apiserver's authentication chain, not the proxy's.

kube-apiserver believes a front proxy's ``X-Remote-*`` headers before certificates and tokens,
when the request comes with a certificate of the request-header CA
(``auth.requestheader.RequestHeaderAuthenticator``), and resolves ``Impersonate-*`` after
authentication (``sim.impersonation``). The proxy's gate (``auth.gate.Gate``) does neither: it is
the front proxy, and it passes impersonating requests through for the upstream to decide. So
these two steps live here, around the proxy's, and only the simulator builds this gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from watchcache.auth.authn import UserInfo
from watchcache.auth.gate import Gate
from watchcache.auth.requestheader import RequestHeaderAuthenticator
from watchcache.sim.impersonation import impersonate

if TYPE_CHECKING:
    from watchcache.http.request import Request

__all__ = ["ApiserverGate"]


class ApiserverGate(Gate):
    """``Gate`` with an apiserver's front-proxy authentication first and its ``Impersonate-*`` filter last."""

    resolves_impersonation: ClassVar[bool] = True

    #: Set when the simulator trusts a request-header CA (``--requestheader-client-ca-file``).
    requestheader: RequestHeaderAuthenticator | None = None

    async def authenticate(self, request: Request, peercert: Mapping[str, Any] | None = None) -> UserInfo:
        """Order as kube's: request header, x509, token (or anonymous); then impersonation (400/403)."""
        user = None
        if self.requestheader is not None and peercert:
            user = self.requestheader.authenticate(request.headers, peercert)
        if user is None:
            user = await super().authenticate(request, peercert)
        return await impersonate(self, user, request)
