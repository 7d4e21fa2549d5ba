"""Small builders shared by the unit tests: cached objects and a socket-free Response.

The watch sinks' doubles are in harness/doubles.py (the in-process benchmarks use them too)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from watchcache.cache.object import CachedObject, encode_object
from watchcache.resources import CONFIGMAPS, PODS, ResourceType


def pod(
    name: str,
    ns: str = "default",
    rv: int = 1,
    *,
    labels: dict[str, str] | None = None,
    node: str = "",
    phase: str = "Running",
) -> CachedObject:
    obj: dict[str, Any] = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv), "labels": labels or {}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": phase},
    }
    return encode_object(PODS, obj)


def configmap(
    name: str, ns: str = "default", rv: int = 1, *, labels: dict[str, str] | None = None, data: str = "x"
) -> CachedObject:
    obj = {
        "metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv), "labels": labels or {}},
        "data": {"k": data},
    }
    return encode_object(CONFIGMAPS, obj)


def decode_typed(resource: ResourceType, obj: CachedObject) -> dict[str, Any]:
    return orjson.loads(obj.typed_json(resource))  # type: ignore[no-any-return]


class FakeResponse:
    """Records what a handler writes; flow control is driven by the test.

    ``outlives_handler``: as HTTP/1.1's answers, a watch's handler returns once it is registered
    and the watch goes on without it (False: the handler returns when the watch ends, as HTTP/2's)."""

    def __init__(self, *, outlives_handler: bool = False) -> None:
        self.outlives_handler = outlives_handler
        self.status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.body = b""
        self.chunks: list[bytes] = []
        self.chunked = False
        self.ended = False
        self.writable = True
        self.closed = False
        self.started = False
        self._close_callbacks: list[Callable[[], None]] = []

    def send(
        self,
        status: int,
        body: bytes | Sequence[bytes],
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        assert not self.started
        self.started = True
        self.status = status
        self.content_type = content_type
        self.headers = list(headers)
        self.body = body if isinstance(body, bytes) else b"".join(body)

    async def send_stream(self, status: int, parts: Sequence[bytes], **kw: Any) -> None:
        self.send(status, parts, **kw)

    def start_chunked(
        self, status: int, *, content_type: str = "application/json", headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        assert not self.started
        self.started = True
        self.status = status
        self.headers = list(headers)
        self.chunked = True

    def write_chunk(self, parts: Sequence[bytes]) -> int:
        """As ``Response.write_chunk``: returns the payload size written."""
        assert self.chunked and not self.ended
        chunk = b"".join(parts)
        if chunk:
            self.chunks.append(chunk)
        return len(chunk)

    def end_chunked(self) -> None:
        self.ended = True

    async def drain(self) -> None:
        while not self.writable:
            await asyncio.sleep(0.001)

    def write_buffer_size(self) -> int:
        return 0

    def add_close_callback(self, cb: Callable[[], None]) -> None:
        self._close_callbacks.append(cb)

    def disconnect(self) -> None:
        self.closed = True
        for cb in self._close_callbacks:
            cb()

    def abort(self) -> None:
        self.disconnect()

    def json(self) -> Any:
        return orjson.loads(self.body)

    def events(self) -> list[dict[str, Any]]:
        data = b"".join(self.chunks)
        return [orjson.loads(line) for line in data.splitlines() if line]
