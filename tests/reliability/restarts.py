"""Issue 20's scenario: informers read through a proxy that restarts mid-churn; what did it cost them?

One ``RestartScenario`` is: an upstream (the simulated cluster, or a real kube-apiserver), a
``watchcache serve --workers 2 --resources configmaps`` in front of it on a fixed port, a writer
that updates ConfigMaps at ~40/s straight on the upstream (labels flip, so selector watches see
objects enter and leave; a few deletes and re-creates), and 20+ informer-style clients
(``harness.fleet.Informer``: list, watch from the list's rv with bookmarks, resume
from the newest rv seen, relist on 410) reading through the proxy. Mid-churn, one fault
(``FAULTS``):

* ``sigterm``: SIGTERM the supervisor (every watch gets its final BOOKMARK), start a new process
  on the same port, as a rolling update does;
* ``sigkill``: SIGKILL the proxy's whole process group (supervisor and workers, as a container
  kill) and start a new process on the same port;
* ``kill-owner`` / ``kill-follower``: SIGKILL the worker that owns configmaps / one that follows
  them; the supervisor restarts it;
* ``upstream-sigterm`` / ``upstream-sigkill`` (``UPSTREAM_FAULTS``, given a ``Restartable``
  upstream): the *upstream* gets the signal and starts again (a control-plane rolling upgrade);
  the proxy keeps running. Its reflector may relist (the new apiserver's 410), and the relist
  diff it hands its clients is accepted at the rvs of its relists (its log), nothing else is.

Every step waits for a condition, bounded (no sleep-and-hope): clients listed and watching live,
the proxy ready again, every client past writes made after the fault, then (writer stopped)
every client at the upstream's head. The verdict (``Outcome``): relists (LISTs beyond each
client's first; 410s), guarantee violations from ``harness.checker`` against the
upstream's authoritative log with *no* relist diff accepted (every update seen exactly once and
in order), clients that did not converge, and each client's final state against a direct LIST
of the upstream. The log is the sim's journal (``--state-file``) or, for a real apiserver, what
a recorder watching it directly saw (``Recorder``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson

from harness.checker import (
    DELETED,
    ERROR_T,
    LogEntry,
    Record,
    Upstream,
    WatchSpec,
    check,
    digest_of,
    object_key,
    read_log,
)
from harness.fleet import Informer, InformerConfig, new_session
from harness.processes import Proc, free_port, python_m
from harness.proxygroup import ProxyGroup, wait_http_ok
from harness.proxylog import RELISTED
from harness.waiting import until

FAULTS = ("sigterm", "sigkill", "kill-owner", "kill-follower")
# Faults of the upstream (``RestartScenario.upstream_control``), the proxy left running.
UPSTREAM_FAULTS = ("upstream-sigterm", "upstream-sigkill")

RESOURCE = "configmaps"
LABEL = "i20-scenario"  # every object the writer makes carries it; "phase" flips between a and b


@dataclass(frozen=True)
class Target:
    """An HTTP endpoint and how to talk to it (a token and a CA for a real apiserver)."""

    url: str
    token: str | None = None
    ca_file: str | None = None

    def session(self, *, force_close: bool = True) -> aiohttp.ClientSession:
        ssl_ctx: ssl.SSLContext | bool = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=force_close, limit=0, ssl=ssl_ctx),
            headers=headers,
            read_bufsize=1 << 16,
        )


@dataclass
class ScenarioOptions:
    fault: str = "sigterm"
    clients: int = 24
    write_rate: float = 40.0  # writes/s on the upstream
    objects: int = 48  # ConfigMaps the writer keeps updating
    namespaces: tuple[str, ...] = ("ns-0", "ns-1", "ns-2")
    workers: int = 2
    warm_writes: int = 60  # writes every client must have seen before the fault
    after_writes: int = 60  # writes after the proxy is back, seen by every client before churn stops
    watch_timeout: tuple[int, int] = (10, 20)
    step_timeout: float = 60.0  # each wait is bounded by this
    # Cluster-wide watches without a selector see every ConfigMap of the upstream: only where the
    # authoritative log covers them all (the sim's journal), not a shared apiserver's namespace.
    cluster_wide: bool = True
    proxy_args: tuple[str, ...] = ()  # more flags for ``watchcache serve``


@dataclass
class Outcome:
    fault: str
    clients: int
    writes: int
    events: int
    reconnects: int
    errors: int
    lists: int
    gone: int
    violations: list[str]
    violations_total: int
    not_converged: list[str]
    final_mismatches: list[str]
    timings: dict[str, float]
    proxy_relist_lines: list[str]
    per_client: list[str] = field(default_factory=list)
    # The proxy's reflector relists (the upstream's 410s) during the run: (rv, changes delivered to watchers).
    upstream_relists: list[tuple[int, int]] = field(default_factory=list)

    @property
    def relists(self) -> int:
        """LISTs beyond each client's first: what a restart cost the fleet."""
        return self.lists - self.clients

    def problems(self) -> list[str]:
        out = []
        if self.relists or self.gone:
            out.append(f"{self.relists} relists ({self.gone} 410s) by {self.clients} clients")
        if self.violations_total:
            out.append(f"{self.violations_total} guarantee violations")
        if self.not_converged:
            out.append(f"{len(self.not_converged)} clients not at the upstream's head: {self.not_converged[:5]}")
        if self.final_mismatches:
            out.append(f"{len(self.final_mismatches)} clients' final state differs from the upstream's")
        return out

    def summary(self) -> str:
        t = ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items())
        lines = [
            f"fault {self.fault}: {self.clients} clients, {self.writes} writes, {self.events} events delivered, "
            f"{self.reconnects} reconnects, {self.errors} errors, relists {self.relists} (410s {self.gone}), "
            f"violations {self.violations_total}, not converged {len(self.not_converged)}, "
            f"final state mismatches {len(self.final_mismatches)}",
            f"timings: {t}",
        ]
        if self.upstream_relists:
            diffs = ", ".join(f"at rv {rv}: {n} changes" for rv, n in self.upstream_relists)
            lines.append(f"the proxy relisted {len(self.upstream_relists)} times (upstream 410s), relist diffs {diffs}")
        if self.proxy_relist_lines:
            lines.append(f"proxy relists/resyncs: {self.proxy_relist_lines[:6]}")
        lines += [f"  {v}" for v in self.violations[:10]]
        lines += [f"  {m}" for m in self.final_mismatches[:5]]
        if self.problems():
            lines += [f"  {c}" for c in self.per_client]
        return "\n".join(lines)


