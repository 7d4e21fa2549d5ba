"""Replica failover: the clients of a dead proxy replica resume on another, independent one.

Production runs several independent ``watchcache serve`` replicas behind one Service. When one dies,
its clients reconnect through the Service to another replica and resume their watches from the last
rv they saw: the replicas share the upstream's version space (resource versions pass through
unchanged), so that resume must cost nothing — no relist, no 410, every update once and in order.

``ReplicaService`` is that Service: two (or more) ``ProxyGroup`` replicas of the same flags and the
same continue-token key, behind one address, a relay (``harness.relay.Relay``, its target switched)
that sends every *new* connection to the active replica; ``fail_over`` moves it to the next (the
Service dropping the dead pod's endpoint). Connections open through the relay end when the replica
behind them dies. It is a ``ProxyGroup`` for ``RestartScenario``: its ``url`` is the relay's.

``FailoverScenario`` is ``RestartScenario`` (the writer, the recorder, 24 informers, the checker's
verdict) with faults of its own (``FAILOVER_FAULTS``):

* ``failover-sigkill``: SIGKILL of replica A's process group (supervisor and workers: a node or
  container lost), then the Service routes to B;
* ``failover-sigterm``: the Service routes new connections to B, then A gets SIGTERM and drains (a
  rolling update's old pod: its watches get their final BOOKMARK, resumed on B);
* ``failover-sigterm-late``: A gets SIGTERM while the Service still routes to it, and the Service
  moves only once A has exited (endpoints and the signal race in a rolling update): A's clients
  resume on the draining A first (its 429s, then connections refused), then on B;
* ``failover-sigkill-lagging``: as ``failover-sigkill``, but B's link to the upstream (a relay,
  ``FailoverScenario.standby_link``) gets ``standby_lag`` seconds of latency, and the kill waits
  until B's cache is ``lag_changes`` of the recorder's changes behind the upstream: its new clients
  come with rvs it has not reached (they must wait for it, not get 410), and the paged LIST's
  continue pages on B wait too. Keep the lag under ``--fresh-wait`` (3 s): a continue page B cannot
  reach by then is 504, as documented (seen with 4 s: ``Timeout: Too large resource version:
  748726, current: 748683``);
* ``failover-sigkill-late``: as ``failover-sigkill``, but the Service keeps routing to the dead A
  (connections refused) until the upstream has made ``switch_after_writes`` more changes, as
  endpoints take a while to drop a dead pod: given B a history shorter than that by age
  (``STANDBY_ARGS``: ``--history-max-age 1``), its new clients come with rvs older than its window,
  to be served from the upstream's history (the backfill), not 410. (Bounded by count instead,
  ``--history-max-events 30``, they get the documented 410: a span that does not fit in the window is
  not backfilled.)

Before the fault (and after B's lag, if any), with both replicas up and the writer running,
``paged_across`` pages a LIST across the replicas (page 1 from A, the next from B, then A...) with
their shared continue-token key, and compares what the pages make with one Exact LIST of the
upstream at the first page's rv; one more LIST gets its first page from A before the kill and the
rest from B, through the Service, after it.

Two tiers run it: ``tests/reference/test_replica_failover.py`` (the kit's kube-apiserver, one
namespace, the recorder's log) and ``tests/reliability/test_failover.py`` (``run_failover_on_sim``:
``watchcache sim``, its journal the log, cluster-wide clients too).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from harness.checker import object_key, read_log
from harness.processes import Proc
from harness.relay import Relay
from harness.waiting import until
from tests.reliability.restarts import (
    LABEL,
    RESOURCE,
    Outcome,
    ProxyGroup,
    Recorder,
    RestartScenario,
    ScenarioOptions,
    Target,
    free_port,
    proxy_argv,
    sim_argv,
)

FAILOVER_FAULTS = (
    "failover-sigkill",
    "failover-sigterm",
    "failover-sigterm-late",
    "failover-sigkill-lagging",
    "failover-sigkill-late",
)
# B's flags beside A's: at a "-late" fault its history (1 s) is shorter than the time the Service still
# routes to the dead A (80 writes at 40/s), so A's clients come with rvs older than B's window.
STANDBY_ARGS = {"failover-sigkill-late": ("--history-max-age", "1")}


@dataclass
class ReplicaService(ProxyGroup):
    """Independent replicas behind one relay; new connections go to ``replicas[active]``."""

    replicas: list[ProxyGroup] = field(default_factory=list)
    active: int = 0
    relay: Relay | None = None

    @classmethod
    def of(cls, replicas: list[ProxyGroup], workdir: Path) -> ReplicaService:
        return cls(argv=[], log_path=workdir / "service.log", port=0, replicas=replicas)

    @property
    def current(self) -> Proc:
        return self.replicas[self.active].current

    async def start(self, timeout: float) -> float:
        """Every replica not running started (at once); the relay listening. Seconds until all are ready."""
        t0 = time.monotonic()
        if self.relay is None:
            self.relay = Relay("127.0.0.1", self.replicas[self.active].port)
            self.port = await self.relay.start("127.0.0.1", 0)
        await asyncio.gather(*(r.start(timeout) for r in self.replicas if not (r.procs and r.current.running())))
        return time.monotonic() - t0

    def fail_over(self) -> int:
        """New connections go to the next replica from now on (the Service dropped the active one)."""
        assert self.relay is not None
        self.active = (self.active + 1) % len(self.replicas)
        self.relay.target = ("127.0.0.1", self.replicas[self.active].port)
        return self.active

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()

    async def close(self) -> None:
        self.stop()
        if self.relay is not None:
            await self.relay.close()

    def relist_lines(self) -> list[str]:
        return [f"{chr(65 + i)}: {ln}" for i, r in enumerate(self.replicas) for ln in r.relist_lines()]

    def tracebacks(self) -> list[str]:
        """Every traceback in the replicas' logs, named by replica."""
        return [f"{chr(65 + i)}: {tb}" for i, r in enumerate(self.replicas) for tb in r.tracebacks()]


