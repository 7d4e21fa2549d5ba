"""Reference tier: a real kube-apiserver restarts behind the proxy (a control-plane rolling upgrade).

The scenario of ``tests/reference/test_restarts.py`` (``tests.reliability.restarts``: ``watchcache
serve --workers 2 --resources configmaps``, 24 informer-style clients through it on one namespace, a
writer at 40 writes/s straight on the apiserver), but the fault is the *apiserver's*: SIGTERM (a
rolling upgrade) or SIGKILL, then the same apiserver starts again on its port; the proxy keeps
running. The apiserver is one of our own over the kit's etcd (``harness/kube/private.py``): the kit's
shared apiserver must never be restarted.

What the proxy's clients may see: the proxy's reflector loses its watch, resumes from its rv once the
apiserver is back, and the new apiserver's watch cache (which starts at etcd's revision of its start)
may answer 410; the proxy then relists and hands its clients the difference, as events. So:

* no client relists or sees a 410: the proxy keeps its own window;
* every update seen once and in order (the checker, against a recorder watching the apiserver
  directly, whose gap at the restart is read from etcd's history by Exact LISTs): a relist diff
  is accepted only at the rvs where the proxy's log says it relisted;
* every client at the apiserver's head, its state equal to a LIST of the apiserver;
* no traceback in the proxy's log.

While the apiserver is down (``probe_downtime``): a consistent GET and LIST through the proxy must not
be served from the cache (nothing can prove it fresh): any error, as a Kubernetes Status, within a
bound; an rv=0 LIST may be (and is) served from the cache; an informer that starts then (rv=0 LIST,
then a watch from its rv) must list and watch without error and follow the apiserver once it is back,
checked as the others.

Run: ``eval "$(../shared/tools/kube-reference/env.sh)"``, then
``.venv/bin/pytest -q -s tests/reference/test_upstream_restart.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from harness.checker import Upstream, WatchSpec, check
from harness.fleet import Informer, InformerConfig, new_session
from harness.kube.kit import Api, KubeEnv, needs_kube
from harness.kube.private import PrivateApiserver
from harness.proxygroup import tracebacks
from harness.waiting import until
from tests.reliability.restarts import (
    RESOURCE,
    UPSTREAM_FAULTS,
    Outcome,
    ProxyGroup,
    Recorder,
    RestartScenario,
    ScenarioOptions,
    Target,
    free_port,
    proxy_argv,
    replay,
)

pytestmark = [pytest.mark.reference, needs_kube]

# A read through the proxy while the apiserver is down answers within this (it must not hang).
PROBE_BOUND = 30.0


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateApiserver]:
    # With kube's default (0), a SIGTERMed apiserver stops listening at once but leaves open watches
    # open, silent, until its 60 s shutdown timeout: seen here, the proxy's watch ended 60.0 s after
    # the signal. A control plane that rolls sets a grace period in which watches are ended.
    grace = ["--shutdown-watch-termination-grace-period=5s"]
    server = PrivateApiserver(KubeEnv.from_environ(), tmp_path_factory.mktemp("upstream-restart"), extra=grace)
    try:
        server.start()
        yield server
    finally:
        server.close()


@dataclass
class Answer:
    what: str
    status: int
    seconds: float
    body: dict[str, Any]

    def __str__(self) -> str:
        b = self.body
        rv = (b.get("metadata") or {}).get("resourceVersion")
        if b.get("kind") == "Status":
            said = f"Status {b.get('reason')} {b.get('code')} {str(b.get('message'))[:160]!r}"
        elif "items" in b:
            said = f"{b.get('kind')} of {len(b['items'] or [])} items at rv {rv}"
        else:
            said = f"{b.get('kind')} at rv {rv}"
        return f"{self.what}: {self.status} in {self.seconds:.2f}s, {said}"


@dataclass
class Downtime:
    """What the proxy answered while the apiserver was down."""

    proxy_url: str
    namespace: str
    answers: list[Answer] = field(default_factory=list)
    informer: Informer | None = None
    task: asyncio.Future[None] | None = None
    session: aiohttp.ClientSession | None = None

    async def _ask(self, s: aiohttp.ClientSession, what: str, path: str, params: dict[str, str]) -> Answer:
        t0 = time.monotonic()
        try:
            async with s.get(self.proxy_url + path, params=params, timeout=aiohttp.ClientTimeout(PROBE_BOUND)) as r:
                raw = await r.read()
                status = r.status
        except TimeoutError:
            return Answer(what, 0, time.monotonic() - t0, {"kind": "no answer"})
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = {"kind": f"not JSON: {raw[:200]!r}"}
        return Answer(what, status, time.monotonic() - t0, body)

    async def probe(self) -> None:
        collection = f"/api/v1/namespaces/{self.namespace}/{RESOURCE}"
        async with Target(self.proxy_url).session() as s:
            self.answers = list(
                await asyncio.gather(
                    self._ask(s, "consistent GET", f"{collection}/i20-1", {}),
                    self._ask(s, "consistent LIST", collection, {}),
                    self._ask(s, "consistent LIST limit=5", collection, {"limit": "5"}),
                    self._ask(s, "LIST rv=0", collection, {"resourceVersion": "0"}),
                    self._ask(s, "GET rv=0", f"{collection}/i20-1", {"resourceVersion": "0"}),
                )
            )
        # A watch opened while down, from the rv=0 LIST's rv, for 3 s: answered, and what it streams.
        listed = next(a for a in self.answers if a.what == "LIST rv=0")
        rv = str((listed.body.get("metadata") or {}).get("resourceVersion") or 0)
        params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "3"}
        t0 = time.monotonic()
        async with Target(self.proxy_url).session() as s:
            try:
                async with s.get(
                    self.proxy_url + collection, params=params, timeout=aiohttp.ClientTimeout(PROBE_BOUND)
                ) as r:
                    answered = time.monotonic() - t0
                    lines = (await r.read()).splitlines()
                kinds = [orjson.loads(line).get("type") for line in lines if line.strip()]
                body = {"kind": f"watch answered in {answered:.2f}s, ended after 3 s with {kinds}"}
                self.answers.append(Answer(f"watch from rv {rv}", r.status, time.monotonic() - t0, body))
            except TimeoutError:
                self.answers.append(Answer(f"watch from rv {rv}", 0, time.monotonic() - t0, {"kind": "no answer"}))
        # An informer that starts while the apiserver is down (rv=0 LIST, then a watch from its rv),
        # checked at the end as the others.
        self.session = new_session()
        cfg = InformerConfig(list_mode="any", watch_timeout=(10, 20))
        inf = self.informer = Informer("down", self.proxy_url, WatchSpec(RESOURCE, self.namespace), self.session, cfg)
        self.task = asyncio.ensure_future(inf.run())
        await until(lambda: inf.counters.watches > 0 or inf.counters.errors > 0, 20.0, what="the downtime informer")


async def run(
    private: PrivateApiserver, fault: str, namespace: str, workdir: Path
) -> tuple[Outcome, Downtime, list[str], str]:
    """The scenario; its outcome, the downtime's answers, the downtime informer's problems, and a report."""
    kube = private.env()
    upstream = Target(kube.url, kube.token, kube.ca)
    port = free_port()
    opts = ScenarioOptions(fault=fault, namespaces=(namespace,), cluster_wide=False, step_timeout=90.0)
    proxy = ProxyGroup(proxy_argv(port, ["--kubeconfig", kube.kubeconfig], opts.workers), workdir / "proxy.log", port)
    recorder = Recorder(upstream, namespace)
    downtime = Downtime(proxy.url, namespace)
    scenario = RestartScenario(
        opts,
        upstream,
        proxy,
        lambda: recorder.entries,
        recorder=recorder,
        upstream_control=private,
        during_downtime=downtime.probe,
    )
    problems: list[str] = []
    try:
        outcome = await scenario.run()
        inf = downtime.informer
        assert inf is not None
        # The namespace's state at the end, replayed from the log.
        truth: dict[str, int] = {}
        for e in recorder.entries:
            if e.type == "DELETED":
                truth.pop(e.key, None)
            else:
                truth[e.key] = e.obj_rv
        head = max(e.rv for e in recorder.entries)
        try:
            await until(lambda: inf.last_rv >= head, 30.0, what="the downtime informer at the head")
        except TimeoutError:
            problems.append(f"the downtime informer stopped at rv {inf.last_rv}, the head is {head}")
        inf.stop()
        accepted = {rv for rv, _ in outcome.upstream_relists} if recorder.lost else ()  # as the scenario's verdict
        checked = check(Upstream(recorder.entries), [(inf.id, inf.spec, inf.records)], accepted)
        problems += [f"downtime informer: {v}" for v in checked.violations[:10]]
        state = replay(inf.records)
        if state != truth:
            problems.append(f"downtime informer's final state: {sorted(set(state.items()) ^ set(truth.items()))[:6]}")
        c = inf.counters
        if c.lists != 1 or c.gone or c.errors:
            problems.append(f"downtime informer: {c.lists} lists, {c.gone} 410s, {c.errors} errors")
        report = (
            f"downtime informer: lists {c.lists}, 410s {c.gone}, watches {c.watches}, errors {c.errors}, "
            f"events {c.events}, bookmarks {c.bookmarks}, last rv {inf.last_rv}\n"
            f"recorder: {recorder.disconnects} disconnects; " + "; ".join(recorder.gaps or ["no 410, no gap"])
        )
        return outcome, downtime, problems, report
    finally:
        if downtime.informer is not None:
            downtime.informer.stop()
        if downtime.task is not None:
            downtime.task.cancel()
            await asyncio.gather(downtime.task, return_exceptions=True)
        if downtime.session is not None:
            await downtime.session.close()
        proxy.stop()


@pytest.mark.parametrize("fault", list(UPSTREAM_FAULTS))
@pytest.mark.timeout(300)
def test_an_apiserver_restart_behind_the_proxy_costs_its_clients_nothing(
    private: PrivateApiserver, fault: str, tmp_path: Path
) -> None:
    import uvloop

    kube = private.env()
    namespace = f"i20u-{fault}"
    api = Api(kube.url, kube.token, kube.ca)
    try:
        api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    finally:
        api.close()
    outcome, downtime, problems, report = uvloop.run(run(private, fault, namespace, tmp_path))
    print(outcome.summary())
    print("\n".join(str(a) for a in downtime.answers))
    print(report)
    logged = tracebacks(tmp_path / "proxy.log")
    assert not logged, logged[0]
    assert outcome.clients >= 20 and outcome.writes > 150
    assert outcome.problems() == [], outcome.summary()
    answers = {a.what: a for a in downtime.answers}
    watch = next(a for a in downtime.answers if a.what.startswith("watch"))
    assert watch.status == 200 and "ERROR" not in str(watch.body), watch
    for what in ("consistent GET", "consistent LIST", "consistent LIST limit=5"):
        a = answers[what]
        assert a.status >= 500 and a.body.get("kind") == "Status", f"stale or no answer while down: {a}"
    assert answers["LIST rv=0"].status == 200, answers["LIST rv=0"]
    assert problems == [], problems
