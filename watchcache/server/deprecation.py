"""kube-apiserver's deprecation warnings, sent on the cached reads of a deprecated kind.

kube-apiserver answers every request to a deprecated version of a built-in kind with a
``Warning: 299 - "<message>"`` header (KEP-1693), whatever the outcome once the request reaches
the resource's handler: 200, and its 400, 404 and 410 (not the 401/403 of authentication and
authorization, nor the 406 of negotiation, which come before). kubectl prints it on stderr and
client-go logs it. The message is built from the type's lifecycle tags
(``k8s:prerelease-lifecycle-gen:deprecated``/``replacement``); these are the ones of v1.36 for
the kinds the proxy caches, read from the reference apiserver
(``curl -D - $KUBE_REFERENCE_URL/api/v1/endpoints``). Requests that pass through carry the
upstream's own header.
"""

from __future__ import annotations

from typing import Final

from watchcache.resources import ResourceType

# (group, version, resource) -> kube's message.
DEPRECATED: Final = {
    ("", "v1", "endpoints"): "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice",
}


def warning_value(message: str) -> str:
    """A ``Warning`` header value as kube writes it (RFC 7234 code 299, agent "-", the text quoted)."""
    return '299 - "' + message.replace("\\", "\\\\").replace('"', '\\"') + '"'


_HEADERS: Final = {key: (("Warning", warning_value(message)),) for key, message in DEPRECATED.items()}


def warning_headers(resource: ResourceType | None) -> tuple[tuple[str, str], ...]:
    """The headers of a cached read of ``resource``: its deprecation ``Warning``, or none."""
    if resource is None:
        return ()
    return _HEADERS.get((resource.group, resource.version, resource.resource), ())
