"""An upstream that answers with kube-apiserver's recorded bytes (``fixtures/recorded.json``, see capture.py).

On a real socket, in a thread of its own: discovery, each kind's collection in JSON or protobuf
(by the request's Accept) whatever the query, and watches. A protobuf watch sends the recorded
upstream frames of pods and configmaps newer than its ``resourceVersion`` — from ``R`` only once
``release()`` is called, so that reads at the recorded ``R`` see kube's state at ``R`` — then the
kind's recorded bookmark if it is newer still, and stays open until its ``timeoutSeconds``; a protobuf
watch-list (``sendInitialEvents=true``, only the proxy's that asks for no object) sends that bookmark at once. A
JSON watch stays open, silent (the JSON cache stays at ``R``). ``open_watches`` says which watches are
open now (the upstream watches a proxy holds). A metadata LIST
(``as=PartialObjectMetadataList``, what the proxy's consistent-read proofs ask) of a collection or of
one namespace of it answers the recorded objects' metadata at the recorded rv, as kube would with
nothing written since. Anything else (a GET of one object among them): 404.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from watchcache.kubeproto import meta_pb2, objects, wire

FIXTURES = Path(__file__).parent / "fixtures"
PB = "application/vnd.kubernetes.protobuf"


def load() -> dict[str, Any]:
    record: dict[str, Any] = json.loads((FIXTURES / "recorded.json").read_text())
    return record


def b(text: str) -> bytes:
    return base64.b64decode(text)


def from_cache(path: str) -> str:
    """A recorded read as the cache answers it: a GET of one object at any rv (``resourceVersion=0``; one
    without goes to the upstream, as kube-apiserver sends it to etcd); the recorded LISTs name their rv."""
    return path if "?" in path else path + "?resourceVersion=0"


def frame_rv(frame: bytes) -> int:
    _, body = objects.watch_event(frame)
    return int(objects.read_object(objects.unknown(body).raw).resource_version)


class RecordedUpstream:
    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.by_path = {entry["path"]: (kind, entry) for kind, entry in record["kinds"].items()}
        self.watches = record["watches"]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="recorded-upstream", daemon=True)
        self.thread.start()
        self.released: asyncio.Event | None = None
        self.requests: list[tuple[str, str, str]] = []  # (path, query, accept)
        # Watches open now: (path, "protobuf" or "json", timeoutSeconds) -> how many.
        self._open: dict[tuple[str, str, int], int] = {}
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.port}"

    async def _start(self) -> int:
        self.released = asyncio.Event()
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self.handle)
        # Handlers end when their client goes (the proxy's short template watches, a stopped proxy).
        self.runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port: int = self.runner.addresses[0][1]
        return port

    def release(self) -> None:
        """From now on, protobuf watches send the recorded changes after R."""
        assert self.released is not None
        self.loop.call_soon_threadsafe(self.released.set)

    def open_watches(self, path: str, encoding: str, longer_than: int = 10) -> int:
        """Open watches of ``path`` in ``encoding`` whose timeout is over ``longer_than`` s: a reflector's
        (300-600 s), not the 4 s watches that learn a kind's empty object."""
        return sum(n for (p, e, t), n in list(self._open.items()) if p == path and e == encoding and t > longer_than)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        accept = request.headers.get("Accept", "")
        self.requests.append((request.path, request.query_string, accept))
        if request.path in self.record["discovery"]:
            return web.json_response(self.record["discovery"][request.path])
        path = request.path
        if "as=PartialObjectMetadataList" in accept:
            return self._metadata_list(path)
        found = self.by_path.get(path)
        if found is None:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
            return web.json_response(body, status=404)
        kind, entry = found
        protobuf = accept.startswith(PB)
        if request.query.get("watch") in ("1", "true"):
            return await self._watch(request, kind, entry, protobuf)
        if protobuf:
            return web.Response(body=b(entry["protobuf"]), content_type=PB)
        return web.json_response(entry["json"])

    def _metadata_list(self, path: str) -> web.Response:
        """The recorded collection's objects (of one namespace, for a namespaced path), metadata only."""
        namespace = None
        parts = path.split("/")
        if "namespaces" in parts[:-1] and len(parts) > parts.index("namespaces") + 2:
            i = parts.index("namespaces")
            namespace, path = parts[i + 1], "/".join(parts[:i] + parts[i + 2 :])
        found = self.by_path.get(path)
        if found is None:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
            return web.json_response(body, status=404)
        page = objects.list_page(objects.unknown(b(found[1]["protobuf"])).raw)
        items = []
        for raw in page.items:
            attrs = objects.read_object(raw)
            if namespace is None or attrs.namespace == namespace:
                meta = meta_pb2.ObjectMeta(
                    name=attrs.name, namespace=attrs.namespace, resourceVersion=attrs.resource_version
                )
                items.append(meta_pb2.PartialObjectMetadata(metadata=meta))
        listed = meta_pb2.PartialObjectMetadataList(
            metadata=meta_pb2.ListMeta(resourceVersion=page.resource_version), items=items
        )
        type_meta = wire.type_meta("meta.k8s.io/v1", "PartialObjectMetadataList")
        return web.Response(body=wire.envelope(type_meta, listed.SerializeToString()), content_type=PB)

    async def _watch(
        self, request: web.Request, kind: str, entry: dict[str, Any], protobuf: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = PB if protobuf else "application/json"
        await resp.prepare(request)
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        since = int(request.query.get("resourceVersion") or 0)
        key = (request.path, "protobuf" if protobuf else "json", int(timeout))
        self._open[key] = self._open.get(key, 0) + 1
        try:
            async with asyncio.timeout(timeout):
                if protobuf and request.query.get("sendInitialEvents") == "true":
                    # A watch-list: initial events, then their end bookmark. Only the proxy's asks
                    # here, with a selector no object matches (pbreflector: the kind's empty object).
                    frame = b(entry["bookmark"])
                    await resp.write(len(frame).to_bytes(4, "big") + frame)
                elif protobuf:
                    frames = [b(f) for f in self.watches.get(f"upstream-{kind}", [])]
                    if frames and since >= int(self.record["R"]):
                        assert self.released is not None
                        await self.released.wait()
                    last = since
                    for frame in [*frames, b(entry["bookmark"])]:
                        rv = frame_rv(frame)
                        if rv > last:
                            await resp.write(len(frame).to_bytes(4, "big") + frame)
                            last = rv
                await asyncio.sleep(timeout)
        except (TimeoutError, ConnectionResetError):
            pass
        finally:  # also when the client went (the handler is cancelled)
            self._open[key] -= 1
        return resp
