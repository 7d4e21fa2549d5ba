"""What a cached read costs below the socket: the API handler answering GET, a LIST page, a watch start.

Loops with no sockets (the code, not the kernel or other processes, is what is timed): an
``ApiHandler`` over a pods cache of ``--namespaces`` x ``--per-namespace`` pods, called with one
request at a time and a response that keeps nothing:

* ``get``: GET of one pod with ``resourceVersion=0`` (no wait);
* ``get-consistent``: GET without resourceVersion, served from the cache once the (fake, instant)
  upstream proved its scope: the freshness wait's path, with the seat given up around it;
* ``list-page``: a LIST page, ``limit=50`` at an exact resourceVersion, each request in another
  namespace (more namespaces than ``ListBodies`` keeps: every page is built, none shared);
* ``list-shared``: the same consistent LIST again and again (a relist storm: the answer is shared);
* ``watch-start``: a watch from the cache's resourceVersion, registered (as over HTTP/1.1 the
  handler returns then), then its client gone;
* ``watch-event``: one watch open; per request, an event applied to the cache and one loop pass, in
  which the flush writes it (``HttpWatchStream.flush``: the frame taken, written, counted).

Run it against this checkout, and against another source tree for a before/after::

    .venv/bin/python -m loadtest.bench.reads
    PYTHONPATH=/path/to/other/checkout:. .venv/bin/python -P -m loadtest.bench.reads   # -P: not cwd's watchcache

Prints the best and the median of several runs (process CPU time, µs per request). For figures
that do not move with the machine's load, count instructions of one loop (``--only``) with
callgrind, for two lengths, and subtract::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python -m loadtest.bench.reads --only get --runs 1 --requests 1000   # then 3000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import parse_qs

import uvloop

from watchcache.cache.continuetoken import ContinueCodec
from watchcache.cache.object import encode_object
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.freshness import Reached
from watchcache.http.request import Request
from watchcache.resources import PODS, ResourceRegistry
from watchcache.server.app import ApiHandler
from watchcache.watchers.flush import FlushScheduler

try:  # since server/context.py was split (issue 35)
    from watchcache.server.config import ServeConfig
    from watchcache.server.context import ApiContext
except ImportError:
    from watchcache.server.context import ApiContext, ServeConfig  # type: ignore[no-redef,attr-defined,unused-ignore]

LOOPS = ("get", "get-consistent", "list-page", "list-shared", "watch-start", "watch-event")


class InstantUpstream:
    """An upstream that proves every scope at once and answers nothing else."""

    answers_old_reads = False
    answers_reads_ahead = False
    delegates_consistent_gets = False

    async def current_rv(self, cacher: Cacher, timeout: float) -> int:
        return cacher.rv

    async def prove_scope(self, cacher: Cacher, namespace: str | None, timeout: float) -> Reached:
        return Reached.AT_ONCE

    @contextlib.contextmanager
    def proving(self, cacher: Cacher) -> Iterator[None]:
        yield

    def unprovable(self, cacher: Cacher) -> bool:
        return False

    def send_early(self, request: Request) -> None:
        return None  # never asked: every GET is answered here (``delegates_consistent_gets``)

    async def forward(self, request: Request, response: Any, info: Any) -> None:
        raise AssertionError(f"{request.path} was passed through: the bench measures cached reads")


class NullResponse:
    """A response that keeps nothing but its status (the transport's work is not measured)."""

    def __init__(self) -> None:
        self.outlives_handler = True  # as HTTP/1.1: a watch's handler returns once it is registered
        self.status = 0
        self.started = False
        self.closed = False
        self.writable = True
        self.close_callbacks: list[Callable[[], None]] = []

    def send(self, status: int, body: Any, *, content_type: str = "", headers: Sequence[Any] = ()) -> None:
        self.started, self.status = True, status

    async def send_stream(self, status: int, parts: Sequence[bytes], **kw: Any) -> None:
        self.started, self.status = True, status

    def start_chunked(self, status: int, *, content_type: str = "", headers: Sequence[Any] = ()) -> None:
        self.started, self.status = True, status

    def write_chunk(self, parts: Sequence[bytes]) -> int:
        return 0

    def end_chunked(self) -> None:
        self.closed = True

    async def drain(self) -> None:
        pass

    def write_buffer_size(self) -> int:
        return 0

    def add_close_callback(self, cb: Callable[[], None]) -> None:
        self.close_callbacks.append(cb)

    def abort(self) -> None:
        self.closed = True

    def gone(self) -> None:
        """The client closed the connection."""
        self.closed = True
        for cb in self.close_callbacks:
            cb()

    def switch_protocols(self, head: bytes, protocol: asyncio.Protocol) -> tuple[asyncio.Transport, bytes]:
        raise NotImplementedError("no upgrades in these loops")


def build(namespaces: int, per_namespace: int) -> tuple[ApiHandler, Cacher]:
    loop = asyncio.get_running_loop()
    cacher = Cacher(PODS, CacheConfig())
    objects, rv = [], 0
    for n in range(namespaces):
        for i in range(per_namespace):
            rv += 1
            obj = {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"name": f"p{i}", "namespace": f"ns-{n}", "resourceVersion": str(rv)},
                "spec": {"nodeName": f"node-{i % 10}", "containers": [{"name": "c", "image": "busybox"}]},
                "status": {"phase": "Running"},
            }
            objects.append(encode_object(PODS, obj))
    cacher.replace(objects, rv)
    ctx = ApiContext(
        registry=ResourceRegistry((PODS,)),
        cachers={PODS: cacher},
        upstream=InstantUpstream(),
        codec=ContinueCodec(b"t" * 32),
        flusher=FlushScheduler(loop),
        config=ServeConfig(),
    )
    return ApiHandler(ctx), cacher


