"""Request paths to ``RequestInfo``, as kube-apiserver's ``RequestInfoFactory`` reads them.

``/api/v1/namespaces/ns/pods/name/status`` → group "", version v1, namespace ns,
resource pods, name, subresource status, verb from the method (GET with no name is
list, or watch with ``watch=true`` or the legacy ``/watch/`` prefix).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from urllib.parse import unquote

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


class InvalidPath(ValueError):
    pass


def _segments(raw_path: str) -> list[str]:
    """Split on '/' *before* percent-decoding, so an encoded slash cannot forge a segment."""
    parts = [p for p in raw_path.split("/") if p]
    out = []
    for part in parts:
        seg = unquote(part, errors="strict")
        if seg in (".", "..") or "/" in seg or "\x00" in seg:
            raise InvalidPath(f"invalid path segment {part!r}")
        out.append(seg)
    return out


#: Paths up to this long are remembered: flow control and the handler both read a request's
#: info, and clients ask for the same paths again and again (the cache stays under ~1 MB).
_MEMO_PATH = 256


def parse_request_info(method: str, raw_path: str, watch_param: bool) -> RequestInfo:
    """Raises InvalidPath for a path no resource could be named by."""
    if len(raw_path) <= _MEMO_PATH:
        return _remembered(method, raw_path, watch_param)
    return _parse(method, raw_path, watch_param)


@functools.lru_cache(maxsize=4096)
def _remembered(method: str, raw_path: str, watch_param: bool) -> RequestInfo:
    return _parse(method, raw_path, watch_param)  # an InvalidPath is raised, not remembered


def _parse(method: str, raw_path: str, watch_param: bool) -> RequestInfo:
    try:
        parts = _segments(raw_path)
    except UnicodeDecodeError:
        raise InvalidPath("path is not valid UTF-8") from None
    path = "/" + "/".join(parts)
    if not parts or parts[0] not in ("api", "apis"):
        return RequestInfo(False, path, verb=method.lower())
    prefix = parts[0]
    rest = parts[1:]
    if prefix == "api":
        if len(rest) < 1:
            return RequestInfo(False, path, verb=method.lower(), api_prefix=prefix)
        group, version, rest = "", rest[0], rest[1:]
    else:
        if len(rest) < 2:
            return RequestInfo(False, path, verb=method.lower(), api_prefix=prefix, group=rest[0] if rest else "")
        group, version, rest = rest[0], rest[1], rest[2:]
    if not rest:
        return RequestInfo(False, path, verb=method.lower(), api_prefix=prefix, group=group, version=version)

    verb = _METHOD_VERBS.get(method, method.lower())
    watch_prefix = False
    if rest[0] == "watch" and method in ("GET", "HEAD"):
        watch_prefix = True
        verb = "watch"
        rest = rest[1:]
        if not rest:
            raise InvalidPath("watch needs a resource")

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
    )
