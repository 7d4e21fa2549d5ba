"""What the pre-authentication HTTP limits and the watch budget cost on the hot path.

Loops with no sockets (so that the code, not the kernel or other processes, is what is timed):

* ``http``: ``H1Protocol`` fed one keep-alive request at a time through a fake transport and
  answered by a handler that sends a small body, per request (GET, and a POST with a 250-byte
  body): parsing, the connection and buffer accounting, the body timer, the response head;
* ``h1-chunk``: a watch's ``write_chunk`` of three 3 KB frames on HTTP/1.1 over a (fake) TLS
  transport, per write: what a flush pass does per watcher;
* ``h2-pass``: ten HTTP/2 watch streams of one connection each queue three 3 KB frames, then one
  pump frames them all (``h2`` state machine included), per pass (``--requests`` / 10 passes). Its
  instruction count swings by up to ±10 % with ``--frame-bytes`` in any tree (glibc's reallocations
  of ``h2``'s output buffer depend on the heap's layout): compare trees over several sizes;
* ``fanout``: ``Dispatcher.dispatch`` of one-event batches to 1,000 watchers of one group, then one
  ``take()`` per watcher (what a flush does), per delivery; with and without a ``WatchBudget``.

Run it against this checkout, and against another source tree for a before/after::

    .venv/bin/python -m loadtest.bench.limits
    PYTHONPATH=/path/to/other/checkout:. .venv/bin/python -P -m loadtest.bench.limits   # -P: not cwd's watchcache

Prints the best and the median of several runs (process CPU time, in µs per request and ns
per delivery). For figures that do not move with the machine's load, count instructions of one
loop (``--only``) with callgrind, for two lengths, and subtract::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        .venv/bin/python -m loadtest.bench.limits --only get --runs 1 --requests 1000   # then 5000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import statistics
import time
from typing import Any

import uvloop

from watchcache.cache.events import MODIFIED
from watchcache.cache.object import encode_object
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.http.h2protocol import create_h2_factory

try:  # the modules since the http/ split (issue 24)
    from watchcache.http import h1protocol
    from watchcache.http.h1protocol import create_protocol_factory
    from watchcache.http.limits import H2Limits, HttpLimits
    from watchcache.http.request import Request
    from watchcache.http.response import Response
except ImportError:  # before it: a before/after across the split (PYTHONPATH=/path/to/other/checkout)
    from watchcache.http.protocol import (  # type: ignore[no-redef]
        HttpLimits,
        Request,
        Response,
        create_protocol_factory,
    )

    from watchcache.http import protocol as h1protocol  # type: ignore[no-redef]
    from watchcache.http.h2protocol import H2Limits
from harness.doubles import NullSink
from watchcache.resources import PODS
from watchcache.watchers.watcher import Watcher

BODY = b'{"kind":"Status","apiVersion":"v1","status":"Success","code":200}'
GET = (
    b"GET /api/v1/namespaces/ns-0/pods/pod-1 HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kubectl/v1.32\r\n"
    b"Accept: application/json\r\nAuthorization: Bearer abcdefabcdefabcdef\r\nAccept-Encoding: gzip\r\n\r\n"
)
_POST_BODY = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}' * 4
POST = (
    b"POST /api/v1/namespaces/ns-0/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kubectl/v1.32\r\n"
    b"Accept: application/json\r\nContent-Type: application/json\r\nAuthorization: Bearer abcdefabcdefabcdef\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_POST_BODY), _POST_BODY)
)


class Transport:
    def write(self, data: bytes) -> None:
        pass

    def writelines(self, data: Any) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if key == "peername" else default

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass


async def _answer(request: Request, response: Response) -> None:
    response.send(200, BODY)


async def http_loop(request: bytes, requests: int, runs: int) -> list[float]:
    proto: Any = create_protocol_factory(_answer, HttpLimits())()
    proto.connection_made(Transport())
    out = []
    for _ in range(runs):
        gc.collect()
        start = time.process_time()
        for _ in range(requests):
            proto.data_received(request)
            await asyncio.sleep(0)  # the handler's task runs
        out.append((time.process_time() - start) / requests * 1e6)
    return out


class _SslObject:
    def selected_alpn_protocol(self) -> str:
        return "h2"


class TlsTransport(Transport):
    """A TLS connection's transport, as the protocols see it (ALPN h2, for an HTTP/2 connection)."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return _SslObject() if key == "ssl_object" else super().get_extra_info(key, default)

    def is_closing(self) -> bool:
        return False


def frame(nbytes: int) -> bytes:
    """A watch event line of about ``nbytes``."""
    return b'{"type":"MODIFIED","object":{"metadata":{"name":"x"},"data":"' + b"x" * nbytes + b'"}}\n'


_watches: list[Response] = []


