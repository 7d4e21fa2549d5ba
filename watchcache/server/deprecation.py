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

A custom resource's deprecated version (``deprecated: true`` in its CRD) gets the warning kube's
apiextensions handler adds to every request of that version: the CRD's ``deprecationWarning``, or
its default ("<group>/<version> <Kind> is deprecated; use <group>/<newer> <Kind>"), read from the
CRDs the proxy caches (``CustomDeprecations``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, Final

import orjson

from watchcache.cache.object import CachedObject
from watchcache.dispatch.cacher import Cacher
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


Headers = tuple[tuple[str, str], ...]

# k8s.io/apimachinery/pkg/version: a "kube-like" version, v<major>[(alpha|beta)<minor>].
_KUBE_VERSION = re.compile(r"v([0-9]+)(?:(alpha|beta)([0-9]+))?")
_STABILITY = {"alpha": 0, "beta": 1, None: 2}


def compare_kube_aware(a: str, b: str) -> int:
    """``version.CompareKubeAwareVersionStrings``: GA above beta above alpha (before the major
    version), then major, then minor; a version that is not kube-like is below every one that is,
    and two of them compare in reverse lexical order."""
    if a == b:
        return 0
    ma, mb = _KUBE_VERSION.fullmatch(a), _KUBE_VERSION.fullmatch(b)
    if ma is None or mb is None:
        if ma is None and mb is None:
            return (a < b) - (a > b)
        return -1 if ma is None else 1
    ka = (_STABILITY[ma[2]], int(ma[1]), int(ma[3] or 0))
    kb = (_STABILITY[mb[2]], int(mb[1]), int(mb[3] or 0))
    return (ka > kb) - (ka < kb)


def crd_warnings(crd: dict[str, Any]) -> dict[str, Headers]:
    """The ``Warning`` headers kube's apiextensions handler adds to requests of each version of ``crd``
    (decoded JSON): its deprecated versions' ``deprecationWarning``, or ``defaultDeprecationWarning``'s."""
    spec = crd.get("spec") or {}
    kind = (spec.get("names") or {}).get("kind") or ""
    group = spec.get("group") or ""
    versions = [v for v in spec.get("versions") or () if isinstance(v, dict)]
    out: dict[str, Headers] = {}
    for v in versions:
        if not v.get("deprecated"):
            continue
        name = v.get("name") or ""
        message = v.get("deprecationWarning")
        if message is None:
            message = f"{group}/{name} {kind} is deprecated"
            newer = [
                w.get("name") or ""
                for w in versions
                if w.get("served") and not w.get("deprecated") and compare_kube_aware(name, w.get("name") or "") < 0
            ]
            if newer:
                newest = max(newer, key=functools.cmp_to_key(compare_kube_aware))
                message += f"; use {group}/{newest} {kind}"
        out[name] = (("Warning", warning_value(message)),)
    return out


class CustomDeprecations:
    """The deprecation warnings of custom resources, from the CRDs this worker caches (``crds``:
    their cacher, or None when it is not there or not synced: no warning then)."""

    def __init__(self, crds: Callable[[], Cacher | None]) -> None:
        self._crds = crds
        # CRD name -> (the CRD object read, its warnings per version): decoded once per state of it.
        self._known: dict[str, tuple[CachedObject, dict[str, Headers]]] = {}

    def headers(self, resource: ResourceType) -> Headers:
        cacher = self._crds()
        name = f"{resource.resource}.{resource.group}"
        crd = cacher.cache.get(name) if cacher is not None and cacher.ready else None
        if crd is None:
            self._known.pop(name, None)
            return ()
        known = self._known.get(name)
        if known is None or known[0] is not crd:
            known = self._known[name] = (crd, crd_warnings(orjson.loads(b"{" + crd.body)))
        return known[1].get(resource.version, ())
