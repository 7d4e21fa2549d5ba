"""What a restart costs a fleet of informers: the proxy restarting vs the apiserver (or the sim) restarting.

``python -m loadtest.bench.restart`` (``make bench-restart``): 1,000 informers on a 10,000-object
resource (ConfigMaps), a writer updating 10 of them per second; then one restart, and per run:

* the time until every client is watching again (a watch answered 200 after the restart, after
  its relist if it had to), its median and maximum;
* the requests and bytes the upstream served from the restart until then (a counting relay in
  front of it: requests by kind, response bytes; a TLS-terminating one in front of a kube-apiserver,
  ``harness/kube/requestlog.py``; for a direct upstream, also what the clients sent and
  received, since they are its clients);
* relists (LISTs after the first, and the 410s that caused them).

Runs (``--runs``):

* ``proxy-sim``: clients -> ``watchcache serve --workers 2`` -> relay -> ``watchcache sim``;
  SIGTERM the proxy, a new process on the same port (a rolling update);
* ``sim``: clients -> relay -> ``watchcache sim --state-file``; SIGTERM the sim, restart it on
  its port with its journal (objects and resourceVersions survive; its watch history does not,
  as kube-apiserver's watch cache);
* ``kube``: clients -> a kube-apiserver v1.36 of the kit's binaries, of our own over the kit's etcd
  (``harness/kube/private.py``; the kit's apiserver is shared and must not be restarted);
  SIGTERM it, start it again (only with the kit: ``eval "$(../shared/tools/kube-reference/env.sh)"``);
* ``proxy-kube``: clients -> ``watchcache serve --workers 2`` -> that kube-apiserver; restart the proxy.

The clients (one asyncio process, raw HTTP/1.1) do what client-go's reflector (v1.36,
``tools/cache/reflector.go``, without WatchList) does: LIST ``resourceVersion=0&limit=500``
(following ``continue``), WATCH from the list's rv with bookmarks, resume from the last rv seen;
after a watch's 410, LIST again *from the last rv seen* (``relistResourceVersion``; a watch's 410
does not mark it unavailable), paged with ``limit=500`` only if the first rv=0 LIST came back
paged (``paginatedResult``: then the relist is an Exact read at that rv), else unpaged (Not older
than); a LIST answered 410 is retried from "" (a consistent read). While the server is down, a
jittered backoff (0.1 s doubling to 2 s). They read only what a reflector needs (list and event
rvs), not the objects. A client is *watching again* once a watch begun after the restart has
delivered an event or a bookmark. ``--quick``: 200 informers, 2,000 objects.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import re
import signal
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.processes import free_port
from loadtest.bench import lib as bl
from loadtest.bench.upstream import Counts, start_relay

PATH = "/api/v1/namespaces/{ns}/configmaps"
RV = re.compile(rb'"resourceVersion":"(\d+)"')
CONTINUE = re.compile(rb'"continue":"([^"]+)"')


# ---------------------------------------------------------------- the informers


@dataclass
class Stats:
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    received: int = 0  # response bytes (heads and bodies)


class Informer:
    """client-go's reflector, reading only resourceVersions (see the module docstring).

    Not ``harness.fleet.Informer``: that one decodes and records every event for the checker (aiohttp,
    JSON, digests), which at a thousand informers on one loop would be most of what this measures."""

    def __init__(self, target: tuple[str, int], path: str, ssl_ctx: ssl.SSLContext | None, token: str) -> None:
        self.target = target
        self.path = path
        self.ssl = ssl_ctx
        self.auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.rv = ""
        self.lists = 0
        self.gone = 0
        self.errors = 0
        self.events = 0
        self.watching_since = 0.0  # monotonic time of the current watch's 200 (0: not watching)
        self.live_since = 0.0  # start of the last watch that delivered an event or bookmark
        self.paginated = False  # client-go's paginatedResult: the first (rv=0) LIST came back in pages
        self.stats = Stats()
        self.stop = asyncio.Event()
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._backoff = 0.1

    def _head(self, target: str) -> bytes:
        return f"GET {target} HTTP/1.1\r\nHost: bench\r\nAccept: application/json\r\n{self.auth}\r\n".encode()

    async def _read_body(self, r: asyncio.StreamReader, head: bytes) -> bytes:
        m = re.search(rb"(?i)content-length: *(\d+)", head)
        if m:
            return await r.readexactly(int(m.group(1)))
        chunks: list[bytes] = []
        while True:
            size = int((await r.readuntil(b"\r\n")).strip() or b"0", 16)
            if size == 0:
                await r.readuntil(b"\r\n")
                return b"".join(chunks)
            chunks.append(await r.readexactly(size + 2))
            chunks[-1] = chunks[-1][:-2]

    async def _get(self, target: str, kind: str) -> tuple[int, bytes]:
        """One request on the keep-alive list connection (reopened when the server closed it)."""
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = await asyncio.open_connection(*self.target, ssl=self.ssl, limit=1 << 20)
            r, w = self._conn
            try:
                self.stats.requests[kind] += 1
                w.write(self._head(target))
                head = await r.readuntil(b"\r\n\r\n")
                body = await self._read_body(r, head)
                self.stats.received += len(head) + len(body)
                return int(head.split(b" ", 2)[1]), body
            except (OSError, asyncio.IncompleteReadError, ConnectionError):
                w.close()
                self._conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def list(self) -> bool:
        """client-go's ``Reflector.list``: rv=0 the first time, else the last rv seen; see the module docstring."""
        first = not self.lists
        rv = "0" if first else self.rv
        self.lists += 1
        paged = first or self.paginated or rv in ("", "0")
        query = f"limit=500&resourceVersion={rv}" if paged else f"resourceVersion={rv}"
        pages = 0
        while True:
            status, body = await self._get(f"{self.path}?{query}", "list" if first else "relist")
            pages += 1
            if status == 410 and rv:
                self.gone += 1
                rv, query = "", "limit=500" if self.paginated else ""
                continue
            if status != 200:
                self.errors += 1
                return False
            head = body[:4096]
            if "continue" not in query:
                m = RV.search(head)
                self.rv = m.group(1).decode() if m else self.rv
            c = CONTINUE.search(head)
            if not c:
                if first and pages > 1:
                    self.paginated = True
                return True
            query = f"limit=500&continue={c.group(1).decode()}"

    async def watch(self) -> bool:
        """One watch from ``rv``, read to its end; True if it ended with a 410 (relist)."""
        target = f"{self.path}?watch=1&allowWatchBookmarks=true&timeoutSeconds=3600&resourceVersion={self.rv}"
        r, w = await asyncio.open_connection(*self.target, ssl=self.ssl, limit=1 << 20)
        try:
            self.stats.requests["watch"] += 1
            w.write(self._head(target))
            head = await r.readuntil(b"\r\n\r\n")
            self.stats.received += len(head)
            status = int(head.split(b" ", 2)[1])
            if status == 410:
                self.gone += 1
                return True
            if status != 200:
                self.errors += 1
                await self._read_body(r, head)
                raise ConnectionError(f"watch {status}")
            self.watching_since = time.monotonic()
            self._backoff = 0.1
            pending = b""
            while not self.stop.is_set():
                size = int((await r.readuntil(b"\r\n")).strip() or b"0", 16)
                if size == 0:
                    return False
                data = pending + (await r.readexactly(size + 2))[:-2]
                self.stats.received += size
                lines = data.split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.startswith(b'{"type":"ERROR"'):
                        if b'"code":410' in line:
                            self.gone += 1
                            return True
                        raise ConnectionError(line[:200].decode(errors="replace"))
                    m = RV.search(line)
                    if m:
                        self.rv = m.group(1).decode()
                        self.live_since = self.watching_since
                    if not line.startswith(b'{"type":"BOOKMARK"'):
                        self.events += 1
            return False
        finally:
            self.watching_since = 0.0
            w.close()

    async def run(self) -> None:
        need_list = True
        while not self.stop.is_set():
            try:
                if need_list:
                    if not await self.list():
                        await self._sleep()
                        continue
                    need_list = False
                need_list = await self.watch()
            except asyncio.CancelledError:
                raise
            except (OSError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                self.errors += 1
                await self._sleep()

    async def _sleep(self) -> None:
        delay = random.uniform(self._backoff / 2, self._backoff)
        self._backoff = min(self._backoff * 2, 2.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), delay)


