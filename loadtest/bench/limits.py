"""What the pre-authentication HTTP limits and the watch budget cost on the hot path.

Two loops, no sockets (so that the code, not the kernel or other processes, is what is timed):

* ``http``: ``H1Protocol`` fed one keep-alive request at a time through a fake transport and
  answered by a handler that sends a small body, per request (GET, and a POST with a 250-byte
  body): parsing, the connection and buffer accounting, the body timer, the response head;
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
from watchcache.http import h1protocol
from watchcache.http.h1protocol import create_protocol_factory
from watchcache.http.limits import HttpLimits
from watchcache.http.request import Request
from watchcache.http.response import Response
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


class Sink:
    def wake(self, watcher: Watcher) -> None:
        pass

    def closed(self, watcher: Watcher, reason: str) -> None:
        pass

    def lagging(self, watcher: Watcher) -> None:
        pass


def fanout_loop(watchers: int, batches: int, runs: int, with_budget: bool) -> list[float]:
    cacher = Cacher(PODS, CacheConfig(history_max_events=1000))
    kwargs: dict[str, Any] = {}
    if with_budget:
        from watchcache.watchers.budget import WatchBudget

        kwargs["budget"] = WatchBudget(1 << 30)
    everything = SelectionPredicate.parse(PODS, None, "", "")
    ws = [Watcher(PODS, everything, 0, Sink(), **kwargs) for _ in range(watchers)]
    for w in ws:
        cacher.add_watcher(w)
    rv = 0
    out = []
    for _ in range(runs):
        spent = 0.0
        for i in range(batches):
            rv += 1
            obj = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": f"p{i % 10}", "namespace": "default"}}
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
    p.add_argument("--only", choices=["get", "post", "fanout", "fanout-budget"], help="one loop (for callgrind)")
    args = p.parse_args()
    print(f"source: {inspect.getfile(h1protocol).rsplit('/watchcache/', 1)[0]}")
    for name, request in (("GET", GET), ("POST", POST)):
        if args.only not in (None, name.lower()):
            continue
        t = uvloop.run(http_loop(request, args.requests, args.runs))
        print(f"http {name}: {min(t):.2f} µs/request best, {statistics.median(t):.2f} median")
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