@dataclass
class PagedList:
    """One LIST of ``namespace``'s ConfigMaps read a page at a time, each page from the URL given; then
    checked against one Exact LIST of the upstream at page 1's rv (in order, no duplicates, equal)."""

    namespace: str
    limit: int
    selector: str = ""
    rv: str = ""
    token: str = ""
    pages: int = 0
    got: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/{RESOURCE}"

    def _selector(self) -> dict[str, str]:
        return {"labelSelector": self.selector} if self.selector else {}

    async def next_page(self, url: str) -> bool:
        """The next page from ``url``; whether another follows (False after an error, recorded)."""
        params = {**self._selector(), "limit": str(self.limit), **({"continue": self.token} if self.token else {})}
        async with (
            aiohttp.ClientSession(headers={"Accept": "application/json"}) as s,
            s.get(url + self.path, params=params) as resp,
        ):
            body = await resp.read()
            if resp.status != 200:
                self.problems.append(f"page {self.pages + 1} from {url}: {resp.status} {body[:300]!r}")
                return False
        self.pages += 1
        meta = orjson.loads(body)["metadata"]
        if not self.rv:
            self.rv = meta["resourceVersion"]
        elif meta["resourceVersion"] != self.rv:
            self.problems.append(f"page {self.pages} from {url} at rv {meta['resourceVersion']}, page 1 at {self.rv}")
        self.got += [(object_key(o), o["metadata"]["resourceVersion"]) for o in orjson.loads(body).get("items") or []]
        self.token = meta.get("continue") or ""
        return bool(self.token)

    async def check(self, upstream: Target) -> list[str]:
        """What is wrong with the pages read (errors included), against the upstream at page 1's rv."""
        if self.problems or not self.rv:
            return self.problems
        async with upstream.session(force_close=False) as s:
            params = {**self._selector(), "resourceVersion": self.rv, "resourceVersionMatch": "Exact"}
            async with s.get(upstream.url + self.path, params=params) as resp:
                assert resp.status == 200, await resp.text()
                doc = orjson.loads(await resp.read())
        want = [(object_key(o), o["metadata"]["resourceVersion"]) for o in doc["items"]]
        keys = [k for k, _ in self.got]
        out = []
        if len(set(keys)) != len(keys):
            out.append(f"duplicates across pages: {sorted(k for k in set(keys) if keys.count(k) > 1)[:5]}")
        if keys != sorted(keys):
            out.append("items out of order across pages")
        if self.got != want:
            diff = sorted(set(self.got) ^ set(want))[:6]
            out.append(f"{len(self.got)} items over {self.pages} pages vs {len(want)} upstream at rv {self.rv}: {diff}")
        return out


async def paged_across(
    upstream: Target, urls: list[str], namespace: str, limit: int, selector: str = ""
) -> tuple[int, int, list[str]]:
    """A LIST paged across ``urls`` in turn (page 1 from the first, page 2 from the next...), checked
    (``PagedList``): (rv, pages, problems)."""
    listing = PagedList(namespace, limit, selector)
    while await listing.next_page(urls[listing.pages % len(urls)]):
        pass
    return int(listing.rv or 0), listing.pages, await listing.check(upstream)


