"""The API handler: health, discovery, cached reads, and everything else to the upstream."""

from __future__ import annotations

import dataclasses
import logging

import orjson

from watchcache import apierrors
from watchcache.server.context import ApiContext
from watchcache.server.discovery import Discovery
from watchcache.server.http import Request, Response
from watchcache.server.options import parse_bool, parse_list_options
from watchcache.server.reads import serve_get, serve_list
from watchcache.server.routing import InvalidPath, parse_request_info
from watchcache.server.watch import serve_watch

log = logging.getLogger("watchcache.server")

_TEXT = "text/plain; charset=utf-8"
_READ_VERBS = frozenset({"get", "list", "watch"})
_WRITE_VERBS = frozenset({"create", "update", "patch", "delete"})


def accepts_json(accept: str | None) -> bool:
    """True if the Accept header admits plain JSON (we serve neither protobuf nor Table)."""
    if not accept:
        return True
    for media_range in accept.split(","):
        media, *params = (p.strip() for p in media_range.split(";"))
        if media in ("*/*", "application/*", "application/json") and not any(p.startswith("as=") for p in params):
            return True
    return False


class ApiHandler:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.discovery = Discovery(ctx.registry)

    def readiness(self) -> tuple[bool, list[str]]:
        lines = []
        ok = True
        for resource, cacher in self.ctx.cachers.items():
            ok &= cacher.ready
            state = "ok" if cacher.ready else "failed: not synced"
            lines.append(f"[{'+' if cacher.ready else '-'}]cache-synced:{resource.qualified} {state}")
        return ok, lines

    def cache_stats(self) -> bytes:
        """Per resource: objects, bytes, history window (events, bytes, oldest rv), watchers."""
        out = {}
        for resource, cacher in self.ctx.cachers.items():
            stats = dataclasses.asdict(cacher.cache.stats())
            stats["watchers"] = len(cacher.dispatcher)
            stats["ready"] = cacher.ready
            out[resource.qualified] = stats
        return orjson.dumps(out)

    async def __call__(self, request: Request, response: Response) -> None:
        path = request.path
        method = request.method
        if path in ("/healthz", "/livez"):
            response.send(200, b"ok", content_type=_TEXT)
            return
        if path == "/readyz":
            ok, lines = self.readiness()
            verbose = "verbose" in request.query
            text = (
                "\n".join([*lines, "readyz check passed" if ok else "readyz check failed"])
                if verbose
                else ("ok" if ok else "not ready")
            )
            response.send(200 if ok else 500, text.encode(), content_type=_TEXT)
            return
        if path == "/debug/cache":
            response.send(200, self.cache_stats())
            return
        doc = self.discovery.get(path)
        if doc is not None:
            if method not in ("GET", "HEAD"):
                raise apierrors.StatusError(
                    405,
                    "MethodNotAllowed",
                    f"the server does not allow this method on the requested resource ({method})",
                )
            response.send(200, doc)
            return

        raw = request.raw_path.split(b"?", 1)[0].decode("latin-1")
        try:
            info = parse_request_info(method, raw, parse_bool(request.query_value("watch")))
        except InvalidPath as e:
            raise apierrors.bad_request(str(e)) from None
        if not info.is_resource_request:
            raise apierrors.path_not_found()
        resource = self.ctx.registry.get(info.group, info.version, info.resource)
        if resource is None or (info.namespace and not resource.namespaced):
            raise apierrors.path_not_found()
        if info.verb in _WRITE_VERBS:
            status, written = await self.ctx.upstream.write(request, info, resource)
            response.send(status, written)
            return
        if info.verb not in _READ_VERBS or info.subresource:
            raise apierrors.method_not_supported(resource.group, resource.resource, info.verb)
        if not accepts_json(request.headers.get("accept")):
            raise apierrors.StatusError(
                406, "NotAcceptable", "only the following media types are accepted: application/json"
            )
        cacher = self.ctx.cachers[resource]
        opts = parse_list_options(request.query, watch_path=info.verb == "watch", max_limit=self.ctx.config.max_limit)
        if info.verb == "watch":
            await serve_watch(self.ctx, cacher, info, opts, response)
        elif info.verb == "get":
            await serve_get(self.ctx, cacher, info, opts, response)
        else:
            await serve_list(self.ctx, cacher, info, opts, response)