async def _watch(request: Request, response: Response) -> None:
    response.start_chunked(200)
    _watches.append(response)
    await asyncio.sleep(3600)


async def h1_chunk_loop(writes: int, runs: int, frame_bytes: int) -> list[float]:
    _watches.clear()
    proto: Any = create_protocol_factory(_watch, HttpLimits())()
    proto.connection_made(TlsTransport())
    proto.data_received(b"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.sleep(0)
    response, parts = _watches[0], [frame(frame_bytes)] * 3
    out = []
    for _ in range(runs):
        gc.collect()
        start = time.process_time()
        for _ in range(writes):
            response.write_chunk(parts)
        out.append((time.process_time() - start) / writes * 1e6)
    return out


async def h2_pass_loop(passes: int, runs: int, frame_bytes: int, streams: int = 10) -> list[float]:
    import h2.config
    import h2.connection
    import h2.settings

    _watches.clear()
    limits = HttpLimits()
    proto: Any = create_h2_factory(_watch, limits, H2Limits(), limits.admission())()
    proto.connection_made(TlsTransport())
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    client.increment_flow_control_window(2**31 - 1 - 65535)  # windows never close: the code, not flow control
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    for i in range(streams):
        head = [
            (b":method", b"GET"),
            (b":scheme", b"https"),
            (b":path", b"/api/v1/pods?watch=1"),
            (b":authority", b"t"),
        ]
        client.send_headers(1 + 2 * i, head, end_stream=True)
    proto.data_received(client.data_to_send())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    parts = [frame(frame_bytes)] * 3
    out = []
    for _ in range(runs):
        gc.collect()
        start = time.process_time()
        for _ in range(passes):
            for response in _watches:
                response.write_chunk(parts)
            await asyncio.sleep(0)  # the connection's pump
        out.append((time.process_time() - start) / passes * 1e6)
    return out


def fanout_loop(watchers: int, batches: int, runs: int, with_budget: bool) -> list[float]:
    cacher = Cacher(PODS, CacheConfig(history_max_events=1000))
    kwargs: dict[str, Any] = {}
    if with_budget:
        from watchcache.watchers.budget import WatchBudget

        kwargs["budget"] = WatchBudget(1 << 30)
    everything = SelectionPredicate.parse(PODS, None, "", "")
    ws = [Watcher(PODS, everything, 0, NullSink(), **kwargs) for _ in range(watchers)]
    for w in ws:
        cacher.add_watcher(w)
    rv = 0
    out = []
    for _ in range(runs):
        spent = 0.0
        for i in range(batches):
            rv += 1
            obj: dict[str, Any] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"name": f"p{i % 10}", "namespace": "default"},
            }
            obj["metadata"]["resourceVersion"] = str(rv)
            events = cacher.cache.apply([(MODIFIED, encode_object(PODS, obj))])
            gc.disable()
            start = time.process_time()
            cacher.dispatcher.dispatch(events)
            for w in ws:
                w.take()
            spent += time.process_time() - start
            gc.enable()
        out.append(spent / (batches * watchers) * 1e9)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--watchers", type=int, default=1000)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--frame-bytes", type=int, default=3000, help="watch event size in h1-chunk and h2-pass")
    p.add_argument(
        "--only", choices=["get", "post", "h1-chunk", "h2-pass", "fanout", "fanout-budget"], help="one loop (callgrind)"
    )
    args = p.parse_args()
    print(f"source: {inspect.getfile(h1protocol).rsplit('/watchcache/', 1)[0]}")
    for name, request in (("GET", GET), ("POST", POST)):
        if args.only not in (None, name.lower()):
            continue
        t = uvloop.run(http_loop(request, args.requests, args.runs))
        print(f"http {name}: {min(t):.2f} µs/request best, {statistics.median(t):.2f} median")
    if args.only in (None, "h1-chunk"):
        t = uvloop.run(h1_chunk_loop(args.requests, args.runs, args.frame_bytes))
        print(f"h1 watch chunk over TLS: {min(t):.2f} µs/write best, {statistics.median(t):.2f} median")
    if args.only in (None, "h2-pass"):
        t = uvloop.run(h2_pass_loop(max(1, args.requests // 10), args.runs, args.frame_bytes))
        print(f"h2 pass of 10 stream writes: {min(t):.2f} µs/pass best, {statistics.median(t):.2f} median")
    try:
        import watchcache.watchers.budget  # noqa: F401

        variants = [False, True]
    except ImportError:
        variants = [False]
    for with_budget in variants:
        if args.only not in (None, "fanout-budget" if with_budget else "fanout"):
            continue
        t = fanout_loop(args.watchers, args.batches, args.runs, with_budget)
        label = "with a WatchBudget" if with_budget else "no budget"
        print(f"fanout ({label}): {min(t):.0f} ns/delivery best, {statistics.median(t):.0f} median")


if __name__ == "__main__":
    main()
