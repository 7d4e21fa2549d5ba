"""The simulated cluster's ``Impersonate-*`` handling (``kubectl --as``), as kube-apiserver's legacy filter.

After authentication, a request carrying ``Impersonate-User`` (and optionally
``Impersonate-Group``, ``Impersonate-Uid``, ``Impersonate-Extra-<key>``) is checked
attribute by attribute: the requester needs the verb ``impersonate`` on ``users`` (or
``serviceaccounts`` in the namespace of a ``system:serviceaccount:NS:NAME`` user), ``groups``,
``uids`` and ``userextras/<key>`` of the ``authentication.k8s.io`` group, each by name. Then
the request runs as the impersonated user: ``system:authenticated`` added unless a group
says otherwise, a service account's fixed groups when no group is given. A group or extra
without a user is 400. Denials are kube's 403 for the attribute that failed.

kube-apiserver v1.36 tries "constrained impersonation" (``impersonate-on:...`` verbs) first
and words a denial after that check; the sim implements the legacy check only. Repeated
header lines arrive joined with ``", "`` and are split there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import unquote

from watchcache import apierrors
from watchcache.auth.authn import ANONYMOUS_USER, AUTHENTICATED_GROUP, UNAUTHENTICATED_GROUP, UserInfo
from watchcache.auth.authz import ResourceAttributes

if TYPE_CHECKING:
    from watchcache.auth.gate import Gate
    from watchcache.http.request import Request

_EXTRA = "impersonate-extra-"
_AUTHN_GROUP = "authentication.k8s.io"


def _values(value: str) -> list[str]:
    return [v for v in value.split(", ") if v]


async def impersonate(gate: Gate, requester: UserInfo, request: Request) -> UserInfo:
    """The user the request runs as: ``requester``, or whom it may impersonate; raises 400/403."""
    headers = request.headers
    name = headers.get("impersonate-user", "")
    groups = _values(headers.get("impersonate-group", ""))
    uid = headers.get("impersonate-uid", "")
    extra: dict[str, tuple[str, ...]] = {}
    for header, value in headers.items():
        if header.startswith(_EXTRA):
            key = unquote(header[len(_EXTRA) :])
            extra[key] = (*extra.get(key, ()), *_values(value))
    if not name:
        if groups or extra or uid:
            raise apierrors.bad_request(
                "requested impersonation of groups, extra or a uid without impersonating a user"
            )
        return requester
    checks: list[ResourceAttributes] = []
    parts = name.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] and parts[2] and parts[3]:
        checks.append(ResourceAttributes("impersonate", "", "", "serviceaccounts", namespace=parts[2], name=parts[3]))
        if not groups:
            groups = ["system:serviceaccounts", f"system:serviceaccounts:{parts[2]}"]
    else:
        checks.append(ResourceAttributes("impersonate", "", "", "users", name=name))
    checks += [
        ResourceAttributes("impersonate", "", "", "groups", name=g)
        for g in _values(headers.get("impersonate-group", ""))
    ]
    for key, values in extra.items():
        checks += [ResourceAttributes("impersonate", _AUTHN_GROUP, "", "userextras", key, name=v) for v in values]
    if uid:
        checks.append(ResourceAttributes("impersonate", _AUTHN_GROUP, "", "uids", name=uid))
    for attrs in checks:
        await gate.authorize(requester, attrs)
    if name == ANONYMOUS_USER:
        if UNAUTHENTICATED_GROUP not in groups:
            groups.append(UNAUTHENTICATED_GROUP)
    elif AUTHENTICATED_GROUP not in groups and UNAUTHENTICATED_GROUP not in groups:
        groups.append(AUTHENTICATED_GROUP)
    return UserInfo(name, uid, tuple(groups), extra)
