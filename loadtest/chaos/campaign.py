"""The reliability campaign: break everything around the proxy, then prove no client lost an event.

``python -m loadtest.chaos.campaign --duration 300`` (``make chaos``; ``--duration 60`` in CI) runs, on
loopback only:

* ``watchcache sim`` with ``--state-file`` (its journal is the authoritative log of writes) and
  pod churn, plus a configmap writer in this process (labels that flip, for selector transitions);
* ``harness.relay`` between the proxy and the sim (the network-slowness toggle);
* ``watchcache serve --workers 3 --stall-timeout 5`` in front of the relay;
* ≥ 100 informer-style clients (``harness.fleet``) through the proxy, recording
  every list, event, bookmark, error and reconnect;
* registers (``loadtest.chaos.registers``): sequential writers and consistent readers (LIST and GET
  without a resourceVersion) through the proxy, whose history is checked for linearizability
  (``harness.linearizability``): no consistent read may miss a write that completed
  before it began.

Faults, one at a time, each with a duration, then combined (``FAULTS``): the upstream SIGKILLed
and restarted on its port with its state file, upstream compaction, an upstream stall longer
than the stall timeout, upstream 500s and 429s, the owner worker SIGKILLed, a follower worker
SIGKILLed, a rolling restart of the proxy (SIGTERM, start again on the same port), a client
that stops reading, a slow network between proxy and upstream.

Then churn stops (the sim restarts without it), clients converge (every client's last rv
reaches the final upstream rv, bounded), and the checker (``harness.checker``) runs
over the journal and every client's record. The table printed gives, per fault: events
delivered, clients affected, reconnects, relists (410s) and guarantee violations (must be 0).
Exit status 0 only with no violation, every client converged and enough events delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from bisect import bisect_right
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from harness import linearizability
from harness.checker import Report, Upstream, check, read_log
from harness.fleet import Informer, InformerConfig, Phase, default_mix, new_session
from harness.processes import SUPERVISOR_READY, NotReady, Proc, free_port, python_m
from harness.proxylog import lines_near, relist_points, relist_times
from loadtest.chaos.registers import Registers
from loadtest.chaos.stack import (
    RELAY_READY,
    journal_heads,
    last_journal_rv,
    proxy_argv,
    relay_argv,
    sim_argv,
)

STALL_TIMEOUT = 5.0
CM_LABEL = "chaos"

# Product bugs this campaign found (each pinned by an xfail(strict=True) test). By default the
# campaign steers around them so that it guards everything else; --expose-known-bugs drives into them.
KNOWN_BUGS: dict[str, str] = {
    # Fixed since the campaign found them (their regression tests now pass): relist-transition-order,
    # discovery-gives-up-on-upstream-errors, watch-ahead-of-relisting-cache, relist-rv-livelock (a watch
    # from a relist's rv got 410 until the cache moved on; the diff now ends with its only frame at that
    # rv). The campaign drives into those areas by default now: in particular the converge phase no
    # longer writes one object per resource after churn stops, so caches end on a relist's rv.
}


@dataclass
class Options:
    duration: float = 300.0
    clients: int = 120
    churn: float = 100.0
    objects: int = 1000
    namespaces: int = 10
    writes: float = 8.0  # configmap writes per second (half through the proxy)
    seed: int = 1
    workdir: str | None = None
    keep: bool = False
    json_path: str | None = None
    min_events: int = 0
    converge_timeout: float = 45.0
    quiet: bool = False
    digests: bool = True
    expose_known_bugs: bool = False
    # Fail when the proxy's own faults (worker kills, rolling restart) cost more relists than this.
    max_proxy_relists: int | None = None


@dataclass
class PhaseResult:
    name: str
    started: float
    seconds: float = 0.0
    actions: list[str] = field(default_factory=list)
    events: int = 0
    bookmarks: int = 0
    clients_affected: int = 0
    reconnects: int = 0
    relists: int = 0
    # The relists (410s) by who forced them (``Campaign.cause_of``): the proxy's own faults, or the upstream.
    relists_proxy: int = 0
    relists_upstream: int = 0
    errors: int = 0
    # Of the errors, 429s: the client backs off and watches again from its rv (no relist).
    retried: int = 0
    violations: int = 0


@dataclass
class Fault:
    name: str
    weight: float  # share of the schedule
    min_seconds: float
    run: Callable[[Campaign, float], Awaitable[None]]


class Campaign:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.scale = opts.duration / 300.0
        self.dir = Path(opts.workdir or tempfile.mkdtemp(prefix="watchcache-chaos-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_file = self.dir / "sim.journal"
        self.sim: Proc | None = None
        self.relay: Proc | None = None
        self.proxy: Proc | None = None
        self.sim_port = 0
        self.proxy_port = 0
        # The proxy's GETs sent before their handler ran, by outcome, read before its verdict.
        self.early: dict[str, int] = {}
        self.phase = Phase()
        self.phases: list[PhaseResult] = []
        self.informers: list[Informer] = []
        self.slow: Informer | None = None
        self.sessions: list[aiohttp.ClientSession] = []
        self.admin: aiohttp.ClientSession | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.writer_stop = asyncio.Event()
        self.writes_ok = 0
        self.writes_failed = 0
        self.registers: Registers | None = None
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.timeline: list[str] = []
        # The upstream's window floor over time, per resource: (wall-clock time, oldest rv it serves).
        self.floors: dict[str, list[tuple[float, int]]] = {}
        # The evidence of each relist ``attribute`` put on the proxy (``evidence``).
        self.proxy_relists: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ output

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.started:7.1f}s] {msg}"
        self.timeline.append(line)
        if not self.opts.quiet:
            print(line, flush=True)

    def act(self, msg: str) -> None:
        if self.phases:
            self.phases[-1].actions.append(msg)
        self.say("  " + msg)

    # ------------------------------------------------------------------ processes

    def _sim_proc(self, churn: float) -> Proc:
        listen = f"127.0.0.1:{self.sim_port}"
        argv = sim_argv(
            listen, self.state_file, objects=self.opts.objects, namespaces=self.opts.namespaces, churn=churn,
            seed=self.opts.seed,
        )  # fmt: skip
        return Proc(argv, name="sim", log_path=self.dir / "sim.log")

    async def start_sim(self, churn: float | None = None) -> None:
        self.sim = self._sim_proc(self.opts.churn if churn is None else churn)
        self.sim.start()
        url = await asyncio.to_thread(self.sim.wait_ready)
        self.sim_port = int(url.rsplit(":", 1)[1])

    def _proxy_proc(self) -> Proc:
        assert self.relay is not None
        extra = ["--max-watch-buffer-bytes", str(2 << 20), "--history-max-events", "20000"]
        argv = proxy_argv(
            f"127.0.0.1:{self.proxy_port}", self.relay.url, workers=3, stall_timeout=STALL_TIMEOUT, extra=extra
        )
        return Proc(argv, name="proxy", ready=SUPERVISOR_READY, log_path=self.dir / "proxy.log")

    async def start_proxy(self) -> None:
        self.proxy = self._proxy_proc()
        self.proxy.start()
        url = await asyncio.to_thread(self.proxy.wait_ready, 60.0)
        self.proxy_port = int(url.rsplit(":", 1)[1])
        await self.wait_http_ok(url + "/readyz", 60.0)

    async def start_stack(self) -> None:
        # The sim's port is chosen up front so that the three processes start side by side (the
        # proxy retries its upstream until the sim answers).
        self.sim_port = free_port()
        self.sim = self._sim_proc(self.opts.churn)
        self.sim.start()
        self.relay = Proc(
            relay_argv(f"127.0.0.1:{self.sim_port}"), name="relay", ready=RELAY_READY, log_path=self.dir / "relay.log"
        )
        self.relay.start()
        await asyncio.to_thread(self.relay.wait_ready)
        await asyncio.gather(asyncio.to_thread(self.sim.wait_ready), self.start_proxy())
        self.say(f"stack up: sim {self.sim_url}, relay {self.relay.url}, proxy {self.proxy_url} (3 workers)")

    @property
    def sim_url(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}"

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    async def wait_http_ok(self, url: str, timeout: float) -> None:
        assert self.admin is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with self.admin.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
        raise NotReady(f"{url} not 200 within {timeout}s")

    async def post(self, url: str, body: Any = None, method: str = "POST") -> tuple[int, Any]:
        assert self.admin is not None
        async with self.admin.request(method, url, json=body, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            text = await resp.read()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text[:200]

    async def shards(self) -> dict[int, dict[str, Any]]:
        """``/debug/shards`` of every worker, found on fresh connections (bounded tries)."""
        assert self.admin is not None
        views: dict[int, dict[str, Any]] = {}
        for _ in range(400):
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                async with self.admin.get(
                    self.proxy_url + "/debug/shards", timeout=aiohttp.ClientTimeout(total=2)
                ) as resp:
                    if resp.status == 200:
                        view = await resp.json()
                        views[int(view["worker"])] = view
            if len(views) >= 3:
                break
            await asyncio.sleep(0.01)
        return views

    async def kill_worker(self, which: str) -> None:
        views = await self.shards()
        if not views:
            self.act("no worker answered /debug/shards")
            return
        owner_of_pods = next(iter(views.values()))["owners"].get("pods")
        if which == "owner":
            target = owner_of_pods
        else:
            owners = set(next(iter(views.values()))["owners"].values())
            others = [w for w in sorted(views) if w not in owners] or [w for w in sorted(views) if w != owner_of_pods]
            target = others[0] if others else None
        if target is None or target not in views:
            self.act(f"{which} worker not found among {sorted(views)}")
            return
        pid = int(views[target]["pid"])
        os.kill(pid, signal.SIGKILL)
        self.act(f"SIGKILL {which} worker {target} (pid {pid}; owns {views[target]['owned']})")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            again = await self.shards()
            if target in again and int(again[target]["pid"]) != pid:
                self.act(f"worker {target} restarted by the supervisor (pid {again[target]['pid']})")
                try:
                    await self.wait_http_ok(self.proxy_url + "/readyz", 30.0)
                    self.act("proxy ready again (every worker synced)")
                except NotReady:
                    self.act("proxy NOT ready 30s after the worker restart")
                return
        self.act(f"worker {target} not seen restarted within 20s")

    async def sim_fault(self, spec: dict[str, Any]) -> None:
        try:
            status, _body = await self.post(self.sim_url + "/sim/faults", spec)
            self.act(f"sim fault {spec}: {status}")
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self.act(f"sim fault {spec} failed: {e}")

    async def relay_config(self, spec: dict[str, Any]) -> None:
        assert self.relay is not None
        try:
            status, _ = await self.post(self.relay.group(2) + "/config", spec)
            self.act(f"relay {spec or 'clean'}: {status}")
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self.act(f"relay config failed: {e}")

    def raise_floor(self, rv: int) -> None:
        """The upstream serves no rv below ``rv`` from now on (compacted, or restarted there), any resource."""
        now = time.time()
        for resource in ("pods", "configmaps"):
            self.floors.setdefault(resource, []).append((now, rv))

    async def watch_upstream_window(self) -> None:
        """Polls the sim's window (``/debug/cache``: ``oldest_rv`` per resource): a client resuming below
        it got a 410 the upstream itself would have given."""
        assert self.admin is not None
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError):
                async with self.admin.get(self.sim_url + "/debug/cache", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    body = json.loads(await r.read())
                now = time.time()
                for name, stats in body["resources"].items():
                    floors = self.floors.setdefault(name, [])
                    if not floors or floors[-1][1] != int(stats["oldest_rv"]):
                        floors.append((now, int(stats["oldest_rv"])))
            await asyncio.sleep(0.2)

    async def compact(self) -> None:
        try:
            status, body = await self.post(self.sim_url + "/sim/compact")
            if status == 200:
                self.raise_floor(int(body["resourceVersion"]))
            self.act(f"POST /sim/compact: {status} {body if status == 200 else ''}".rstrip())
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self.act(f"compact failed: {e}")

    async def kill_sim(self, down: float) -> None:
        assert self.sim is not None
        pid = self.sim.pid
        await asyncio.to_thread(self.sim.kill)
        self.act(f"SIGKILL sim (pid {pid}); down for {down:.1f}s")
        await asyncio.sleep(down)
        await self.start_sim()
        self.raise_floor(last_journal_rv(self.state_file))  # its history starts at its revision
        self.act(f"sim restarted on port {self.sim_port} from its journal (pid {self.sim.pid})")

    async def rolling_restart(self) -> None:
        assert self.proxy is not None
        t0 = time.monotonic()
        code = await asyncio.to_thread(self.proxy.stop, 30.0)
        self.act(f"SIGTERM supervisor: exited {code} in {time.monotonic() - t0:.1f}s")
        await self.start_proxy()
        self.act(f"proxy restarted on port {self.proxy_port}, ready in {time.monotonic() - t0:.1f}s")

    # ------------------------------------------------------------------ load

    async def writer(self) -> None:
        """Configmap writes: creates, label flips (selector transitions), deletes; half via the proxy."""
        assert self.admin is not None
        rng = random.Random(self.opts.seed)
        live: dict[tuple[str, str], str] = {}
        n = 0
        interval = 1.0 / self.opts.writes if self.opts.writes > 0 else 0
        while not self.writer_stop.is_set() and interval:
            base = self.proxy_url if rng.random() < 0.5 else self.sim_url
            roll = rng.random()
            try:
                if not live or (roll < 0.3 and len(live) < 60):
                    n += 1
                    ns, name = f"ns-{rng.randrange(self.opts.namespaces)}", f"chaos-{n}"
                    phase = rng.choice("ab")
                    body = {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": ns, "labels": {CM_LABEL: "true", "chaos-phase": phase}},
                        "data": {"n": str(n)},
                    }
                    status, _ = await self.post(f"{base}/api/v1/namespaces/{ns}/configmaps", body)
                    if status in (200, 201):
                        live[(ns, name)] = phase
                elif roll < 0.85:
                    ns, name = rng.choice(sorted(live))
                    phase = "b" if live[(ns, name)] == "a" else "a"
                    patch = {"metadata": {"labels": {"chaos-phase": phase}}, "data": {"at": str(time.time())}}
                    assert self.admin is not None
                    async with self.admin.patch(
                        f"{base}/api/v1/namespaces/{ns}/configmaps/{name}",
                        data=json.dumps(patch),
                        headers={"Content-Type": "application/merge-patch+json"},
                        timeout=aiohttp.ClientTimeout(total=5),
                    ) as resp:
                        await resp.read()
                        status = resp.status
                    if status == 200:
                        live[(ns, name)] = phase
                    elif status == 404:
                        live.pop((ns, name), None)
                else:
                    ns, name = rng.choice(sorted(live))
                    status, _ = await self.post(f"{base}/api/v1/namespaces/{ns}/configmaps/{name}", method="DELETE")
                    if status in (200, 404):
                        live.pop((ns, name), None)
                if status in (200, 201):
                    self.writes_ok += 1
                else:
                    self.writes_failed += 1
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                self.writes_failed += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.writer_stop.wait(), interval)

    async def _samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """(labels, value) of every sample ``name`` in the proxy's /metrics (every worker's); [] if unreachable."""
        assert self.admin is not None
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with self.admin.get(self.proxy_url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                text = (await resp.read()).decode()
            return [
                (sample.labels, sample.value)
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == name
            ]
        return []

    async def cache_rvs(self) -> dict[str, int]:
        """The newest cache rv per resource over the workers."""
        out: dict[str, int] = {}
        for labels, value in await self._samples("apiserver_watch_cache_resource_version"):
            out[labels["resource"]] = max(out.get(labels["resource"], 0), int(value))
        return out

    async def slow_watchers(self) -> dict[str, int]:
        """``watchcache_slow_watchers`` summed over workers and resources, by outcome."""
        out: dict[str, int] = {}
        for labels, value in await self._samples("watchcache_slow_watchers_total"):
            out[labels["outcome"]] = out.get(labels["outcome"], 0) + int(value)
        return out

    async def sent_early(self) -> dict[str, int]:
        """``watchcache_passthrough_sent_early_requests`` summed over workers, by outcome: how many of the
        registers' consistent GETs went to the upstream before their handler ran."""
        out: dict[str, int] = {}
        for labels, value in await self._samples("watchcache_passthrough_sent_early_requests_total"):
            out[labels["outcome"]] = out.get(labels["outcome"], 0) + int(value)
        return out

    async def wait_caches_at(self, rv: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        rvs: dict[str, int] = {}
        while time.monotonic() < deadline:
            rvs = await self.cache_rvs()
            if rvs and all(rvs.get(r, 0) >= rv for r in ("pods", "configmaps")):
                self.act(f"proxy caches at rv ≥ {rv}: {rvs}")
                return
            await asyncio.sleep(0.5)
        self.act(f"proxy caches not at rv {rv} after {timeout:.0f}s: {rvs}")

    async def diagnose(self) -> None:
        """What the workers look like when clients do not converge: cache state, CPU use."""
        views = await self.shards()
        assert self.admin is not None
        for w, view in sorted(views.items()):
            pid = int(view["pid"])
            try:
                before = _cpu_ticks(pid)
                await asyncio.sleep(1.0)
                cpu = f"{(_cpu_ticks(pid) - before) / os.sysconf('SC_CLK_TCK'):.2f} CPU-s/s"
            except (OSError, ValueError, IndexError):
                cpu = "?"
            self.act(f"worker {w} pid {pid} {cpu} owned {view['owned']} following {view['following']}")
        for _ in range(12):
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                async with self.admin.get(self.proxy_url + "/debug/cache", timeout=aiohttp.ClientTimeout(total=3)) as r:
                    body = await r.json()
                    brief = {
                        k: (v.get("rv"), v.get("oldest_rv"), v.get("watchers")) for k, v in body["resources"].items()
                    }
                    self.act(f"/debug/cache (rv, oldest_rv, watchers): {brief}")

    async def final_writes(self) -> None:
        """One write per cached resource, so each cache ends on an ordinary event (see KNOWN_BUGS)."""
        ns = "ns-0"
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chaos-final", "namespace": ns}}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "chaos-final", "namespace": ns, "labels": {"app": "chaos"}},
            "spec": {"containers": [{"name": "main", "image": "registry.example.com/chaos:v1"}]},
        }
        for kind, body in (("configmaps", cm), ("pods", pod)):
            try:
                status, _ = await self.post(f"{self.sim_url}/api/v1/namespaces/{ns}/{kind}", body)
                self.act(f"final write: POST {kind}/chaos-final: {status}")
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                self.act(f"final write of {kind} failed: {e}")

    def start_clients(self) -> None:
        mix = default_mix(self.opts.namespaces, self.opts.clients, transitions=True)
        per_session = 25
        lo, hi = max(5, int(20 * max(self.scale, 0.5))), max(10, int(40 * max(self.scale, 0.5)))
        for i, (spec, cfg) in enumerate(mix):
            if i % per_session == 0:
                self.sessions.append(new_session())
            cfg.watch_timeout = (lo, hi)
            cfg.digests = self.opts.digests
            inf = Informer(f"c{i:03d}", self.proxy_url, spec, self.sessions[-1], cfg, phase=self.phase, seed=i)
            self.informers.append(inf)
        # The slow one: a small receive buffer, so not reading backs the proxy up quickly.
        slow_session = new_session(small_buffer=True)
        self.sessions.append(slow_session)
        cfg = InformerConfig(watch_timeout=(lo, hi), digests=self.opts.digests, stuck_after=600.0)
        self.slow = Informer("slow", self.proxy_url, self.informers[0].spec, slow_session, cfg, phase=self.phase)
        self.informers.append(self.slow)
        self.tasks += [asyncio.ensure_future(inf.run()) for inf in self.informers]

    # ------------------------------------------------------------------ schedule

    def begin_phase(self, name: str) -> None:
        if self.phases:
            self.phases[-1].seconds = time.monotonic() - self.phases[-1].started
        self.phase.index = len(self.phases)
        self.phase.name = name
        self.phases.append(PhaseResult(name, time.monotonic()))
        self.say(f"phase {self.phase.index}: {name}")

    def schedule(self) -> list[tuple[Fault, float]]:
        faults = FAULTS
        total = sum(f.weight for f in faults)
        lengths = [max(f.min_seconds, self.opts.duration * f.weight / total) for f in faults]
        # Fit into the duration: shrink the ones above their minimum, proportionally.
        excess = sum(lengths) - self.opts.duration
        if excess > 0:
            slack = sum(length - f.min_seconds for f, length in zip(faults, lengths, strict=True))
            if slack > 0:
                ratio = max(0.0, 1 - excess / slack)
                lengths = [
                    f.min_seconds + (length - f.min_seconds) * ratio for f, length in zip(faults, lengths, strict=True)
                ]
        return list(zip(faults, lengths, strict=True))

    async def run(self) -> dict[str, Any]:
        self.admin = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0))
        try:
            await self.start_stack()
            self.begin_phase("startup")
            self.start_clients()
            self.tasks.append(asyncio.ensure_future(self.writer()))
            self.tasks.append(asyncio.ensure_future(self.watch_upstream_window()))
            await self.wait_clients_listed(60.0)
            # The long campaign (make chaos) reads and writes its registers harder: 10^5 operations or more.
            long = self.opts.duration >= 120
            self.registers = Registers(
                self.proxy_url, registers=16 if long else 8, readers=24 if long else 6, pause=0.005 if long else 0.02
            )
            await self.registers.start()
            # Phases end on a fixed timetable; one that overruns (a restart that took long) eats into
            # the next ones, down to their minimum, so the whole stays close to --duration.
            planned_end = time.monotonic()
            for fault, seconds in self.schedule():
                self.begin_phase(fault.name)
                planned_end += seconds
                length = max(fault.min_seconds, planned_end - time.monotonic())
                t0 = time.monotonic()
                await fault.run(self, length)
                left = length - (time.monotonic() - t0)
                if left > 0:
                    await asyncio.sleep(left)
            return await self.finish()
        finally:
            await self.teardown()

    async def wait_clients_listed(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(i.counters.lists for i in self.informers):
                self.say(f"all {len(self.informers)} clients listed and watching")
                return
            await asyncio.sleep(0.2)
        missing = [i.id for i in self.informers if not i.counters.lists]
        self.say(f"clients without a list after {timeout}s: {missing[:10]}")

    async def finish(self) -> dict[str, Any]:
        self.begin_phase("converge")
        self.writer_stop.set()
        if self.registers is not None:
            await self.registers.stop()
        await asyncio.sleep(0.5)
        assert self.sim is not None
        code = await asyncio.to_thread(self.sim.stop, 30.0)
        self.act(f"churn stopped: sim SIGTERM (exit {code}), restarted without churn")
        await self.start_sim(churn=0.0)
        # The proxy must notice the restart (410, relist at the journal's head); its reflectors may be
        # in backoff from the faults before (up to 30 s).
        await self.wait_caches_at(last_journal_rv(self.state_file), 40.0)
        if "relist-rv-livelock" in KNOWN_BUGS and not self.opts.expose_known_bugs:
            await self.final_writes()
        final_rv = last_journal_rv(self.state_file)
        heads = journal_heads(self.state_file)
        self.act(f"final upstream rv {final_rv}; last write per resource {heads}")
        # A client has converged once it has seen (an event or a bookmark at) the last write of its
        # resource: a quiet upstream sends no bookmark, so the global rv may never reach it.
        deadline = time.monotonic() + self.opts.converge_timeout
        lagging: list[Informer] = []
        while time.monotonic() < deadline:
            lagging = [i for i in self.informers if i.last_rv < heads.get(i.spec.resource, 0)]
            if not lagging:
                break
            await asyncio.sleep(0.25)
        self.act(f"converged: {len(self.informers) - len(lagging)}/{len(self.informers)} clients")
        if lagging:
            await self.diagnose()
        self.phases[-1].seconds = time.monotonic() - self.phases[-1].started
        for inf in self.informers:
            inf.stop()
        await asyncio.sleep(0.2)
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []
        self.early = await self.sent_early()
        return self.evaluate(final_rv, lagging)

    async def teardown(self) -> None:
        self.writer_stop.set()
        if self.registers is not None:
            await self.registers.stop()
        for inf in self.informers:
            inf.stop()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for s in self.sessions:
            await s.close()
        if self.admin is not None:
            await self.admin.close()
        for proc in (self.proxy, self.relay, self.sim):
            if proc is not None:
                await asyncio.to_thread(proc.stop, 30.0)

    # ------------------------------------------------------------------ verdict

    def evaluate(self, final_rv: int, lagging: list[Informer]) -> dict[str, Any]:
        t0 = time.monotonic()
        log = read_log(str(self.state_file), with_digest=self.opts.digests)
        upstream = Upstream(log)
        relists = relist_points(self.dir / "proxy.log")
        tolerate = False
        report = check(
            upstream, [(i.id, i.spec, i.records) for i in self.informers], relists, tolerate_replays=tolerate
        )
        lin = self.linearizability()
        lin["sent_early"] = self.early
        check_seconds = time.monotonic() - t0
        self.attribute(report)
        totals = {
            "events": sum(p.events for p in self.phases),
            "bookmarks": sum(p.bookmarks for p in self.phases),
            "reconnects": sum(p.reconnects for p in self.phases),
            "relists": sum(p.relists for p in self.phases),
            "relists_proxy": sum(p.relists_proxy for p in self.phases),
            "relists_upstream": sum(p.relists_upstream for p in self.phases),
            "violations": report.total_violations,
            "linearizability_violations": lin["violations"],
        }
        (self.dir / "timeline.txt").write_text("\n".join(self.timeline) + "\n")
        with open(self.dir / "not-converged.txt", "w") as f:
            for inf in lagging:
                f.write(f"{inf.id} {inf.spec.describe()} last_rv {inf.last_rv}\n")
                for rec in inf.records[-40:]:
                    f.write("   " + " ".join(str(x) for x in rec if not isinstance(x, dict)) + "\n")
        bad = {v.client for v in report.violations}
        if bad:
            with open(self.dir / "violating-clients.jsonl", "w") as f:
                for inf in self.informers:
                    if inf.id in bad:
                        f.write(json.dumps({"id": inf.id, "spec": asdict(inf.spec), "records": inf.records}) + "\n")
        result = {
            "duration": self.opts.duration,
            "known_bugs": (
                "none"
                if not KNOWN_BUGS
                else "exposed"
                if self.opts.expose_known_bugs
                else "avoided: " + ", ".join(KNOWN_BUGS)
            ),
            "clients": len(self.informers),
            "upstream_writes": len(log),
            "final_rv": final_rv,
            "not_converged": [i.id for i in lagging],
            "relist_points": {k: sorted(v) for k, v in relists.items()},
            "proxy_relists": self.proxy_relists,
            "relist_groups_accepted": sum(c.stats.relist_groups for c in report.clients),
            "replays_tolerated": sum(c.stats.tolerated for c in report.clients),
            "writes_ok": self.writes_ok,
            "writes_failed": self.writes_failed,
            "check_seconds": round(check_seconds, 1),
            "wall_seconds": round(time.monotonic() - self.started, 1),
            "totals": totals,
            "violations_by_kind": report.by_kind(),
            "linearizability": lin,
            "violations": [str(v) for v in report.violations[:50]],
            "phases": [asdict(p) for p in self.phases],
            "workdir": str(self.dir),
        }
        return result

    def linearizability(self) -> dict[str, Any]:
        """The registers' history checked: operations, consistent reads by kind, and any violation."""
        if self.registers is None:
            return {"operations": 0, "violations": 0, "examples": []}
        h = self.registers.history
        found = linearizability.check(h)
        return {
            "operations": h.operations,
            "reads": {kind: sum(1 for r in h.reads if r.kind == kind) for kind in ("list", "get")},
            "writes": sum(len(ws) for ws in h.writes.values()),
            "failed_reads": self.registers.failed_reads,
            "retried_writes": self.registers.retried_writes,
            "violations": len(found),
            "examples": [f"{v.read.client} [{v.read.start:.3f}, {v.read.end:.3f}] {v.why}" for v in found[:20]],
        }

    def cause_of(self, resource: str, when: float, rv: int, relists: dict[str, list[tuple[float, int]]]) -> str:
        """Who forced a client's 410 at ``when`` while it stood at ``rv``: "upstream" if the upstream
        itself refused ``rv`` then (below its window: compacted, restarted) or the proxy had relisted
        past ``rv`` because the upstream answered it 410 (the client held part of a relist diff, or
        resumed from before the relist); else "proxy": a fault of the proxy's own (worker kill,
        rolling restart, a bug). Times have 0.5 s of slack: the floor is polled."""
        if rv < self.floor_at(resource, when):
            return "upstream"
        if any(r > rv and t <= when + 0.5 for t, r in relists.get(resource, ())):
            return "upstream"
        return "proxy"

    def floor_at(self, resource: str, when: float) -> int:
        """The upstream's floor for ``resource`` at ``when``: the last one known by then, 0.5 s of slack."""
        return max((v for t, v in self.floors.get(resource, ()) if t <= when + 0.5), default=0)

    def evidence(
        self,
        inf: Informer,
        phase: PhaseResult,
        when: float,
        rv: int,
        message: str,
        relists: dict[str, list[tuple[float, int]]],
    ) -> dict[str, Any]:
        """What a report shows of a relist put on the proxy, so that one seen once (in CI) can be
        explained from its output alone: the 410's message, the upstream's floors and the proxy's
        relists around it, and the proxy's log lines before it."""
        resource = inf.spec.resource
        return {
            "client": inf.id,
            "watch": inf.spec.describe(),
            "phase": phase.name,
            "at": round(when - self.started_wall, 2),
            "rv": rv,
            "message": message,
            # The floor ``cause_of`` compared the rv with (the last one polled by then), and those around it.
            "floor_then": self.floor_at(resource, when),
            "floors": [(round(t - when, 2), v) for t, v in self.floors.get(resource, ()) if abs(t - when) < 10],
            "proxy_relists": [(round(t - when, 2), r) for t, r in relists.get(resource, ()) if abs(t - when) < 10],
            "proxy_log": lines_near(self.dir / "proxy.log", when),
        }  # fmt: skip

    def attribute(self, report: Report) -> None:
        """Per phase: events, clients affected, reconnects, relists (by cause), violations (record index → phase)."""
        by_client = {c.client: c for c in report.clients}
        relists = relist_times(self.dir / "proxy.log")
        for inf in self.informers:
            gone = iter(inf.gone_at)
            starts = [m[0] for m in inf.marks]
            phases = [m[1] for m in inf.marks]

            def phase_of(index: int, starts: list[int] = starts, phases: list[int] = phases) -> int:
                return phases[max(0, bisect_right(starts, index) - 1)]

            affected: set[int] = set()
            first_watch = True
            for index, rec in enumerate(inf.records):
                p = self.phases[phase_of(index)]
                kind = rec[0]
                if kind == "event":
                    p.events += 1
                elif kind == "bookmark":
                    p.bookmarks += 1
                elif kind == "reconnect":
                    if first_watch:
                        first_watch = False
                    else:
                        p.reconnects += 1
                elif kind == "list":
                    first_watch = True
                elif kind == "error":
                    affected.add(phase_of(index))
                    if rec[1] == 410:
                        p.relists += 1
                        when, rv, message = next(gone, (0.0, 0, ""))
                        if self.cause_of(inf.spec.resource, when, rv, relists) == "proxy":
                            p.relists_proxy += 1
                            if len(self.proxy_relists) < 10:  # (each reads the proxy's log: the first few explain)
                                self.proxy_relists.append(self.evidence(inf, p, when, rv, message, relists))
                        else:
                            p.relists_upstream += 1
                    else:
                        p.errors += 1
                        if rec[1] == 429:
                            p.retried += 1
            for pi in affected:
                self.phases[pi].clients_affected += 1
            for v in by_client[inf.id].violations:
                self.phases[phase_of(v.index)].violations += 1


def _cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


# ---------------------------------------------------------------------------- faults


def _s(c: Campaign, base: float, least: float) -> float:
    return max(least, base * c.scale)


async def f_baseline(c: Campaign, seconds: float) -> None:
    c.act("no fault")


async def f_upstream_kill(c: Campaign, seconds: float) -> None:
    await c.kill_sim(down=min(3.0, seconds / 4))


async def f_compaction(c: Campaign, seconds: float) -> None:
    n = 3 if seconds >= 9 else 1
    for i in range(n):
        await c.compact()
        if i < n - 1:
            await asyncio.sleep(seconds / (n + 1))


async def f_stall(c: Campaign, seconds: float) -> None:
    await c.sim_fault(
        {"kind": "stall", "seconds": round(min(seconds - 1, max(STALL_TIMEOUT + 1.5, _s(c, 10, 6.5))), 1)}
    )


async def f_error_500(c: Campaign, seconds: float) -> None:
    await c.sim_fault({"kind": "error", "code": 500, "seconds": round(seconds * 0.6, 1)})


async def f_error_429(c: Campaign, seconds: float) -> None:
    await c.sim_fault({"kind": "error", "code": 429, "seconds": round(seconds * 0.6, 1)})


async def f_owner_kill(c: Campaign, seconds: float) -> None:
    await c.kill_worker("owner")


async def f_follower_kill(c: Campaign, seconds: float) -> None:
    await c.kill_worker("follower")


async def f_rolling_restart(c: Campaign, seconds: float) -> None:
    await c.rolling_restart()


async def f_slow_client(c: Campaign, seconds: float) -> None:
    pause = 60.0 if c.opts.duration >= 300 else min(seconds - 1, max(10.0, 60.0 * c.scale))
    assert c.slow is not None
    before = await c.slow_watchers()
    c.slow.pause(pause)
    c.act(f"client {c.slow.id} ({c.slow.spec.describe()}) stops reading for {pause:.0f}s")
    await asyncio.sleep(min(seconds - 0.5, pause + 2.0))
    after = await c.slow_watchers()
    c.act(f"proxy's slow watchers (lagged/caught up/expired) before {before}, after {after}")


async def f_network(c: Campaign, seconds: float) -> None:
    await c.relay_config({"latency": 0.15, "jitter": 0.05, "bandwidth": 400_000})
    await asyncio.sleep(max(1.0, seconds * 0.7))
    await c.relay_config({})


async def f_combined(c: Campaign, seconds: float) -> None:
    """Everything at once: slow network, a slow client, compactions, worker kills, a stall, a sim kill, 500s."""
    step = seconds / 8
    await c.relay_config({"latency": 0.1, "jitter": 0.05, "bandwidth": 1_000_000})
    assert c.slow is not None
    pause = min(seconds * 0.6, 30.0)
    c.slow.pause(pause)
    c.act(f"client {c.slow.id} stops reading for {pause:.0f}s")
    await c.compact()
    await asyncio.sleep(step)
    errors = {"kind": "error", "code": 500, "seconds": round(step * 2, 1)}
    await asyncio.gather(c.kill_worker("owner"), c.sim_fault(errors))
    await asyncio.sleep(step)
    await c.sim_fault({"kind": "stall", "seconds": STALL_TIMEOUT + 1.5})
    await asyncio.gather(c.kill_worker("follower"), c.compact())
    await asyncio.sleep(step)
    await c.kill_sim(down=1.0)
    await c.sim_fault(errors)
    await asyncio.sleep(step)
    await c.relay_config({})


FAULTS = [
    Fault("baseline (no fault)", 1.0, 3.0, f_baseline),
    Fault("upstream SIGKILL + restart", 1.3, 4.0, f_upstream_kill),
    Fault("upstream compaction (410 → relist)", 1.0, 3.0, f_compaction),
    Fault("upstream stall > stall timeout", 1.3, 8.0, f_stall),
    Fault("upstream 500s", 1.0, 4.0, f_error_500),
    Fault("upstream 429s", 1.0, 4.0, f_error_429),
    Fault("owner worker SIGKILL", 1.3, 4.0, f_owner_kill),
    Fault("follower worker SIGKILL", 1.3, 4.0, f_follower_kill),
    Fault("rolling restart (supervisor SIGTERM)", 1.6, 6.0, f_rolling_restart),
    Fault("client stops reading", 4.3, 11.0, f_slow_client),
    Fault("slow network proxy↔upstream", 1.3, 5.0, f_network),
    Fault("combined", 2.3, 9.0, f_combined),
]


# ---------------------------------------------------------------------------- report


def table(result: dict[str, Any]) -> str:
    head = (
        "| phase | s | events delivered | clients affected | reconnects | relists (410) | by the proxy's faults "
        "| forced by the upstream | errors seen | violations |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in result["phases"]:
        lines.append(
            f"| {p['name']} | {p['seconds']:.0f} | {p['events']:,} | {p['clients_affected']} | {p['reconnects']:,} "
            f"| {p['relists']:,} | {p['relists_proxy']:,} | {p['relists_upstream']:,} | {p['errors']:,} "
            f"| {p['violations']} |"
        )
    t = result["totals"]
    lines.append(
        f"| **total** | {sum(p['seconds'] for p in result['phases']):.0f} | **{t['events']:,}** | {result['clients']} "
        f"| {t['reconnects']:,} | {t['relists']:,} | **{t['relists_proxy']:,}** | {t['relists_upstream']:,} "
        f"| {sum(p['errors'] for p in result['phases']):,} | **{t['violations']}** |"
    )
    return "\n".join(lines)


def summary(result: dict[str, Any]) -> str:
    t = result["totals"]
    out = [table(result), ""]
    out.append(
        f"clients {result['clients']}, upstream writes {result['upstream_writes']:,} (final rv {result['final_rv']}), "
        f"configmap writes ok/failed {result['writes_ok']}/{result['writes_failed']}, "
        f"relist groups accepted {result['relist_groups_accepted']}, "
        f"idempotent replays tolerated {result['replays_tolerated']}, not converged {len(result['not_converged'])}, "
        f"check {result['check_seconds']}s, wall {result['wall_seconds']}s"
    )
    out.append(
        f"relists caused by the proxy's own faults: {t['relists_proxy']:,}; forced by the upstream (compacted or "
        f"outside its window, or after the proxy's relist on the upstream's 410): {t['relists_upstream']:,}; "
        f"429s (the client retried from its rv): {sum(p.get('retried', 0) for p in result['phases']):,}"
    )
    lin = result["linearizability"]
    out.append(
        f"linearizability of consistent reads: {lin['operations']:,} operations ({lin.get('reads')} reads, "
        f"{lin.get('writes', 0):,} writes; {lin.get('failed_reads', 0)} reads failed, {lin.get('retried_writes', 0)} "
        f"writes retried), {lin['violations']} violations; consistent GETs sent before their handler ran "
        f"(used/dropped): {lin.get('sent_early', {}).get('used', 0)}/{lin.get('sent_early', {}).get('dropped', 0)}"
    )
    for e in result.get("proxy_relists", [])[:5]:
        out.append(
            f"  put on the proxy: {e['client']} ({e['watch']}) at {e['at']}s in {e['phase']!r}, standing at rv "
            f"{e['rv']}: {e['message']!r}; upstream floor then {e.get('floor_then')}, floors (s from it, rv) "
            f"{e['floors']}; proxy relists "
            f"{e['proxy_relists']}; the proxy's log before it:"
        )
        out += [f"    {line}" for line in e["proxy_log"]]
    out += [f"  {v}" for v in lin["examples"][:10]]
    out.append(f"violations by kind: {result['violations_by_kind']}; known bugs {result['known_bugs']}")
    for v in result["violations"][:20]:
        out.append(f"  {v}")
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> Options:
    p = argparse.ArgumentParser(prog="python -m loadtest.chaos.campaign", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=300.0, help="seconds of fault injection (default 300)")
    p.add_argument("--clients", type=int, default=120, help="informer clients, plus one slow one (default 120)")
    p.add_argument("--churn", type=float, default=None, help="sim pod writes/s (default 100; 50 under 120 s)")
    p.add_argument("--objects", type=int, default=None, help="pods in the sim (default 1000; 500 under 120 s)")
    p.add_argument("--namespaces", type=int, default=10)
    p.add_argument("--writes", type=float, default=8.0, help="configmap writes/s (default 8)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", help="where logs and the journal go (default: a temp dir, removed on success)")
    p.add_argument("--keep", action="store_true", help="keep the workdir even on success")
    p.add_argument("--json", dest="json_path", help="write the result as JSON here")
    p.add_argument("--min-events", type=int, default=None, help="fail below this many events delivered")
    p.add_argument("--quiet", action="store_true")
    p.add_argument(
        "--expose-known-bugs",
        action="store_true",
        help="drive into the product bugs already found (KNOWN_BUGS) instead of steering around them",
    )
    p.add_argument(
        "--max-proxy-relists",
        type=int,
        default=None,
        help="fail when the proxy's own faults (worker kills, rolling restart) cost more relists (410s) than this",
    )
    a = p.parse_args(argv)
    churn = a.churn if a.churn is not None else (100.0 if a.duration >= 120 else 50.0)
    objects = a.objects if a.objects is not None else (1000 if a.duration >= 120 else 500)
    min_events = a.min_events if a.min_events is not None else int(a.duration * 100)
    return Options(
        duration=a.duration, clients=a.clients, churn=churn, objects=objects, namespaces=a.namespaces,
        writes=a.writes, seed=a.seed, workdir=a.workdir, keep=a.keep, json_path=a.json_path, min_events=min_events,
        quiet=a.quiet, expose_known_bugs=a.expose_known_bugs, max_proxy_relists=a.max_proxy_relists,
    )  # fmt: skip


def run_campaign(opts: Options) -> dict[str, Any]:
    try:
        import uvloop

        return uvloop.run(Campaign(opts).run())
    except ImportError:  # pragma: no cover
        return asyncio.run(Campaign(opts).run())


def verdict(result: dict[str, Any], min_events: int, max_proxy_relists: int | None = None) -> list[str]:
    problems = []
    if max_proxy_relists is not None and result["totals"]["relists_proxy"] > max_proxy_relists:
        problems.append(f"{result['totals']['relists_proxy']} relists caused by the proxy's own faults")
    if result["totals"]["violations"]:
        problems.append(f"{result['totals']['violations']} guarantee violations")
    if result["totals"]["linearizability_violations"]:
        problems.append(f"{result['totals']['linearizability_violations']} consistent reads not linearizable")
    if result["not_converged"]:
        problems.append(f"{len(result['not_converged'])} clients did not converge: {result['not_converged'][:10]}")
    if result["totals"]["events"] < min_events:
        problems.append(f"only {result['totals']['events']} events delivered (want ≥ {min_events})")
    return problems


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    result = run_campaign(opts)
    print()
    print(summary(result))
    if opts.json_path:
        Path(opts.json_path).write_text(json.dumps(result, indent=2))
    problems = verdict(result, opts.min_events, opts.max_proxy_relists)
    if problems:
        print("FAILED: " + "; ".join(problems) + f" (logs in {result['workdir']})")
        return 1
    print(f"OK: no guarantee violated ({result['totals']['events']:,} events delivered)")
    if not opts.keep and not opts.workdir:
        shutil.rmtree(result["workdir"], ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["FAULTS", "Campaign", "Options", "main", "python_m", "run_campaign", "summary", "table", "verdict"]
