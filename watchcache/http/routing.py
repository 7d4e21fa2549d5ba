"""Request paths to ``RequestInfo``, as kube-apiserver's ``RequestInfoFactory`` reads them.

``/api/v1/namespaces/ns/pods/name/status`` → group "", version v1, namespace ns,
resource pods, name, subresource status, verb from the method (GET with no name is
list, or watch with ``watch=true`` or the legacy ``/watch/`` prefix).

Only a path in the form kube's router serves as the same resource is read here; any other is
``canonical=False``, for the upstream to answer as sent (``PassReason.NON_CANONICAL``): kube's mux
does not route an empty segment (``//api/...`` is its text 404, ``ns//configmaps`` a NotFound
Status), answers a ``.``/``..`` name with its own 400, routes on the decoded path (an encoded ``/``
splits a segment), takes any bytes (a name that is not UTF-8 is in its 404), and refuses a bad
escape (``%zz``) with Go's text 400. Trailing slashes are read as kube reads them: ignored.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from urllib.parse import unquote, unquote_to_bytes

_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_METHOD_VERBS = {
    "GET": "get",
    "HEAD": "get",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}


@dataclass(frozen=True)
class RequestInfo:
    is_resource_request: bool
    path: str
    verb: str = ""
    api_prefix: str = ""
    group: str = ""
    version: str = ""
    namespace: str = ""
    resource: str = ""
    name: str = ""
    subresource: str = ""
    # The legacy /watch/ path prefix (deprecated, still served by kube-apiserver).
    watch_prefix: bool = False
    # False: a path the cache does not route (the module's docstring), passed through as sent.
    canonical: bool = True


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _segments(raw_path: str) -> list[str] | None:
    """The decoded segments of a raw path (its bytes as latin-1), or None for a path that is not
    canonical (the module's docstring). Split on '/' *before* percent-decoding, so an encoded slash
    cannot forge a segment: one that decodes to '/' (or NUL) is not canonical either."""
    if not raw_path.isascii():  # raw bytes past ASCII: kube reads them as bytes, this as text
        return None
    trimmed = raw_path.rstrip("/")
    if trimmed[:1] == "/":
        trimmed = trimmed[1:]
    if not trimmed:
        return []
    out = trimmed.split("/")
    for i, part in enumerate(out):
        if "%" in part:
            if _BAD_ESCAPE.search(part) is not None:
                return None
            try:
                part = out[i] = unquote(part, errors="strict")
            except UnicodeDecodeError:
                return None
            if "/" in part or "\x00" in part:
                return None
        if not part or part == "." or part == "..":
            return None
    return out


#: Paths up to this long are remembered: flow control and the handler both read a request's
#: info, and clients ask for the same paths again and again (the cache stays under ~1 MB).
_MEMO_PATH = 256


def parse_request_info(method: str, raw_path: str, watch_param: bool) -> RequestInfo:
    """``raw_path``: the path's bytes as sent, as latin-1. A path not canonical, or one kube's
    RequestInfoFactory fails on (``/api/v1/watch``: no resource), is ``canonical=False``, a
    non-resource request: passed through, so its answer is kube's."""
    if len(raw_path) <= _MEMO_PATH:
        return _remembered(method, raw_path, watch_param)
    return _parse(method, raw_path, watch_param)


@functools.lru_cache(maxsize=4096)
def _remembered(method: str, raw_path: str, watch_param: bool) -> RequestInfo:
    return _parse(method, raw_path, watch_param)


def _parse(method: str, raw_path: str, watch_param: bool) -> RequestInfo:
    parts = _segments(raw_path)
    if parts is None:
        return _as_kube_reads(method, raw_path, watch_param)
    return _info(method, "/" + "/".join(parts), parts, watch_param, True)


def _as_kube_reads(method: str, raw_path: str, watch_param: bool) -> RequestInfo:
    """A path that is not canonical, as kube's RequestInfoFactory reads it (the decoded path trimmed
    of '/' and split, empty segments kept): never served from the cache, but its pass-through is
    long-running, and flow control classifies it, as kube does (``//api/v1/pods?watch=1`` is a
    watch to kube's filters, then its mux's 404)."""
    decoded = unquote_to_bytes(raw_path.encode("latin-1")).decode("utf-8", "replace").strip("/")
    return _info(method, raw_path, decoded.split("/") if decoded else [], watch_param, False)


def _info(method: str, path: str, parts: list[str], watch_param: bool, canonical: bool) -> RequestInfo:
    if not parts or parts[0] not in ("api", "apis"):
        return RequestInfo(False, path, verb=method.lower(), canonical=canonical)
    prefix = parts[0]
    rest = parts[1:]
    if prefix == "api":
        if len(rest) < 1:
            return RequestInfo(False, path, verb=method.lower(), api_prefix=prefix, canonical=canonical)
        group, version, rest = "", rest[0], rest[1:]
    else:
        if len(rest) < 2:
            group = rest[0] if rest else ""
            return RequestInfo(False, path, verb=method.lower(), api_prefix=prefix, group=group, canonical=canonical)
        group, version, rest = rest[0], rest[1], rest[2:]
    if not rest:
        return RequestInfo(
            False, path, verb=method.lower(), api_prefix=prefix, group=group, version=version, canonical=canonical
        )

    verb = _METHOD_VERBS.get(method, method.lower())
    watch_prefix = False
    if rest[0] == "watch" and method in ("GET", "HEAD"):
        watch_prefix = True
        verb = "watch"
        rest = rest[1:]
        if not rest:
            # kube's RequestInfoFactory fails on it ("unable to determine kind and namespace from
            # url") and its filter answers 500: not a path kube routes, so not one the cache reads.
            return RequestInfo(False, path, verb=method.lower(), api_prefix=prefix, canonical=False)

    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    # Segments after the subresource are its own (``services/name/proxy/any/path``), as kube reads them.
    subresource = rest[2] if len(rest) >= 3 else ""
    if resource == "namespaces" and namespace and name == namespace and len(rest) >= 2:
        # /api/v1/namespaces/{name}[/status]: the namespace object itself.
        namespace = ""

    if not name:
        if verb == "get":
            verb = "watch" if watch_param else "list"
        elif verb == "delete":
            verb = "deletecollection"
    return RequestInfo(
        True,
        path,
        verb=verb,
        api_prefix=prefix,
        group=group,
        version=version,
        namespace=namespace,
        resource=resource,
        name=name,
        subresource=subresource,
        watch_prefix=watch_prefix,
        canonical=canonical,
    )