# ---------------------------------------------------------------- the systems under test


@dataclass
class Upstream:
    """What the clients' requests ultimately load: its URL, how to write to it, how to restart it."""

    name: str
    url: str
    token: str = ""
    ca_file: str | None = None

    def ssl(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=self.ca_file) if self.url.startswith("https") else None

    def host_port(self) -> tuple[str, int]:
        host, port = self.url.split("://", 1)[1].rsplit(":", 1)
        return host, int(port)


async def http(up: Upstream, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
    """A one-off request (setup, writer) on a fresh connection."""
    r, w = await asyncio.open_connection(*up.host_port(), ssl=up.ssl())
    data = json.dumps(body).encode() if body is not None else b""
    auth = f"Authorization: Bearer {up.token}\r\n" if up.token else ""
    w.write(
        f"{method} {path} HTTP/1.1\r\nHost: bench\r\nAccept: application/json\r\n{auth}Content-Type: {ctype}\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    raw = await r.read()
    w.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"chunked" in head.lower():
        out, buf = [], rest
        while buf:
            size_s, _, buf = buf.partition(b"\r\n")
            size = int(size_s or b"0", 16)
            if not size:
                break
            out.append(buf[:size])
            buf = buf[size + 2 :]
        rest = b"".join(out)
    return status, json.loads(rest) if rest[:1] == b"{" else rest


async def populate(up: Upstream, ns: str, objects: int) -> None:
    """``objects`` ConfigMaps in ``ns``: 16 writers, each on one keep-alive connection."""
    import aiohttp

    status, _ = await http(up, "GET", f"/api/v1/namespaces/{ns}")
    if status == 404:
        await http(up, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    headers = {"Authorization": f"Bearer {up.token}"} if up.token else {}
    connector = aiohttp.TCPConnector(limit=16, ssl=up.ssl() or False)
    async with aiohttp.ClientSession(up.url, connector=connector, headers=headers) as session:

        async def writer(first: int) -> None:
            for i in range(first, objects, 16):
                body = {"metadata": {"name": f"bench-{i}", "labels": {"bench": "restart"}}, "data": {"i": str(i)}}
                async with session.post(PATH.format(ns=ns), json=body) as resp:
                    assert resp.status in (201, 409), (resp.status, await resp.text())

        await asyncio.gather(*(writer(w) for w in range(16)))


async def writer(up: Upstream, ns: str, objects: int, rate: float, stop: asyncio.Event, failures: list[int]) -> None:
    n = 0
    while not stop.is_set():
        i = random.randrange(objects)
        with contextlib.suppress(OSError, ValueError, IndexError):
            status, _ = await http(
                up, "PATCH", f"{PATH.format(ns=ns)}/bench-{i}", {"data": {"n": str(n)}}, "application/merge-patch+json"
            )
            if status != 200:
                failures.append(status)
        n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0 / rate)


class Restartable:
    """A process on a fixed port that can be stopped (SIGTERM) and started again."""

    def __init__(self, name: str, argv: list[str], ready: str, ca_file: str | None = None, token: str = "") -> None:
        self.name, self.argv, self.ready, self.ca_file, self.token = name, argv, ready, ca_file, token
        self.process: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkstemp(prefix=f"bench-restart-{name}-", suffix=".log")[1])

    def start(self) -> None:
        with self.log.open("ab") as out:
            env, cwd = bl.child_env()  # WATCHCACHE_BENCH_SRC: another copy of the package
            self.process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                preexec_fn=bl.child_preexec(), start_new_session=True,  # a scheduling group of its own (bl.Proc)
            )  # fmt: skip

    async def wait_ready(self, timeout: float = 600.0) -> float:
        t0 = time.monotonic()
        ctx = ssl.create_default_context(cafile=self.ca_file) if self.ready.startswith("https") else None
        while time.monotonic() - t0 < timeout:
            assert self.process is not None and self.process.poll() is None, self.log.read_text()[-2000:]
            with contextlib.suppress(OSError, ValueError, IndexError, asyncio.IncompleteReadError):
                r, w = await asyncio.open_connection(*Upstream("", self.ready).host_port(), ssl=ctx)
                auth = f"Authorization: Bearer {self.token}\r\n" if self.token else ""
                w.write(f"GET /readyz HTTP/1.1\r\nHost: bench\r\n{auth}Connection: close\r\n\r\n".encode())
                head = await asyncio.wait_for(r.readuntil(b"\r\n"), 5)
                w.close()
                if b" 200 " in head:
                    return time.monotonic() - t0
            await asyncio.sleep(0.02)
        raise TimeoutError(f"{self.name} not ready in {timeout}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    async def restart(self) -> None:
        """SIGTERM, wait for the exit in a thread (the clients go on meanwhile), start again."""
        await asyncio.to_thread(self.stop)
        self.start()


# ---------------------------------------------------------------- one run


@dataclass
class Result:
    run: str
    informers: int
    objects: int
    synced_s: float
    down_s: float  # restart: from the signal until the server was ready again
    watching_p50_s: float
    watching_max_s: float
    not_watching: int  # clients not watching again by the deadline (--timeout)
    relists: int
    gone: int
    upstream_requests: dict[str, int]
    upstream_bytes: int
    client_requests: dict[str, int]
    client_bytes: int
    events: int
    writes_failed: int
    load: str


async def measure(
    run: str,
    clients_to: Upstream,
    restarted: Restartable,
    upstream: Upstream,
    counts: Counts | LoggedCounts | None,
    args: argparse.Namespace,
    ns: str,
) -> Result:
    """Informers against ``clients_to``; restart ``restarted``; what it cost ``upstream``."""
    informers = [
        Informer(clients_to.host_port(), PATH.format(ns=ns), clients_to.ssl(), clients_to.token)
        for _ in range(args.informers)
    ]
    t0 = time.monotonic()
    tasks = [asyncio.ensure_future(i.run()) for i in informers]
    stop = asyncio.Event()
    failures: list[int] = []
    try:
        while not all(i.watching_since for i in informers):
            assert time.monotonic() - t0 < args.timeout, "informers not all watching"
            await asyncio.sleep(0.1)
        synced = time.monotonic() - t0
        bl.log(f"{run}: {len(informers)} informers listed and watching in {synced:.1f}s")
        writing = asyncio.ensure_future(writer(upstream, ns, args.objects, args.write_rate, stop, failures))
        # Live: every client has an event or bookmark newer than its list.
        marks = {id(i): i.rv for i in informers}
        while not all(i.rv != marks[id(i)] for i in informers):
            assert time.monotonic() - t0 < args.timeout, "informers not following the writes"
            await asyncio.sleep(0.1)
        before_up = counts.snapshot() if counts else collections.Counter()
        before_bytes = counts.received if counts else 0
        before = [(i.lists, i.gone, i.stats.received, collections.Counter(i.stats.requests)) for i in informers]
        t_restart = time.monotonic()
        await restarted.restart()
        down = await restarted.wait_ready(args.timeout)
        bl.log(f"{run}: {restarted.name} restarted, ready {down:.1f}s after the signal")
        while not all(i.live_since > t_restart for i in informers) and time.monotonic() - t_restart < args.timeout:
            await asyncio.sleep(0.01)
        # Not watching again by the deadline: counted at the deadline (the table says how many).
        stuck = sum(1 for i in informers if i.live_since <= t_restart)
        again = sorted(i.live_since - t_restart if i.live_since > t_restart else args.timeout for i in informers)
        up = (counts.snapshot() - before_up) if counts else collections.Counter()
        up_bytes = (counts.received - before_bytes) if counts else 0
        stop.set()
        await writing
    finally:
        for i in informers:
            i.stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    requests: collections.Counter[str] = collections.Counter()
    for i, (_, _, _, reqs) in zip(informers, before, strict=True):
        requests.update(i.stats.requests - reqs)
    return Result(
        run=run,
        informers=len(informers),
        objects=args.objects,
        synced_s=round(synced, 2),
        down_s=round(down, 2),
        watching_p50_s=round(again[len(again) // 2], 2),
        watching_max_s=round(again[-1], 2),
        not_watching=stuck,
        relists=sum(i.lists - b[0] for i, b in zip(informers, before, strict=True)),
        gone=sum(i.gone - b[1] for i, b in zip(informers, before, strict=True)),
        upstream_requests={f"{k}:{r}": n for (k, r), n in sorted(up.items())},
        upstream_bytes=up_bytes,
        client_requests=dict(requests),
        client_bytes=sum(i.stats.received - b[2] for i, b in zip(informers, before, strict=True)),
        events=sum(i.events for i in informers),
        writes_failed=len(failures),
        load=" ".join(f"{x:.1f}" for x in os.getloadavg()),
    )


def sim_argv(port: int, journal: Path) -> list[str]:
    return [*bl.watchcache_exe(), "sim", "--listen", f"127.0.0.1:{port}", "--objects", "10", "--namespaces", "1",
            "--state-file", str(journal), "--bookmark-interval", "1"]  # fmt: skip


def proxy_argv(port: int, upstream_flags: list[str], workers: int) -> list[str]:
    return [*bl.watchcache_exe(), "serve", "--listen", f"127.0.0.1:{port}", *upstream_flags, "--workers",
            str(workers), "--resources", "configmaps", "--authentication", "none", *bl.LOCAL_CLIENTS]  # fmt: skip


async def run_sim(args: argparse.Namespace, through_proxy: bool, workdir: Path) -> Result:
    sim_port = free_port()
    sim = Restartable("sim", sim_argv(sim_port, workdir / "sim.journal"), f"http://127.0.0.1:{sim_port}")
    sim.start()
    await sim.wait_ready()
    direct = Upstream("sim", sim.ready)
    await populate(direct, "ns-0", args.objects)
    counts = Counts()
    relay, relay_port = await start_relay(("127.0.0.1", sim_port), counts)
    via_relay = Upstream("sim", f"http://127.0.0.1:{relay_port}")
    proxy = None
    try:
        if through_proxy:
            port = free_port()
            proxy = Restartable(
                "proxy", proxy_argv(port, ["--upstream", via_relay.url], args.workers), f"http://127.0.0.1:{port}"
            )
            proxy.start()
            await proxy.wait_ready()
            return await measure("proxy-sim", Upstream("proxy", proxy.ready), proxy, direct, counts, args, "ns-0")
        return await measure("sim", via_relay, sim, direct, counts, args, "ns-0")
    finally:
        if proxy is not None:
            proxy.stop()
        relay.close()
        sim.stop()


class LoggedCounts:
    """What ``Counts`` tells, from a ``RequestLog`` (a TLS relay): requests by kind, response bytes."""

    def __init__(self, log: Any) -> None:
        self.relay = log

    def snapshot(self) -> collections.Counter[tuple[str, str]]:
        counts = Counts()
        for r in list(self.relay.requests):
            counts.record(r.method, r.target)
        return counts.snapshot()

    @property
    def received(self) -> int:
        return int(self.relay.received)


async def run_kube(args: argparse.Namespace, through_proxy: bool, workdir: Path) -> Result:
    from harness.kube.kit import KubeEnv, Serving, write_kubeconfig
    from harness.kube.private import PrivateApiserver
    from harness.kube.requestlog import RequestLog

    private = PrivateApiserver(KubeEnv.from_environ(), workdir / "kube")
    try:
        private.start()
        kube = private.env()
        up = Upstream("kube", kube.url, kube.token, kube.ca)
        await populate(up, "bench", args.objects)

        class Kube(Restartable):
            def start(self) -> None:
                private.launch()
                self.process = private.process

            def stop(self) -> None:
                private.stop()

        restarted = Kube("kube-apiserver", [], kube.url, kube.ca, kube.token)
        restarted.process, restarted.log = private.process, private.log
        if not through_proxy:
            return await measure("kube", up, restarted, up, None, args, "bench")
        # The proxy reaches the apiserver through a TLS relay that counts what it asks and receives.
        serving = Serving.make(workdir)
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(str(serving.server.crt), str(serving.server.key))
        relay = RequestLog(up.host_port(), server_ssl, ssl.create_default_context(cafile=kube.ca))
        kubeconfig = write_kubeconfig(
            workdir / "proxy.kubeconfig", f"https://127.0.0.1:{relay.start()}", str(serving.ca.crt), kube.token
        )
        port = free_port()
        proxy = Restartable(
            "proxy", proxy_argv(port, ["--kubeconfig", str(kubeconfig)], args.workers), f"http://127.0.0.1:{port}"
        )
        proxy.start()
        try:
            await proxy.wait_ready()
            return await measure(
                "proxy-kube", Upstream("proxy", proxy.ready), proxy, up, LoggedCounts(relay), args, "bench"
            )
        finally:
            proxy.stop()
            relay.stop()
    finally:
        private.close()


RUNS = ("proxy-sim", "sim", "proxy-kube", "kube")


def table(results: list[Result]) -> str:
    headers = ["run", "informers", "objects", "server down (s)", "every client watching again p50/max (s)",
               "relists", "410s", "upstream requests", "upstream bytes", "client requests", "client bytes"]  # fmt: skip
    rows = []
    for r in results:
        up = ", ".join(f"{k} {v}" for k, v in r.upstream_requests.items()) or "(not counted: see client columns)"
        rows.append([
            r.run, r.informers, r.objects, r.down_s,
            f"{r.watching_p50_s} / {r.watching_max_s}" + (f" ({r.not_watching} not by then)" if r.not_watching else ""),
            r.relists, r.gone,
            up, f"{r.upstream_bytes / 1e6:.1f} MB" if r.upstream_requests else "-",
            ", ".join(f"{k} {v}" for k, v in sorted(r.client_requests.items())), f"{r.client_bytes / 1e6:.1f} MB",
        ])  # fmt: skip
    return bl.print_table(headers, rows, title="restart: what it cost the clients and the upstream")


async def amain(args: argparse.Namespace) -> list[Result]:
    bl.raise_nofile()
    # SIGTERM/SIGINT cancel the run, so that every process it started is stopped (and a private
    # apiserver's etcd prefix deleted) by the finally clauses.
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
    results = []
    runs = [r for r in args.runs.split(",") if r]
    kit = bool(os.environ.get("KUBE_REFERENCE_KUBECONFIG"))
    for run in runs:
        if run not in RUNS:
            raise SystemExit(f"unknown run {run!r} (one of {', '.join(RUNS)})")
        if run.endswith("kube") and not kit:
            bl.log(f'{run}: skipped (no kit: eval "$(../shared/tools/kube-reference/env.sh)")')
            continue
        with tempfile.TemporaryDirectory(prefix=f"bench-restart-{run}-") as d:
            kind = run.removeprefix("proxy-")
            runner = run_kube if kind == "kube" else run_sim
            result = await runner(args, run.startswith("proxy-"), Path(d))
        bl.log(json.dumps(result.__dict__))
        results.append(result)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--informers", type=int, default=1000)
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--write-rate", type=float, default=10.0, help="ConfigMap updates per second on the upstream")
    p.add_argument("--workers", type=int, default=2, help="the proxy's workers")
    # "kube" (1,000 clients relisting 10,000 objects straight from a kube-apiserver) is left out by
    # default: on a 2-core machine that apiserver never serves them (docs/reliability.md).
    p.add_argument(
        "--runs", default="proxy-sim,sim,proxy-kube", help=f"comma-separated, of {', '.join(RUNS)} (default: not kube)"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="bound of every wait (s)")
    p.add_argument("--quick", action="store_true", help="200 informers, 2,000 objects")
    args = p.parse_args()
    if args.quick:
        args.informers, args.objects = 200, 2000
    bl.log(f"machine: {bl.machine_info()}")
    import uvloop

    results = uvloop.run(amain(args))
    table(results)
    bl.bench_line("restart", {"results": [r.__dict__ for r in results]})


if __name__ == "__main__":
    main()
