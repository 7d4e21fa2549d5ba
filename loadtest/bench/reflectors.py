"""Helper process: client-go reflectors that all start at once (``python -m loadtest.bench.reflectors``).

Each reflector does what client-go's does when its process starts (or after a network partition,
an upstream restart, a proxy rollout): LIST with ``resourceVersion=0&limit=500`` (following
``continue`` if the server pages it), then WATCH from the list's resourceVersion with bookmarks.
A failed request (429, 5xx, a refused connection) is retried after ``Retry-After`` or the
reflector's backoff (0.8 s doubling to 30 s, jittered). Each reflector has its own connection
(``--h2``: its own HTTP/2 connection), as separate processes would.

Per reflector: when its LIST completed (client-go's ``HasSynced``) and when its WATCH was
accepted; requests, pages, bytes, failed requests by status. Only the first 64 KB of a LIST
body are kept (its ListMeta is at the front), so thousands of 15 MB lists fit in one process.

Commands: ``go {at}`` (start every reflector at wall-clock time ``at``) → per-reflector results
once all are watching or ``deadline`` passes; ``snap``; ``quit``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import time
from typing import Any

from loadtest.bench import helperio
from loadtest.bench.kubeclient import (
    ACCEPT_JSON,
    ACCEPT_PROTOBUF,
    Collect,
    Conn,
    Sink,
    Target,
    add_target_flags,
    list_meta,
    query,
)
from loadtest.bench.lib import raise_nofile


class WatchOpen(Sink):
    def __init__(self) -> None:
        self.opened: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.bytes = 0

    def on_status(self, status: int, content_type: str) -> None:
        super().on_status(status, content_type)
        if not self.opened.done():
            self.opened.set_result(status)

    def on_data(self, data: bytes) -> None:
        self.bytes += len(data)

    def on_end(self, error: str | None) -> None:
        if not self.opened.done():
            self.opened.set_result(0)


class Reflector:
    def __init__(self, index: int) -> None:
        self.index = index
        self.listed: float | None = None
        self.watching: float | None = None
        self.requests = 0
        self.pages = 0
        self.bytes = 0
        self.items_rv = ""
        self.failures: collections.Counter[str] = collections.Counter()
        self.conn: Conn | None = None
        self.watch: WatchOpen | None = None


async def reflect(r: Reflector, target: Target, args: argparse.Namespace, accept: str, t0: float) -> None:
    backoff = 0.8
    path = args.path
    while True:
        retry_after = 0.0
        try:
            if r.conn is None or r.conn.closed:
                r.conn = await target.connect()
            if r.listed is None:
                rv, cont = "", ""
                while True:
                    # client-go's pager: the first page at rv=0, the next ones by their continue token.
                    q = (
                        query(**{"continue": cont, "limit": args.limit})
                        if cont
                        else query(limit=args.limit, resourceVersion="0")
                    )
                    c = Collect(keep=1 << 16)
                    r.conn.request("GET", path + q, c, accept=accept)
                    await c.done
                    r.requests += 1
                    r.bytes += c.size
                    if c.error is not None:
                        raise ConnectionError(c.error)
                    if c.status != 200:
                        r.failures[f"LIST {c.status}"] += 1
                        retry_after = c.retry_after
                        raise _Retry
                    r.pages += 1
                    page_rv, cont = list_meta(c.body, c.content_type)
                    rv = rv or page_rv
                    if not cont:
                        break
                r.items_rv = rv
                r.listed = time.time() - t0
            w = WatchOpen()
            timeout = int(args.watch_timeout * (1 + random.random()))
            watch = query(allowWatchBookmarks=True, resourceVersion=r.items_rv, timeoutSeconds=timeout, watch=True)
            r.conn.request("GET", path + watch, w, accept=accept)
            r.requests += 1
            status = await w.opened
            if status == 200:
                r.watch = w
                r.watching = time.time() - t0
                return
            r.failures[f"WATCH {status}"] += 1
            retry_after = w.retry_after
            if status == 410:
                r.listed = None  # too old: relist, as a reflector does
        except _Retry:
            pass
        except (OSError, ConnectionError, RuntimeError) as e:
            r.failures[type(e).__name__] += 1
            r.conn = None
        await asyncio.sleep(max(retry_after, backoff * (1 + random.random())))
        backoff = min(backoff * 2, 30.0)


class _Retry(Exception):
    pass


async def main_async(args: argparse.Namespace) -> None:
    target = Target(args.target, args.token, args.ca, h2=args.h2)
    accept = ACCEPT_PROTOBUF if args.accept == "protobuf" else ACCEPT_JSON
    reflectors = [Reflector(i) for i in range(args.count)]
    helperio.emit({"event": "ready", "reflectors": len(reflectors)})
    tasks: list[asyncio.Task[None]] = []
    async for cmd in helperio.commands():
        what = cmd["cmd"]
        if what == "go":
            at = float(cmd["at"])
            await asyncio.sleep(max(0.0, at - time.time()))
            cpu0 = helperio.rusage_cpu()
            tasks = [asyncio.ensure_future(reflect(r, target, args, accept, at)) for r in reflectors]
            await asyncio.wait(tasks, timeout=float(cmd.get("deadline", 600)))
            failures: collections.Counter[str] = collections.Counter()
            for r in reflectors:
                failures.update(r.failures)
            out: dict[str, Any] = {
                "listed": [r.listed for r in reflectors],
                "watching": [r.watching for r in reflectors],
                "requests": sum(r.requests for r in reflectors),
                "pages": sum(r.pages for r in reflectors),
                "bytes": sum(r.bytes for r in reflectors),
                "failures": dict(failures),
                "rvs": sorted({r.items_rv for r in reflectors})[:5],
                "cpu": helperio.rusage_cpu() - cpu0,
            }
            helperio.emit(out)
        elif what == "snap":
            helperio.emit(
                {
                    "open": sum(1 for r in reflectors if r.watch is not None and r.watch.opened.done()),
                    "watch_bytes": sum(r.watch.bytes for r in reflectors if r.watch is not None),
                }
            )
    for task in tasks:
        task.cancel()
    for r in reflectors:
        if r.conn is not None:
            r.conn.close()
    await asyncio.sleep(0.1)


def main(argv: list[str] | None = None) -> None:
    import uvloop

    raise_nofile()
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_target_flags(p)
    p.add_argument("--h2", action="store_true")
    p.add_argument("--accept", choices=("protobuf", "json"), default="protobuf")
    p.add_argument("--path", required=True, help="the collection, e.g. /api/v1/namespaces/x/pods")
    p.add_argument("--count", type=int, required=True, help="reflectors in this process")
    p.add_argument("--limit", type=int, default=500)
    p.add_argument("--watch-timeout", type=float, default=300.0)
    uvloop.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    main()