def client_specs(
    count: int, namespaces: tuple[str, ...], *, cluster_wide: bool = True
) -> list[tuple[WatchSpec, InformerConfig]]:
    """Cluster-wide, namespaced and label-selected ConfigMap informers; every fourth lists consistently.
    Without ``cluster_wide``, every watch is of one of ``namespaces``."""
    selectors = (f"{LABEL},phase=a", f"{LABEL},phase in (b)", f"{LABEL},phase!=a")
    out: list[tuple[WatchSpec, InformerConfig]] = []
    for i in range(count):
        slot = i % 4
        ns = namespaces[(i // 4) % len(namespaces)]
        if slot in (0, 1):
            spec = WatchSpec(RESOURCE, None if cluster_wide else ns, LABEL if slot == 1 else "")
        elif slot == 2:
            spec = WatchSpec(RESOURCE, ns)
        else:
            where = None if i % 8 == 3 and cluster_wide else namespaces[0]
            spec = WatchSpec(RESOURCE, where, selectors[(i // 4) % len(selectors)])
        out.append((spec, InformerConfig(list_mode="consistent" if i % 4 == 3 else "any")))
    return out


# ---------------------------------------------------------------------------- the writer


class Writer:
    """Updates ConfigMaps on the upstream at ``rate``/s; remembers the rv of every write it made.

    Writes come in pairs on one object, back to back (as a controller updates an object and then
    its status): however short a fault, it is likely to span both writes of some pair, so a proxy
    that hands its clients a *difference* after the fault (the second version without the first)
    rather than every event is caught, not only one down long enough for an object to change twice.
    """

    def __init__(self, target: Target, namespaces: tuple[str, ...], objects: int, rate: float) -> None:
        self.target = target
        self.namespaces = namespaces
        self.names = [(namespaces[i % len(namespaces)], f"i20-{i}") for i in range(objects)]
        self.rate = rate
        self.rvs: list[int] = []
        self.failed: list[str] = []
        self.phase: dict[tuple[str, str], str] = {}
        self.deleted: set[tuple[str, str]] = set()
        self._stop = asyncio.Event()

    def _body(self, ns: str, name: str, n: int) -> dict[str, Any]:
        phase = self.phase.setdefault((ns, name), "a")
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": {LABEL: "true", "phase": phase}},
            "data": {"n": str(n)},
        }

    async def _send(self, s: aiohttp.ClientSession, method: str, path: str, body: Any, ctype: str) -> int:
        url = self.target.url + path
        data = orjson.dumps(body) if body is not None else None
        timeout = aiohttp.ClientTimeout(total=10)
        async with s.request(method, url, data=data, headers={"Content-Type": ctype}, timeout=timeout) as resp:
            raw = await resp.read()
            if resp.status >= 300:
                self.failed.append(f"{method} {path}: {resp.status} {raw[:200]!r}")
                return 0
            if method == "DELETE":
                # kube answers a Status or the deleted object; its rv is the deletion's for the latter only.
                doc = orjson.loads(raw)
                return int((doc.get("metadata") or {}).get("resourceVersion") or 0)
            return int(orjson.loads(raw)["metadata"]["resourceVersion"])

    async def setup(self) -> None:
        async with self.target.session(force_close=False) as s:
            for ns, name in self.names:
                rv = await self._send(
                    s, "POST", f"/api/v1/namespaces/{ns}/configmaps", self._body(ns, name, 0), "application/json"
                )
                assert rv, self.failed[-1]
                self.rvs.append(rv)

    async def one(self, s: aiohttp.ClientSession, n: int) -> None:
        ns, name = self.names[(n // 2) % len(self.names)]
        path = f"/api/v1/namespaces/{ns}/configmaps"
        key = (ns, name)
        if key in self.deleted:
            self.deleted.discard(key)
            rv = await self._send(s, "POST", path, self._body(ns, name, n), "application/json")
        elif n % 58 == 14:
            self.deleted.add(key)
            rv = await self._send(s, "DELETE", f"{path}/{name}", None, "application/json")
        else:
            if n % 3 == 0:
                self.phase[key] = "b" if self.phase.get(key, "a") == "a" else "a"
            patch = {"metadata": {"labels": {"phase": self.phase.get(key, "a")}}, "data": {"n": str(n)}}
            rv = await self._send(s, "PATCH", f"{path}/{name}", patch, "application/merge-patch+json")
        if rv:
            self.rvs.append(rv)

    async def run(self) -> None:
        """Paced at ``rate``, a pair at a time; a slow write does not make the next ones burst."""
        async with self.target.session(force_close=False) as s:
            start, n = time.monotonic(), 0
            while not self._stop.is_set():
                try:
                    await self.one(s, n)
                    await self.one(s, n + 1)
                except (aiohttp.ClientError, OSError, TimeoutError) as e:
                    # The upstream is down (an upstream fault): the write's outcome is unknown, the
                    # recorder's log says whether it was made. Try the next pair later.
                    self.failed.append(f"write {n}: {type(e).__name__}: {e}")
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), 0.1)
                n += 2
                ahead = start + n / self.rate - time.monotonic()
                if ahead > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), ahead)
                elif ahead < -1.0:
                    start = time.monotonic() - n / self.rate

    def stop(self) -> None:
        self._stop.set()

    @property
    def head(self) -> int:
        return max(self.rvs) if self.rvs else 0


def proxy_argv(port: int, upstream_flags: list[str], workers: int, extra: tuple[str, ...] = ()) -> list[str]:
    return python_m(
        "watchcache", "serve", "--listen", f"127.0.0.1:{port}", *upstream_flags, "--workers", str(workers),
        "--resources", RESOURCE, "--bookmark-interval", "1", "--authentication", "none", *extra,
    )  # fmt: skip


# ---------------------------------------------------------------------------- the authoritative log of a real apiserver


class Recorder:
    """Lists then watches the upstream directly (never through the proxy) and keeps every change as a
    ``LogEntry``: the authoritative log when there is no journal. Its initial LIST becomes ADDED
    entries at the objects' own rvs (states before the list's rv are not claimed).

    Across an upstream restart it resumes from its last rv. A restarted kube-apiserver's watch cache
    starts at etcd's revision of its start, so it may answer that resume with 410: then the changes
    of the gap are read from etcd's history, by Exact LISTs (``resourceVersionMatch=Exact``, served
    from etcd): the namespace at the gap's ends, bisected wherever the two states differ (every
    write gives an object a new rv, so equal states mean no write between them), down to each
    revision that changed it. ``gaps`` says what each fill found: changes the restarted upstream's
    watchers never saw from the old one (its watch cache lost them) show up there."""

    def __init__(self, target: Target, namespace: str) -> None:
        self.target = target
        self.path = f"/api/v1/namespaces/{namespace}/{RESOURCE}"
        self.entries: list[LogEntry] = []
        self.rv = 0
        self.listed = asyncio.Event()
        self.failures: list[str] = []
        self.disconnects = 0
        self.gaps: list[str] = []
        self.lost = 0  # changes read from etcd's history: the upstream's watchers never got them
        self._stop = asyncio.Event()

    def _entry(self, kind: str, obj: dict[str, Any]) -> LogEntry:
        meta = obj["metadata"]
        rv = int(meta["resourceVersion"])
        return LogEntry(rv, RESOURCE, kind, object_key(obj), rv, meta.get("labels") or {}, digest_of(obj))

    async def run(self) -> None:
        async with self.target.session(force_close=False) as s:
            async with s.get(self.target.url + self.path) as resp:
                assert resp.status == 200, await resp.text()
                doc = orjson.loads(await resp.read())
            items = sorted(doc["items"], key=lambda o: int(o["metadata"]["resourceVersion"]))
            self.entries += [self._entry("ADDED", o) for o in items]
            self.rv = int(doc["metadata"]["resourceVersion"])
            self.listed.set()
            backoff = 0.05
            while not self._stop.is_set():
                try:
                    if await self._watch(s):
                        return
                    backoff = 0.05
                except (aiohttp.ClientError, OSError, TimeoutError):
                    self.disconnects += 1  # the upstream went away: resume from self.rv once it is back
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), backoff)
                    backoff = min(backoff * 2, 0.5)

    async def _watch(self, s: aiohttp.ClientSession) -> bool:
        """One watch from ``rv`` to its end; True when the recorder must stop (stopped, or a failure)."""
        params = {"watch": "1", "resourceVersion": str(self.rv), "allowWatchBookmarks": "true",
                  "timeoutSeconds": "60"}  # fmt: skip
        timeout = aiohttp.ClientTimeout(total=None, sock_read=90)
        async with s.get(self.target.url + self.path, params=params, timeout=timeout) as resp:
            if resp.status == 410:
                return not await self._fill_gap(s, (await resp.read())[:200].decode("utf-8", "replace"))
            if resp.status != 200:  # a restarted apiserver not ready yet (429, 500, 503): again later
                await resp.read()
                raise aiohttp.ClientError(f"watch answered {resp.status}")
            async for line in resp.content:
                if self._stop.is_set():
                    return True
                event = orjson.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == ERROR_T:
                    if obj.get("code") == 410:
                        return not await self._fill_gap(s, str(obj.get("message")))
                    raise aiohttp.ClientError(f"watch ERROR event {obj}")
                self.rv = int(obj["metadata"]["resourceVersion"])
                if kind != "BOOKMARK":
                    self.entries.append(self._entry(kind, obj))
        return False

    async def _list_at(self, s: aiohttp.ClientSession, rv: int | None) -> tuple[int, dict[str, dict[str, Any]]]:
        """The namespace's objects by key: at ``rv`` exactly (from etcd), or consistent (None); and the list's rv."""
        params = {"resourceVersion": str(rv), "resourceVersionMatch": "Exact"} if rv is not None else {}
        async with s.get(self.target.url + self.path, params=params) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise AssertionError(f"LIST at rv {rv}: {resp.status} {body[:300]!r}")
        doc = orjson.loads(body)
        return int(doc["metadata"]["resourceVersion"]), {object_key(o): o for o in doc["items"]}

    async def _fill_gap(self, s: aiohttp.ClientSession, why: str) -> bool:
        """After a 410 on resuming from ``rv``: the log completed to a consistent LIST's rv; False on failure."""
        start = self.rv
        try:
            _, low = await self._list_at(s, start)
            end, high = await self._list_at(s, None)
            found: list[LogEntry] = []
            await self._bisect(s, start, low, end, high, found)
        except (AssertionError, aiohttp.ClientError, OSError, TimeoutError) as e:
            self.failures.append(f"recorder: 410 at rv {start} ({why}), the gap unread: {e}")
            return False
        self.entries += found
        self.lost += len(found)
        self.rv = end
        self.gaps.append(
            f"410 resuming at rv {start} ({why}); etcd's history to rv {end}: "
            f"{len(found)} changes {[f'{e.type} {e.key}@{e.rv}' for e in found][:10]}"
        )
        return True

    async def _bisect(
        self,
        s: aiohttp.ClientSession,
        lo: int,
        low: dict[str, dict[str, Any]],
        hi: int,
        high: dict[str, dict[str, Any]],
        out: list[LogEntry],
    ) -> None:
        def rvs(state: dict[str, dict[str, Any]]) -> dict[str, str]:
            return {k: o["metadata"]["resourceVersion"] for k, o in state.items()}

        if rvs(low) == rvs(high):
            return
        if hi == lo + 1:  # one etcd revision: one write
            for key, obj in high.items():
                if key not in low or rvs(low)[key] != obj["metadata"]["resourceVersion"]:
                    out.append(self._entry("ADDED" if key not in low else "MODIFIED", obj))
            for key, obj in low.items():
                if key not in high:  # a DELETED event carries the last state at the deletion's rv
                    gone = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(hi)}}
                    out.append(self._entry("DELETED", gone))
            return
        mid = (lo + hi) // 2
        _, middle = await self._list_at(s, mid)
        await self._bisect(s, lo, low, mid, middle, out)
        await self._bisect(s, mid, middle, hi, high, out)

    def stop(self) -> None:
        self._stop.set()


