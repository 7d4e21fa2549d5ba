"""LIST and GET through the user's FastHttpSession, reported as request types LIST and GET.

Bodies are parsed with orjson (~7 µs per 4 KB object, 2-3x the stdlib: docs/lab/performance-notebook.md) so that a
3 MB LIST costs the load generator milliseconds, not the tens a stdlib parse would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import orjson


class ReadFailed(Exception):
    pass


@dataclass
class Page:
    items: list[dict[str, Any]]
    resource_version: int
    continue_token: str


def collection_path(resource: str, namespace: str | None) -> str:
    if namespace:
        return f"/api/v1/namespaces/{namespace}/{resource}"
    return f"/api/v1/{resource}"


def read(
    client: Any,
    kind: str,
    path: str,
    params: dict[str, str],
    name: str,
    headers: dict[str, str],
    *,
    allow_not_found: bool = False,
) -> dict[str, Any] | None:
    """GET ``path``; the parsed body, or None (a failure was reported, or an allowed 404)."""
    url = f"{path}?{urlencode(params)}" if params else path
    with client.get(url, name=name, headers=headers, catch_response=True) as response:
        response.request_meta["request_type"] = kind
        status = response.status_code
        if status == 200:
            try:
                body = orjson.loads(response.content)
            except orjson.JSONDecodeError as e:
                response.failure(f"invalid JSON: {e}")
                return None
            response.success()
            return body
        if status == 404 and allow_not_found:
            # The object was deleted after the list we learned its name from.
            response.success()
            return None
        if status:
            text = (response.content or b"")[:200].decode("utf-8", "replace")
            response.failure(f"HTTP {status}: {text}")
        else:
            response.failure(getattr(response, "error", None) or "no response")
        return None


def list_page(
    client: Any,
    path: str,
    params: dict[str, str],
    name: str,
    headers: dict[str, str],
    kind: str = "LIST",
) -> Page | None:
    body = read(client, kind, path, params, name, headers)
    if body is None:
        return None
    meta = body.get("metadata") or {}
    return Page(body.get("items") or [], int(meta.get("resourceVersion") or 0), meta.get("continue") or "")


def list_all(
    client: Any,
    path: str,
    params: dict[str, str],
    name: str,
    headers: dict[str, str],
    *,
    max_pages: int = 1000,
) -> Page | None:
    """A LIST followed through its ``continue`` tokens; later pages are reported as ``name (continue)``.

    The result carries the first page's resourceVersion: every page is read at it (a continue
    token pins the snapshot), which is also where a watch must start.
    """
    first = list_page(client, path, params, name, headers)
    if first is None:
        return None
    items, token, pages = list(first.items), first.continue_token, 1
    while token and pages < max_pages:
        following = {k: v for k, v in params.items() if k not in ("resourceVersion", "resourceVersionMatch")}
        following["continue"] = token
        page = list_page(client, path, following, f"{name} (continue)", headers)
        if page is None:
            return None
        items.extend(page.items)
        token = page.continue_token
        pages += 1
    return Page(items, first.resource_version, "")


def object_key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata", {})
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))
