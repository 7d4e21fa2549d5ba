"""Upstream load of the proxy: C clients list and watch through it; how many requests reach the upstream?

Topology: clients (this process, asyncio) -> proxy -> counting relay (this process) -> sim.
The relay forwards bytes untouched and parses only the proxy-to-upstream direction with
httptools, counting every request by verb and resource: that is how upstream LISTs are counted
(the sim counts only its watches). Cross-checked with the sim's ``/debug/cache``
(``watchers``: open watches now; ``watch_requests``: watches ever started) and the proxy's
``/metrics`` (``watchcache_passthrough_requests``, ``apiserver_watch_cache_consistent_read``).

Clients behave like informers: 70% watch the pods of one namespace, 15% configmaps (all
namespaces), 15% nodes. Phases:

1. ``informers``: every client LISTs (``resourceVersion=0``) then WATCHes from the list's
   resourceVersion, all at once; the watches are held for a while under churn;
2. ``relist``: every client LISTs again (``resourceVersion=0``, half of them paged ``limit=50``);
3. ``consistent``: every client LISTs with no resourceVersion ("Most Recent"): the proxy must prove
   freshness with the upstream (docs/consistency.md), which is where upstream requests are expected.

Goal: exactly one upstream watch per resource type, whatever the number of clients.

The production configuration (``--tls``, ``--authentication delegated``, ``--workers N``; ``--production``)
applies to the proxy: clients connect with TLS and send ``alice-token``; with delegated authentication
the sim enforces ``watchcache/sim/policy-example.yaml``, and the proxy's TokenReviews and
SubjectAccessReviews cross the relay, so they are counted with the other upstream requests.
Run: ``.venv/bin/python -m loadtest.bench.upstream --quick`` (200 clients) or without (1,000).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import re
import time
from collections.abc import MutableSequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httptools

from loadtest.bench import lib as bl

_RESOURCE = re.compile(r"^/(?:api/v1|apis/[^/]+/[^/]+)(?:/namespaces/[^/]+)?/([a-z]+)(?:/([^/]+))?(?:/([a-z]+))?$")


# ---------------------------------------------------------------- the counting relay


class Counts:
    def __init__(self) -> None:
        self.by_kind: collections.Counter[tuple[str, str]] = collections.Counter()
        self.log: list[tuple[float, str, str]] = []
        self.received = 0  # bytes the upstream sent back (response heads and bodies)

    def record(self, method: str, target: str) -> None:
        parts = urlsplit(target)
        q = parse_qs(parts.query)
        m = _RESOURCE.match(parts.path)
        resource = m.group(1) if m else "(non-resource)"
        if method != "GET":
            kind = method.lower()
        elif q.get("watch", [""])[0] in ("1", "true"):
            kind = "watch-probe" if q.get("timeoutSeconds", [""])[0] in ("1", "2", "3", "4", "5") else "watch"
        elif m and m.group(2) and not m.group(3):
            kind = "get"
        elif m:
            kind = "list-limit1" if q.get("limit", [""])[0] == "1" else "list"
        else:
            kind = "discovery"
        self.by_kind[(kind, resource)] += 1
        self.log.append((time.time(), kind, resource))

    def snapshot(self) -> collections.Counter[tuple[str, str]]:
        return collections.Counter(self.by_kind)


class _Parser:
    """httptools callbacks for the proxy -> upstream byte stream of one connection."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts
        self.url = b""
        self.parser = httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self.url = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_message_complete(self) -> None:
        self.counts.record(self.parser.get_method().decode(), self.url.decode("latin-1"))


async def start_relay(upstream: tuple[str, int], counts: Counts) -> tuple[asyncio.AbstractServer, int]:
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, parser: _Parser | None) -> None:
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                if parser is not None:
                    with contextlib.suppress(httptools.HttpParserError):
                        parser.parser.feed_data(data)
                else:
                    counts.received += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*upstream)
        except OSError:
            client_w.close()
            return
        # Cancelled at the end of a run with connections still open: nothing to report.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pipe(client_r, up_w, _Parser(counts)), pipe(up_r, client_w, None))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


# ---------------------------------------------------------------- clients