# ---------------------------------------------------------------------------- the scenario


def replay(records: list[Record]) -> dict[str, int]:
    """A client's final store (key -> object rv) from its records: the last LIST, then its events."""
    state: dict[str, int] = {}
    for rec in records:
        if rec[0] == "list":
            state = dict(rec[2])
        elif rec[0] == "event":
            _, kind, key, rv, _digest = rec
            if kind == DELETED:
                state.pop(key, None)
            else:
                state[key] = rv
    return state


class Restartable(Protocol):
    """An upstream the scenario may stop and start again (``harness.kube.private.PrivateApiserver``)."""

    def stop(self, sig: int = ...) -> None: ...

    def start(self, timeout: float = ...) -> float: ...


@dataclass
class RestartScenario:
    """One run: ``upstream`` (read and written directly), a ``proxy`` in front, ``opts.clients`` clients."""

    opts: ScenarioOptions
    upstream: Target
    proxy: ProxyGroup
    log: Callable[[], list[LogEntry]]  # the upstream's authoritative log, read after the run
    say: Callable[[str], None] = print
    # Without a journal: watches the upstream directly from before the first write; it is the log.
    recorder: Recorder | None = None
    timings: dict[str, float] = field(default_factory=dict)
    informers: list[Informer] = field(default_factory=list)
    # For UPSTREAM_FAULTS: the upstream to stop and start again, and what to do while it is down.
    upstream_control: Restartable | None = None
    during_downtime: Callable[[], Awaitable[None]] | None = None

    async def run(self) -> Outcome:
        o = self.opts
        recording = None
        if self.recorder is not None:
            recording = asyncio.ensure_future(self.recorder.run())
            await asyncio.wait_for(self.recorder.listed.wait(), o.step_timeout)
        writer = Writer(self.upstream, o.namespaces, o.objects, o.write_rate)
        await writer.setup()
        self.timings["proxy start"] = await self.proxy.start(o.step_timeout)
        sessions = [new_session() for _ in range((o.clients + 11) // 12)]
        for i, (spec, cfg) in enumerate(client_specs(o.clients, o.namespaces, cluster_wide=o.cluster_wide)):
            cfg.watch_timeout = o.watch_timeout
            self.informers.append(Informer(f"c{i:02d}", self.proxy.url, spec, sessions[i // 12], cfg, seed=i))
        tasks = [asyncio.ensure_future(i.run()) for i in self.informers]
        writing = asyncio.ensure_future(writer.run())
        try:
            await self._phases(writer, writing)
        finally:
            writer.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writing, 15)
            for inf in self.informers:
                inf.stop()
            await asyncio.sleep(0.1)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for s in sessions:
                await s.close()
            if self.recorder is not None and recording is not None:
                recorder = self.recorder
                with contextlib.suppress(TimeoutError):
                    await until(
                        lambda: recorder.rv >= writer.head,
                        o.step_timeout,
                        what="the recorder at the head",
                        interval=0.02,
                    )
                recorder.stop()
                recording.cancel()
                await asyncio.gather(recording, return_exceptions=True)
                assert recorder.rv >= writer.head, f"the recorder stopped at rv {recorder.rv}: {recorder.failures}"
                assert not recorder.failures, recorder.failures
        return await self._verdict(writer)

    def _seen(self, rv: int) -> Callable[[], bool]:
        return lambda: all(i.last_rv >= rv for i in self.informers)

    async def _phases(self, writer: Writer, writing: asyncio.Future[None]) -> None:
        o = self.opts
        base = len(writer.rvs)
        await until(
            lambda: all(i.counters.lists for i in self.informers), o.step_timeout, what="clients listed", interval=0.02
        )
        await until(
            lambda: len(writer.rvs) >= base + o.warm_writes, o.step_timeout, what="warm-up writes", interval=0.02
        )
        await until(
            self._seen(writer.rvs[base + o.warm_writes - 1]),
            o.step_timeout,
            what="clients watching live",
            interval=0.02,
        )
        self.say(
            f"{time.strftime('%H:%M:%S')} {len(self.informers)} clients listed and watching; "
            f"fault {o.fault} at rv {writer.head}"
        )
        t0 = time.monotonic()
        await self._fault()
        self.timings["fault to ready"] = time.monotonic() - t0
        mark = len(writer.rvs)
        await until(
            lambda: len(writer.rvs) >= mark + o.after_writes,
            o.step_timeout,
            what="writes after the fault",
            interval=0.02,
        )
        target = writer.rvs[mark + o.after_writes - 1]
        await until(self._seen(writer.rvs[mark]), o.step_timeout, what="clients past the fault", interval=0.02)
        self.timings["fault to every client past it"] = time.monotonic() - t0
        await until(self._seen(target), o.step_timeout, what="clients caught up after the fault", interval=0.02)
        writer.stop()
        await asyncio.wait_for(writing, 15)  # its last request is answered: the head is known
        # Converged: every client at the head (by an event or a bookmark). Bounded; the verdict
        # reports the laggards rather than raising.
        with contextlib.suppress(TimeoutError):
            await until(lambda: self._seen(writer.head)(), o.step_timeout, what="clients at the head", interval=0.02)

    async def _fault(self) -> None:
        o, p = self.opts, self.proxy
        if o.fault == "sigterm":
            code = await p.sigterm(30.0)
            self.say(f"SIGTERM: the proxy exited {code}")
            self.timings["restart to ready"] = await p.start(o.step_timeout)
        elif o.fault == "sigkill":
            p.sigkill_group()
            self.say("SIGKILL: the proxy's process group")
            self.timings["restart to ready"] = await p.start(o.step_timeout)
        elif o.fault in ("kill-owner", "kill-follower"):
            pids = await p.worker_pids(10.0)
            assert len(pids) == o.workers, f"found workers {pids}"
            owner = o.fault == "kill-owner"
            victim = next(w for w, (_, owns) in sorted(pids.items()) if owns == owner)
            os.kill(pids[victim][0], signal.SIGKILL)
            self.say(f"SIGKILL worker {victim} (pid {pids[victim][0]}, {'owner' if owner else 'follower'})")
            t0 = time.monotonic()

            async def restarted() -> bool:
                again = await p.worker_pids(2.0)
                return victim in again and again[victim][0] != pids[victim][0]

            while not await restarted():
                assert time.monotonic() - t0 < o.step_timeout, "the supervisor did not restart the worker"
                await asyncio.sleep(0.05)
            await wait_http_ok(p.url + "/readyz", o.step_timeout, p.ca_file)
            self.timings["restart to ready"] = time.monotonic() - t0
        elif o.fault in UPSTREAM_FAULTS:
            upstream = self.upstream_control
            assert upstream is not None, f"{o.fault} needs an upstream_control"
            sig = signal.SIGTERM if o.fault == "upstream-sigterm" else signal.SIGKILL
            t0 = time.monotonic()
            await asyncio.to_thread(upstream.stop, sig)
            self.timings["upstream stopped"] = time.monotonic() - t0
            self.say(f"{signal.Signals(sig).name}: the upstream stopped in {self.timings['upstream stopped']:.2f}s")
            if self.during_downtime is not None:
                await self.during_downtime()
            self.timings["upstream start to ready"] = await asyncio.to_thread(upstream.start, max(o.step_timeout, 120))
            self.timings["upstream down"] = time.monotonic() - t0
        else:
            raise ValueError(f"unknown fault {o.fault!r} (one of {FAULTS + UPSTREAM_FAULTS})")

    def upstream_relists(self) -> list[tuple[int, int]]:
        """(rv, changes delivered to watchers) of each relist of the proxy's reflectors, from its log."""
        out = []
        for line in self.proxy.relist_lines():
            m = RELISTED.search(line)
            if m and m.group(1) == RESOURCE:
                changes = re.search(r"(\d+) changes delivered", line)
                out.append((int(m.group(2)), int(changes.group(1)) if changes else -1))
        return out

    async def _final_states(self) -> dict[WatchSpec, dict[str, int]]:
        out: dict[WatchSpec, dict[str, int]] = {}
        async with self.upstream.session(force_close=False) as s:
            for spec in {i.spec for i in self.informers}:
                path = f"/api/v1/namespaces/{spec.namespace}/{RESOURCE}" if spec.namespace else f"/api/v1/{RESOURCE}"
                params = {"labelSelector": spec.label_selector} if spec.label_selector else {}
                async with s.get(self.upstream.url + path, params=params) as resp:
                    assert resp.status == 200, await resp.text()
                    doc = orjson.loads(await resp.read())
                out[spec] = {object_key(o): int(o["metadata"]["resourceVersion"]) for o in doc["items"]}
        return out

    async def _verdict(self, writer: Writer) -> Outcome:
        head = writer.head
        truth = await self._final_states()
        # An upstream fault may make the proxy relist (the new upstream's 410). The difference it hands
        # its clients then is accepted at the rvs of its relists only if some change was lost by the
        # upstream itself: the recorder, resuming on it as the proxy did, had to read it from etcd's
        # history (or there is no recorder to tell). Else every change was there to be streamed, and
        # a client handed a version without the one before it fails. A proxy fault's diff never passes.
        relists = self.upstream_relists()
        lost = self.recorder is None or self.recorder.lost > 0
        accepted = {rv for rv, _ in relists} if self.opts.fault in UPSTREAM_FAULTS and lost else ()
        report = check(Upstream(self.log()), [(i.id, i.spec, i.records) for i in self.informers], accepted)
        mismatches = []
        for inf in self.informers:
            held, want = replay(inf.records), truth[inf.spec]
            if held != want:
                diff = sorted(set(held.items()) ^ set(want.items()))[:4]
                mismatches.append(f"{inf.id} ({inf.spec.describe()}): {len(held)} vs {len(want)} objects, {diff}")
        c = [i.counters for i in self.informers]
        return Outcome(
            fault=self.opts.fault,
            clients=len(self.informers),
            writes=len(writer.rvs),
            events=sum(x.events for x in c),
            reconnects=sum(x.watches for x in c) - sum(x.lists for x in c),
            errors=sum(x.errors for x in c),
            lists=sum(x.lists for x in c),
            gone=sum(x.gone for x in c),
            violations=[str(v) for v in report.violations[:20]],
            violations_total=report.total_violations,
            not_converged=[i.id for i in self.informers if i.last_rv < head],
            final_mismatches=mismatches,
            timings=self.timings,
            proxy_relist_lines=self.proxy.relist_lines(),
            upstream_relists=relists,
            per_client=[
                f"{i.id} {i.spec.describe()}: lists {i.counters.lists}, 410s {i.counters.gone}, watches "
                f"{i.counters.watches}, errors {i.counters.errors}, events {i.counters.events}, last rv {i.last_rv}"
                for i in self.informers
            ],
        )


def sim_argv(port: int, journal: Path, namespaces: int) -> list[str]:
    """The simulated cluster with a journal (the authoritative log), bookmarks every second, no churn."""
    return python_m(
        "watchcache", "sim", "--listen", f"127.0.0.1:{port}", "--objects", "30", "--namespaces", str(namespaces),
        "--state-file", str(journal), "--bookmark-interval", "1",
    )  # fmt: skip


async def run_on_sim(opts: ScenarioOptions, workdir: Path, say: Callable[[str], None] = print) -> Outcome:
    """The scenario against ``watchcache sim`` (real processes, loopback): the suite tier's."""
    journal = workdir / "sim.journal"
    sim = Proc(sim_argv(0, journal, len(opts.namespaces)), name="sim", log_path=workdir / "sim.log")
    sim.start()
    try:
        url = await asyncio.to_thread(sim.wait_ready, opts.step_timeout)
        port = free_port()
        proxy = ProxyGroup(proxy_argv(port, ["--upstream", url], opts.workers, opts.proxy_args), workdir / "proxy.log",
                           port)  # fmt: skip
        scenario = RestartScenario(opts, Target(url), proxy, lambda: read_log(str(journal)), say)
        try:
            return await scenario.run()
        finally:
            proxy.stop()
    finally:
        sim.stop(30.0)
