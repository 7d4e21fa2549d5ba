"""A tiny kube-apiserver stand-in on a real socket that counts what the proxy asks of it.

``FakeApi`` serves one collection (``/api/v1/pods``): a LIST answers ``{"metadata":
{"resourceVersion": rv}}`` (or ``list_error``), in metadata only (``PartialObjectMetadataList``,
protobuf) it lists ``objects``; a watch answers ``watch_error`` at once, or
streams a BOOKMARK at ``rv`` after ``bookmark_after`` seconds (kube sends a probe's bookmark
about a second in) and ends at ``timeoutSeconds``. Every request is counted by verb.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from aiohttp import web

from watchcache.kubeproto import meta_pb2 as pb
from watchcache.kubeproto import wire
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.config import UpstreamConfig


def _status(code: int) -> web.Response:
    reason = {403: "Forbidden", 410: "Expired", 500: "InternalError", 429: "TooManyRequests"}.get(code, "Unknown")
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": "x"}
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


class FakeApi:
    def __init__(self) -> None:
        self.rv = 100
        self.list_error = 0
        self.watch_error = 0
        self.bookmark_after = 0.2
        # Event lines (objects) every watch sends first, before its bookmark.
        self.events: list[dict[str, object]] = []
        self.requests: collections.Counter[str] = collections.Counter()
        self.open_watches = 0
        self.max_open_watches = 0
        self.watch_starts: list[float] = []
        # The objects a metadata LIST (PartialObjectMetadataList, protobuf) answers: (namespace, name) -> rv.
        self.objects: dict[tuple[str, str], int] = {}
        # Seconds a metadata LIST takes to answer.
        self.metadata_delay = 0.0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") in ("1", "true"):
            return await self._watch(request)
        self.requests["list"] += 1
        if self.list_error:
            return _status(self.list_error)
        if "as=PartialObjectMetadataList" in request.headers.get("Accept", ""):
            return await self._metadata_list(request.match_info.get("namespace"))
        return web.Response(body=orjson.dumps({"kind": "PodList", "metadata": {"resourceVersion": str(self.rv)}}))

    async def _metadata_list(self, namespace: str | None) -> web.Response:
        self.requests["metadata"] += 1
        rv = self.rv  # the state at the LIST's start, as a consistent read
        items = [
            pb.PartialObjectMetadata(metadata=pb.ObjectMeta(namespace=ns, name=name, resourceVersion=str(obj_rv)))
            for (ns, name), obj_rv in sorted(self.objects.items())
            if namespace is None or ns == namespace
        ]
        listed = pb.PartialObjectMetadataList(metadata=pb.ListMeta(resourceVersion=str(rv)), items=items)
        await asyncio.sleep(self.metadata_delay)
        body = wire.envelope(wire.type_meta("meta.k8s.io/v1", "PartialObjectMetadataList"), listed.SerializeToString())
        return web.Response(body=body, content_type="application/vnd.kubernetes.protobuf")

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        self.requests["watch"] += 1
        self.watch_starts.append(time.monotonic())
        if self.watch_error:
            return _status(self.watch_error)
        self.open_watches += 1
        self.max_open_watches = max(self.max_open_watches, self.open_watches)
        try:
            resp = web.StreamResponse()
            resp.content_type = "application/json"
            await resp.prepare(request)
            timeout = float(request.query.get("timeoutSeconds", "30"))
            started = time.monotonic()
            for obj in self.events:
                await resp.write(orjson.dumps({"type": "MODIFIED", "object": obj}) + b"\n")
            if self.bookmark_after < timeout:  # (kube: none unless due before the deadline)
                await asyncio.sleep(self.bookmark_after)
                meta = {"resourceVersion": str(self.rv)}
                await resp.write(
                    orjson.dumps({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": meta}}) + b"\n"
                )
            await asyncio.sleep(max(0.0, timeout - (time.monotonic() - started)))
            return resp
        finally:
            self.open_watches -= 1


@asynccontextmanager
async def fake_api() -> AsyncIterator[tuple[FakeApi, UpstreamClient]]:
    """The fake on 127.0.0.1:<free port>, and a started client of it."""
    api = FakeApi()
    app = web.Application()
    app.router.add_route("GET", "/api/v1/namespaces/{namespace}/pods", api.handle)
    app.router.add_route("GET", "/{tail:.*}", api.handle)
    # Handlers end when their client goes (a probe closes its watch once it has its bookmark).
    runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = UpstreamClient(UpstreamConfig(server=f"http://127.0.0.1:{port}"))
    await client.start()
    try:
        yield api, client
    finally:
        await client.close()
        await runner.cleanup()