class Client:
    """One informer-like client on raw keep-alive HTTP/1.1 (list, then watch on another connection)."""

    def __init__(self, base: tuple[str, int], path: str, tls: bool = False, token: str = "") -> None:
        self.base = base
        self.path = path
        self.ssl = bl.client_tls() if tls else None
        self.auth = bl.auth_header(token).decode()
        self.rv = ""
        self.watch_bytes = 0
        self.watch_frames = 0
        self.watch_status = 0
        self.errors: list[str] = []
        self._watch_task: asyncio.Task[None] | None = None
        self._list_conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def _request(self, target: str) -> tuple[int, bytes]:
        if self._list_conn is None:
            self._list_conn = await asyncio.open_connection(*self.base, ssl=self.ssl)
        r, w = self._list_conn
        w.write(f"GET {target} HTTP/1.1\r\nHost: bench\r\nAccept: application/json\r\n{self.auth}\r\n".encode())
        head = await r.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        m = re.search(rb"(?i)content-length: *(\d+)", head)
        if m:
            body = await r.readexactly(int(m.group(1)))
        else:  # chunked (streamed LIST or pass-through)
            chunks = []
            while True:
                size = int((await r.readuntil(b"\r\n")).strip() or b"0", 16)
                if size == 0:
                    await r.readuntil(b"\r\n")
                    break
                chunks.append(await r.readexactly(size))
                await r.readexactly(2)
            body = b"".join(chunks)
        return status, body

    async def list(self, query: str, paged: int = 0) -> int:
        """LIST (following continue when paged); returns the number of requests made."""
        sep = "&" if "?" in self.path else "?"
        target = f"{self.path}{sep}{query}" if query else self.path
        if paged:
            target += f"{'&' if '?' in target else '?'}limit={paged}"
        n = 0
        while True:
            status, body = await self._request(target)
            n += 1
            if status != 200:
                self.errors.append(f"list {status}: {body[:150]!r}")
                return n
            m = re.search(rb'"resourceVersion":"(\d+)"', body[:4096])
            if m:
                self.rv = m.group(1).decode()
            c = re.search(rb'"continue":"([^"]+)"', body[:4096])
            if not paged or not c:
                return n
            base = f"{self.path}{sep}limit={paged}&continue="
            target = base + c.group(1).decode()

    def start_watch(self, established: asyncio.Event, counter: MutableSequence[int], total: int) -> None:
        self._watch_task = asyncio.ensure_future(self._watch(established, counter, total))

    async def _watch(self, established: asyncio.Event, counter: MutableSequence[int], total: int) -> None:
        sep = "&" if "?" in self.path else "?"
        target = f"{self.path}{sep}watch=1&resourceVersion={self.rv}&allowWatchBookmarks=true&timeoutSeconds=3600"
        try:
            r, w = await asyncio.open_connection(*self.base, ssl=self.ssl)
            w.write(f"GET {target} HTTP/1.1\r\nHost: bench\r\nAccept: application/json\r\n{self.auth}\r\n".encode())
            head = await r.readuntil(b"\r\n\r\n")
            self.watch_status = int(head.split(b" ", 2)[1])
            counter[0] += 1
            if counter[0] >= total:
                established.set()
            while True:
                data = await r.read(1 << 16)
                if not data:
                    break
                self.watch_bytes += len(data)
                self.watch_frames += data.count(b"}\n")
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as e:
            self.errors.append(f"watch: {e!r}")
            counter[0] += 1
            if counter[0] >= total:
                established.set()

    async def close(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
        if self._list_conn is not None:
            self._list_conn[1].close()


# ---------------------------------------------------------------- phases


def sim_watch_stats(sim: bl.Proc) -> dict[str, dict[str, int]]:
    res = bl.get_json(sim.url + "/debug/cache")["resources"]
    return {k: {"watchers": v["watchers"], "watch_requests": v["watch_requests"]} for k, v in res.items()}


def proxy_metrics(proxy: bl.Proc) -> dict[str, float]:
    """Pass-through and consistent-read counters (summed over whichever workers answered)."""
    text = bl.get_bytes(proxy.url + "/metrics").decode()
    out: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        if line.startswith(("watchcache_passthrough_requests_total", "apiserver_watch_cache_consistent_read_total")):
            name, _, value = line.rpartition(" ")
            out[name] += float(value)
    return dict(out)


def diff(a: collections.Counter[tuple[str, str]], b: collections.Counter[tuple[str, str]]) -> dict[str, int]:
    d = b - a
    return {f"{k}:{r}": n for (k, r), n in sorted(d.items())}


async def amain(args: argparse.Namespace) -> None:
    info = bl.machine_info()
    bl.log(f"machine: {info}")
    t_start = time.monotonic()
    counts = Counts()
    sim = proxy = None
    relay = None
    prod: bl.Production = args.prod
    files = bl.ProductionFiles(prod.delegated, prod.tls)
    clients: list[Client] = []
    phases: list[dict[str, Any]] = []
    try:
        sim = bl.start_sim(objects=args.objects, namespaces=10, churn=args.churn, extra=files.sim_flags())
        bl.wait_ready(sim)
        relay, relay_port = await start_relay(sim.address, counts)
        bl.log(f"proxy: {prod.label}")
        proxy = await asyncio.to_thread(
            bl.start_proxy, f"http://127.0.0.1:{relay_port}", extra=[*files.proxy_flags(prod), *args.proxy_args]
        )
        await asyncio.to_thread(bl.wait_objects, proxy, "pods", args.objects)
        await asyncio.sleep(1.0)
        sync = counts.snapshot()
        sim0 = await asyncio.to_thread(sim_watch_stats, sim)
        bl.log(f"proxy synced; upstream requests so far: {diff(collections.Counter(), sync)}")
        cached = sorted(r for r, v in sim0.items() if v["watchers"] > 0)
        base = proxy.address
        for i in range(args.clients):
            u = i % 20
            if u < 14:
                path = f"/api/v1/namespaces/ns-{i % 10}/pods"
            elif u < 17:
                path = "/api/v1/configmaps"
            else:
                path = "/api/v1/nodes"
            # alice may read pods and configmaps; nodes only the admin (system:masters) of the policy.
            token = bl.ADMIN_TOKEN if files.policy and path == "/api/v1/nodes" else files.client_token
            clients.append(Client(base, path, proxy.tls, token))

        async def phase(name: str, work: Any) -> dict[str, Any]:
            before = counts.snapshot()
            # In a thread: the relay lives on this loop, and with delegated authentication the
            # proxy reviews the scrape's token through it (a blocking call here would hold the
            # review until it times out: a 401).
            m0 = await asyncio.to_thread(proxy_metrics, proxy)
            t0 = time.monotonic()
            requests = await work()
            took = time.monotonic() - t0
            await asyncio.sleep(0.5)
            after = counts.snapshot()
            m1 = await asyncio.to_thread(proxy_metrics, proxy)
            sims = await asyncio.to_thread(sim_watch_stats, sim)
            p = {
                "phase": name,
                "client_requests": requests,
                "seconds": round(took, 2),
                "upstream_requests": diff(before, after),
                "sim_open_watches": {r: v["watchers"] for r, v in sims.items() if v["watchers"]},
                "sim_watch_requests_total": {r: v["watch_requests"] for r, v in sims.items() if v["watch_requests"]},
                "proxy_counters_delta": {k: m1.get(k, 0) - m0.get(k, 0) for k in m1 if m1.get(k, 0) != m0.get(k, 0)},
                "client_errors": sum(len(c.errors) for c in clients),
                "first_errors": [e for c in clients for e in c.errors][:3],
            }
            phases.append(p)
            bl.log(f"phase {name}: {p}")
            return p

        established = asyncio.Event()
        counter = [0]

        async def informers() -> int:
            sem = asyncio.Semaphore(args.concurrency)

            async def one(c: Client) -> int:
                async with sem:
                    n = await c.list("resourceVersion=0")
                c.start_watch(established, counter, len(clients))
                return n

            n = sum(await asyncio.gather(*(one(c) for c in clients)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(established.wait(), 120)
            await asyncio.sleep(args.hold)
            return n + len(clients)

        async def relist() -> int:
            sem = asyncio.Semaphore(args.concurrency)

            async def one(i: int, c: Client) -> int:
                async with sem:
                    return await c.list("resourceVersion=0", paged=50 if i % 2 else 0)

            return sum(await asyncio.gather(*(one(i, c) for i, c in enumerate(clients))))

        async def consistent() -> int:
            sem = asyncio.Semaphore(args.concurrency)

            async def one(c: Client) -> int:
                async with sem:
                    return await c.list("")

            return sum(await asyncio.gather(*(one(c) for c in clients)))

        await phase("informers", informers)
        frames = sum(c.watch_frames for c in clients)
        watching = sum(1 for c in clients if c.watch_status == 200)
        await phase("relist", relist)
        await phase("consistent", consistent)
        end = counts.snapshot()
        sim_end = await asyncio.to_thread(sim_watch_stats, sim)
    finally:
        for c in clients:
            await c.close()
        if proxy is not None:
            await asyncio.to_thread(proxy.stop)
        if relay is not None:
            relay.close()
        bl.stop_all([sim])
        files.cleanup()

    # ---- report
    total_watch = {r: n for (k, r), n in end.items() if k == "watch"}
    rows = []
    for p in phases:
        up = p["upstream_requests"]
        rows.append(
            [
                p["phase"],
                p["client_requests"],
                p["seconds"],
                sum(n for k, n in up.items() if k.startswith("watch:")),
                sum(n for k, n in up.items() if k.startswith("watch-probe:")),
                sum(n for k, n in up.items() if k.startswith("list:")),
                sum(n for k, n in up.items() if k.startswith("list-limit1:")),
                sum(n for k, n in up.items() if k.startswith("get:")),
                sum(n for k, n in up.items() if k.startswith(("discovery:", "post:", "put:", "patch:", "delete:"))),
                p["client_errors"],
            ]
        )
    print()
    bl.print_table(
        [
            "phase",
            "client reqs",
            "s",
            "up watch",
            "up probe watch",
            "up list",
            "up list limit=1",
            "up get",
            "up other",
            "client errors",
        ],
        rows,
        title=(
            f"Upstream requests caused by {args.clients} clients (70% pods/namespace, 15% configmaps, 15% nodes), "
            "counted by a relay between proxy and sim"
        ),
    )
    sync_rows = sorted(diff(collections.Counter(), sync).items())
    print(f"during the proxy's own start (sync): {dict(sync_rows)}")
    print(f"upstream watches per resource over the whole run (relay): {total_watch}")
    print(f"sim /debug/cache at the end: open watches { ({r: v['watchers'] for r, v in sim_end.items()}) }")
    print(f"clients watching: {watching}/{args.clients}; frames received during the hold: {frames}")
    # The sim names resources "deployments.apps"; the relay by their path segment, "deployments".
    measured = {
        r: {"watches_started": total_watch.get(r.split(".")[0], 0), "open_at_end": sim_end[r]["watchers"]}
        for r in cached
    }
    one_each = all(v["watches_started"] == 1 and v["open_at_end"] == 1 for v in measured.values())
    goals = {
        "one_upstream_watch_per_resource": {
            "goal": "exactly 1 per cached resource (consistent-read probe watches counted apart)",
            "measured": measured,
            "met": one_each,
        }
    }
    print(f"goal one_upstream_watch_per_resource: {'MET' if one_each else 'NOT MET'}")
    bl.bench_line(
        "upstream",
        {
            "mode": "quick" if args.quick else "full",
            "machine": info,
            "seconds": round(time.monotonic() - t_start, 1),
            "clients": args.clients,
            "counting": "relay parsing proxy->sim requests (httptools); sim /debug/cache; proxy /metrics",
            "sync_requests": dict(sync_rows),
            "goals": goals,
            "phases": phases,
            "watching_clients": watching,
            "frames_during_hold": frames,
        },
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="200 clients, 3 s hold (< 60 s)")
    p.add_argument("--clients", type=int, help="default 1000 (quick 200)")
    p.add_argument("--objects", type=int, default=1000, help="pods in the sim (10 namespaces)")
    p.add_argument("--churn", type=float, default=20.0, help="sim writes/s")
    p.add_argument("--hold", type=float, help="seconds the watches are held (default 15, quick 3)")
    p.add_argument("--concurrency", type=int, default=200, help="LISTs in flight at once")
    p.add_argument("--proxy-args", type=lambda s: s.split(), default=[], help="extra flags for the proxy")
    bl.add_production_flags(p)
    args = p.parse_args()
    args.prod = bl.production_from_args(args)
    args.clients = args.clients or (200 if args.quick else 1000)
    args.hold = args.hold if args.hold is not None else (3.0 if args.quick else 15.0)
    bl.raise_nofile()
    import uvloop

    uvloop.run(amain(args))


if __name__ == "__main__":
    main()