@dataclass
class FailoverScenario(RestartScenario):
    """``RestartScenario`` through a ``ReplicaService``: the fault kills the active replica."""

    # The paged LISTs checked before the fault: (selector, rv, pages), and what was wrong with them.
    paged: list[tuple[str, int, int]] = field(default_factory=list)
    paged_problems: list[str] = field(default_factory=list)
    # The standby replica's link to the upstream, slowed by ``standby_lag`` seconds at a "-lagging" fault.
    standby_link: Relay | None = None
    standby_lag: float = 1.0
    # At a "-late" fault: the changes (seen by the recorder) made before the Service drops the dead replica.
    switch_after_writes: int = 80
    # At a "-lagging" fault: how many of the recorder's changes B must be behind before the kill (the
    # lag took hold; it grows to ``standby_lag`` meanwhile). Small: a slowed writer must still get there.
    lag_changes: int = 10
    page_limit: int = 7  # of the paged LISTs

    @property
    def service(self) -> ReplicaService:
        assert isinstance(self.proxy, ReplicaService)
        return self.proxy

    # Seconds from the kill (SIGKILL; with SIGTERM, A's exit: its clients were on A until it drained)
    # until each client was first past the newest rv seen then (an event or a bookmark from B).
    resumed: dict[str, float] = field(default_factory=dict)
    _resuming: asyncio.Future[None] | None = None
    outcome: Outcome | None = None  # run()'s, for callers handed the scenario

    async def run(self) -> Outcome:
        try:
            outcome = await super().run()
        finally:
            if self._resuming is not None:
                self._resuming.cancel()
                await asyncio.gather(self._resuming, return_exceptions=True)
        if len(self.resumed) == len(self.informers) and self.resumed:
            times = sorted(self.resumed.values())
            since = "kill" if self.opts.fault.startswith("failover-sigkill") else "A's exit"
            outcome.timings[f"{since} to a client past it, median"] = times[len(times) // 2]
            outcome.timings[f"{since} to every client past it"] = times[-1]
        return outcome

    async def _standby_behind(self, namespace: str, changes: int) -> int:
        """Wait until the standby's cache is ``changes`` changes behind the recorder (the lag took hold):
        how far behind, in rvs."""
        recorder, standby = self.recorder, self.service.replicas[(self.service.active + 1) % 2]
        assert recorder is not None, "a lag needs a recorder"
        url = f"{standby.url}/api/v1/namespaces/{namespace}/{RESOURCE}"
        behind = 0
        async with aiohttp.ClientSession() as s:

            async def lagging() -> bool:
                nonlocal behind
                async with s.get(url, params={"resourceVersion": "0", "limit": "1"}) as resp:
                    rv = int(orjson.loads(await resp.read())["metadata"]["resourceVersion"])
                newer = [e for e in recorder.entries[-changes - 1 :] if e.rv > rv]
                behind = recorder.rv - rv
                return len(newer) >= changes

            t0 = time.monotonic()
            while not await lagging():
                assert time.monotonic() - t0 < self.opts.step_timeout, f"the standby not behind: {behind}"
                await asyncio.sleep(0.02)
        return behind

    def _time_resume_from_now(self) -> None:
        # The newest rv anyone has seen now (a direct watcher or a client): every client must pass it.
        at = max([i.last_rv for i in self.informers] + [self.recorder.rv if self.recorder is not None else 0])
        self._resuming = asyncio.ensure_future(self._time_resume(time.monotonic(), at))

    async def _time_resume(self, killed: float, rv: int) -> None:
        """Fill ``resumed``: per client, the seconds from the kill until its rv passed ``rv``."""
        while len(self.resumed) < len(self.informers):
            for i in self.informers:
                if i.id not in self.resumed and i.last_rv > rv:
                    self.resumed[i.id] = time.monotonic() - killed
            await asyncio.sleep(0.01)

    async def _fault(self) -> None:
        o, svc = self.opts, self.service
        if o.fault not in FAILOVER_FAULTS:
            return await super()._fault()
        t0 = time.monotonic()
        if o.fault.endswith("-lagging"):
            assert self.standby_link is not None, f"{o.fault} needs a standby_link"
            self.standby_link.configure({"latency": self.standby_lag})
            behind = await self._standby_behind(o.namespaces[0], self.lag_changes)
            self.say(f"the standby's link to the upstream: {self.standby_lag:g}s latency; B {behind} rvs behind")
        urls = [r.url for r in svc.replicas]
        for selector in ("", f"{LABEL},phase=a"):
            rv, pages, problems = await paged_across(self.upstream, urls, o.namespaces[0], self.page_limit, selector)
            self.paged.append((selector, rv, pages))
            self.paged_problems += [f"LIST {selector or 'all'} paged across replicas: {p}" for p in problems]
        # A LIST whose first page the dying replica serves and the rest, after the failover, the other.
        interrupted = PagedList(o.namespaces[0], self.page_limit)
        await interrupted.next_page(svc.replicas[svc.active].url)
        self.timings["paged lists"] = time.monotonic() - t0
        victim = svc.replicas[svc.active]
        if o.fault.startswith("failover-sigkill"):
            self._time_resume_from_now()
            victim.sigkill_group()
            if o.fault.endswith("-late"):
                recorder = self.recorder
                assert recorder is not None, f"{o.fault} needs a recorder"
                mark, t1 = len(recorder.entries), time.monotonic()
                await until(
                    lambda: len(recorder.entries) >= mark + self.switch_after_writes,
                    o.step_timeout,
                    what="writes while the service still routes to the dead replica",
                    interval=0.02,
                )
                self.timings["routed to the dead replica"] = time.monotonic() - t1
            svc.fail_over()
            self.say(f"SIGKILL: replica A's process group; the service routes to replica {chr(65 + svc.active)}")
        elif o.fault == "failover-sigterm-late":
            code = await victim.sigterm(30.0)
            svc.fail_over()
            self._time_resume_from_now()
            self.say(f"SIGTERM: replica A exited {code}; the service routes to replica {chr(65 + svc.active)}")
        else:
            svc.fail_over()
            code = await victim.sigterm(30.0)
            self._time_resume_from_now()
            self.say(f"the service routes to replica {chr(65 + svc.active)}; SIGTERM: replica A exited {code}")
        while await interrupted.next_page(svc.url):
            pass
        self.paged.append(("across the failover", int(interrupted.rv or 0), interrupted.pages))
        problems = await interrupted.check(self.upstream)
        self.paged_problems += [f"LIST paged across the failover: {p}" for p in problems]
        return None


async def run_failover_on_sim(
    opts: ScenarioOptions, workdir: Path, say: Callable[[str], None] = print
) -> FailoverScenario:
    """The failover scenario against ``watchcache sim`` (the suite tier): its journal is the log; a
    recorder of the first namespace tells the scenario the upstream's progress (B's lag, the late switch)."""
    journal = workdir / "sim.journal"
    sim = Proc(sim_argv(0, journal, len(opts.namespaces)), name="sim", log_path=workdir / "sim.log")
    sim.start()
    try:
        url = await asyncio.to_thread(sim.wait_ready, opts.step_timeout)
        host, _, port = url.removeprefix("http://").rpartition(":")
        link = Relay(host, int(port))
        link_url = f"http://127.0.0.1:{await link.start('127.0.0.1', 0)}"
        key = workdir / "continue-token.key"
        key.write_text(secrets.token_hex(32))
        extra = (*opts.proxy_args, "--continue-token-key-file", str(key))
        replicas = []
        for name, upstream_url in (("a", url), ("b", link_url)):
            more = STANDBY_ARGS.get(opts.fault, ()) if name == "b" else ()
            p = free_port()
            argv = proxy_argv(p, ["--upstream", upstream_url], opts.workers, (*extra, *more))
            replicas.append(ProxyGroup(argv, workdir / f"replica-{name}.log", p))
        service = ReplicaService.of(replicas, workdir)
        upstream = Target(url)
        # The recorder sees the first namespace's share of the writes; the sim's namespaces are smaller.
        share = len(opts.namespaces)
        scenario = FailoverScenario(
            opts, upstream, service, lambda: read_log(str(journal)), say,
            recorder=Recorder(upstream, opts.namespaces[0]), standby_link=link,
            switch_after_writes=80 // share, lag_changes=10 // share, page_limit=3,
        )  # fmt: skip
        try:
            scenario.outcome = await scenario.run()
        finally:
            await service.close()
            await link.close()
        return scenario
    finally:
        sim.stop(30.0)


def assert_failover_verdict(scenario: FailoverScenario, outcome: Outcome) -> None:
    """Both tiers' verdict: the restart scenario's (no relist or 410, every update once and in order,
    final states), the LISTs paged across the replicas equal to the upstream's, no traceback."""
    print(outcome.summary())
    print(f"paged across replicas (selector, rv, pages): {scenario.paged} {scenario.paged_problems}")
    assert outcome.clients >= 20 and outcome.writes > 150
    assert outcome.events > 1000, outcome.summary()
    assert scenario.paged_problems == [], scenario.paged_problems
    assert scenario.paged and all(pages > 1 for _, _, pages in scenario.paged), scenario.paged
    errors = Counter(r[1] for i in scenario.informers for r in i.records if r[0] == "error")
    print(f"clients' errors by HTTP status (0: the connection failed): {dict(errors)}")
    gone = sorted({m for i in scenario.informers for _, _, m in i.gone_at})
    assert outcome.problems() == [], f"{outcome.summary()}\n410s: {gone[:5]}"
    tracebacks = scenario.service.tracebacks()
    assert not tracebacks, tracebacks[0]