def request(path: str, query: str) -> Request:
    raw = f"{path}?{query}".encode() if query else path.encode()
    return Request("GET", raw, path, parse_qs(query, keep_blank_values=True), {}, b"", "1.1", "bench")


def requests_for(loop_name: str, cacher: Cacher, namespaces: int) -> list[Request]:
    """A cycle of requests for one loop (each ``Request`` is read-only to the handler)."""
    rv = cacher.rv
    if loop_name == "get":
        return [request("/api/v1/namespaces/ns-1/pods/p1", "resourceVersion=0")]
    if loop_name == "get-consistent":
        return [request("/api/v1/namespaces/ns-1/pods/p1", "")]
    if loop_name == "list-page":
        query = f"limit=50&resourceVersion={rv}&resourceVersionMatch=Exact"
        return [request(f"/api/v1/namespaces/ns-{n}/pods", query) for n in range(namespaces)]
    if loop_name == "list-shared":
        return [request("/api/v1/pods", "limit=500")]
    if loop_name in ("watch-start", "watch-event"):
        return [request("/api/v1/namespaces/ns-1/pods", f"watch=1&resourceVersion={rv}&timeoutSeconds=300")]
    raise ValueError(loop_name)


def pod_update(rv: int) -> Any:
    obj = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "p1", "namespace": "ns-1", "resourceVersion": str(rv)},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"},
    }
    return encode_object(PODS, obj)


async def watch_events(requests: int, runs: int, namespaces: int, per_namespace: int) -> list[float]:
    handler, cacher = build(namespaces, per_namespace)
    [watch] = requests_for("watch-event", cacher, namespaces)
    response = NullResponse()
    await handler(watch, response)
    assert response.status == 200 and len(cacher.dispatcher) == 1
    updates = [pod_update(cacher.rv + 1 + i) for i in range(requests * runs)]
    out = []
    for run in range(runs):
        gc.collect()
        start = time.process_time()
        for update in updates[run * requests : (run + 1) * requests]:
            cacher.apply([("MODIFIED", update)])
            await asyncio.sleep(0)  # the flush pass
        out.append((time.process_time() - start) / requests * 1e6)
    if cacher.watch_frames_sent != requests * runs:
        raise AssertionError(f"{cacher.watch_frames_sent} frames written for {requests * runs} events")
    response.gone()
    return out


async def run_loop(loop_name: str, requests: int, runs: int, namespaces: int, per_namespace: int) -> list[float]:
    if loop_name == "watch-event":
        return await watch_events(requests, runs, namespaces, per_namespace)
    handler, cacher = build(namespaces, per_namespace)
    cycle = requests_for(loop_name, cacher, namespaces)
    watch = loop_name == "watch-start"
    out = []
    for _ in range(runs):
        gc.collect()
        start = time.process_time()
        for i in range(requests):
            response = NullResponse()
            await handler(cycle[i % len(cycle)], response)
            if response.status != 200:
                raise AssertionError(f"{loop_name}: {response.status}")
            if watch:
                response.gone()
        out.append((time.process_time() - start) / requests * 1e6)
    if len(cacher.dispatcher):
        raise AssertionError(f"{len(cacher.dispatcher)} watchers left registered")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=LOOPS, help="one loop (for callgrind)")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--namespaces", type=int, default=10)
    p.add_argument("--per-namespace", type=int, default=100)
    args = p.parse_args()
    for name in (args.only,) if args.only else LOOPS:
        times = uvloop.run(run_loop(name, args.requests, args.runs, args.namespaces, args.per_namespace))
        print(f"{name:16s} µs/request: best {min(times):7.2f}  median {statistics.median(times):7.2f}")


if __name__ == "__main__":
    main()
