"""Two watchcache tiers in front of one upstream: the outer tier's clients see exactly what the upstream did.

::

    watchcache sim --state-file J   <-  cut (a relay in this process: closed and reopened to cut the
                                        inner tier off its upstream while the changes are made)
                                    <-  inner: serve --upstream cut --workers 2
                                    <-  relay (in this process; during the relist it writes every chunk
                                        in 150-byte pieces 25 ms apart, so groups of events straddle
                                        network reads)
                                    <-  outer: serve --upstream relay  <-  informer-style clients

The clients (``harness/fleet.py``) list in pages of 7 items (every list is chunked,
read at the first page's rv while the sim churns pods), watch with bookmarks and resume every few
seconds from the newest rv they saw. The inner tier is made to relist configmaps: cut off its
upstream, it misses changes made meanwhile — one configmap created, three deleted, one
modified — and a compaction after them, so its resume gets 410 whatever rv it held. Its diff
travels to the outer tier announced (a BOOKMARK annotated with its end rv), split across reads by
the relay; the outer tier buffers it and applies it as one relist of its own, so no client of it
ever reads the diff's intermediate states (its deletions' rvs are stamped, not the upstream's).
The watch-guarantee checker (``harness/checker.py``) then checks every client's record
against the sim's journal: nothing lost, repeated or reordered, every LIST the state at its rv.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.checker import Upstream, WatchSpec, check, iter_records, read_log
from harness.fleet import Informer, InformerConfig, new_session
from harness.processes import Proc, logged, start, wait_ready
from harness.proxylog import relist_points_in
from harness.relay import Relay
from harness.waiting import until
from tests.support.httpkube import cm_path, configmap, get_ok, pipelined, rv_of, write

SPECS = [
    WatchSpec("configmaps"),
    WatchSpec("configmaps", "ns-0"),
    WatchSpec("configmaps", None, "tier"),
    WatchSpec("configmaps", "ns-0", "tier=gone"),
    WatchSpec("pods"),
    WatchSpec("pods", "ns-1"),
]
DOOMED = ["e2e-del-0", "e2e-del-1", "e2e-del-2"]
TOOK_DIFF = re.compile(r"took the upstream's relist diff of configmaps at rv (\d+): \d+ changes in (\d+) reads")


def relist_rvs(*procs: Proc) -> dict[str, set[int]]:
    """Where the tiers relisted (their reflectors) or resynced (their followers), per resource."""
    return relist_points_in(line for proc in procs for line in proc.log)


def metric(url: str, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def cache_rv(url: str, resource: str) -> int:
    return int(get_ok(url, "/debug/cache")["resources"][resource]["rv"])


@pytest.mark.timeout(240)
def test_two_tiers_compose_lists_resumes_and_a_relist_of_the_inner_tier(tmp_path: Path) -> None:
    journal = tmp_path / "sim.journal"
    sim = start(
        "sim", "--objects", "40", "--namespaces", "2", "--churn", "10", "--bookmark-interval", "300",
        "--state-file", str(journal),
    )  # fmt: skip
    procs: list[Proc] = [sim]
    try:
        asyncio.run(scenario(journal, sim, procs))
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(Exception):
                proc.stop()


async def serve(upstream_port: int, workers: int) -> Proc:
    proc = await asyncio.to_thread(
        start, "serve", "--upstream", f"http://127.0.0.1:{upstream_port}", "--resources", "pods,configmaps",
        "--workers", str(workers), "--bookmark-interval", "1",
    )  # fmt: skip
    await asyncio.to_thread(wait_ready, proc)
    return proc


async def scenario(journal: Path, sim: Proc, procs: list[Proc]) -> None:
    sim_host, sim_port = sim.host_port.split(":")
    cut = Relay(sim_host, int(sim_port))
    cut_port = await cut.start("127.0.0.1", 0)
    inner = await serve(cut_port, workers=2)
    procs.append(inner)
    host, inner_port = inner.host_port.split(":")
    relay = Relay(host, int(inner_port))
    outer = await serve(await relay.start("127.0.0.1", 0), workers=1)
    procs.append(outer)
    for name in ["e2e-keep", "e2e-mod", *DOOMED]:
        await asyncio.to_thread(write, sim.url, "POST", cm_path("ns-0"), labelled(name))

    sessions = [new_session() for _ in range(2)]
    informers = [
        Informer(
            f"c{i}-{spec.describe()}",
            outer.url,
            spec,
            sessions[i % 2],
            InformerConfig(page_size=7, watch_timeout=(2, 4), list_mode="consistent" if i % 3 == 2 else "any"),
            seed=i,
        )
        for i, spec in enumerate(SPECS * 2)
    ]
    tasks = [asyncio.ensure_future(inf.run()) for inf in informers]
    try:
        await until(
            what="every client to list",
            timeout=30.0,
            blocking=True,
            interval=0.1,
            condition=lambda: all(inf.counters.lists for inf in informers),
        )
        await asyncio.sleep(2.0)  # a few resumes on the outer tier before the relist

        # 25 ms between 150-byte pieces: through 2 ms pauses a busy 2-core CI machine (the suite runs
        # two workers) left the outer tier unscheduled, and it read the whole group at once.
        relay.configure({"split": 150, "split_pause": 0.025})
        split_before = metric(outer.url, "watchcache_split_groups_total", resource="configmaps")
        # The inner tier, cut off, misses the changes and the compaction after them (so its resume
        # gets 410 whatever rv a bookmark or a consistency probe had brought it to): it relists.
        lost = "reflector configmaps: watching -> backoff"
        before = sum(lost in line for line in inner.log)
        await cut.close()
        await until(
            what="the inner tier to lose its watch",
            timeout=30.0,
            blocking=True,
            interval=0.1,
            condition=lambda: sum(lost in line for line in inner.log) > before,
        )
        answers = await asyncio.to_thread(
            pipelined,
            sim.url,
            [
                ("POST", cm_path("ns-0"), labelled("e2e-new"), "application/json"),
                *[("DELETE", cm_path("ns-0", name), None, "application/json") for name in DOOMED],
                ("PATCH", cm_path("ns-0", "e2e-mod"), {"data": {"v": "2"}}, "application/merge-patch+json"),
                ("POST", "/sim/compact", None, "application/json"),
            ],
        )
        assert [status for status, _ in answers] == [201, 200, 200, 200, 200, 200], answers
        changed = max(rv_of(body) for _, body in answers[:-1])
        await cut.start("127.0.0.1", cut_port)
        await until(
            what="the inner tier to relist configmaps",
            timeout=30.0,
            blocking=True,
            interval=0.1,
            condition=lambda: logged(inner, "relisted configmaps"),
        )
        await until(
            what="the outer tier to apply the diff",
            timeout=30.0,
            blocking=True,
            interval=0.1,
            condition=lambda: cache_rv(outer.url, "configmaps") >= changed,
        )
        relay.configure({})
        after = await asyncio.to_thread(write, sim.url, "POST", cm_path("ns-1"), labelled("e2e-after"))
        cm_clients = [inf for inf in informers if inf.spec.resource == "configmaps"]
        await until(
            what="configmap clients to see the write after the relist",
            timeout=30.0,
            blocking=True,
            interval=0.1,
            condition=lambda: all(inf.counters.last_rv >= rv_of(after) for inf in cm_clients),
        )
        await asyncio.sleep(3.0)  # more resumes, on a quiet configmaps resource
        # The outer tier ends where the upstream is (a consistent read: proven fresh through both tiers).
        through = await asyncio.to_thread(get_ok, outer.url, "/api/v1/configmaps")
        direct = await asyncio.to_thread(get_ok, sim.url, "/api/v1/configmaps")
        assert through["items"] == direct["items"]
    finally:
        for inf in informers:
            inf.stop()
        await asyncio.wait(tasks, timeout=10)
        for task in tasks:
            task.cancel()
        for session in sessions:
            await session.close()
        await relay.close()
        await cut.close()

    # The scenario did what it says.
    assert not logged(outer, "relisted configmaps"), "the outer tier relisted instead of applying the diff"
    taken = [m for line in outer.log if (m := TOOK_DIFF.search(line))]
    assert taken, "the outer tier did not take the inner tier's relist diff as a relist"
    assert max(int(m.group(2)) for m in taken) >= 2, "the diff did not straddle two reads: the relay did not split it"
    split = metric(outer.url, "watchcache_split_groups_total", resource="configmaps") - split_before
    assert split == 0, "the outer tier applied part of the diff as events"
    assert any(len(r[2]) > 7 for inf in informers for r in inf.records if r[0] == "list"), "no chunked list"
    assert sum(inf.counters.watches for inf in informers) > 3 * len(informers), "too few resumes"
    whole = [inf for inf in cm_clients if inf.spec == SPECS[0]]
    for inf in whole:
        deleted = {r[2] for r in inf.records if r[0] == "event" and r[1] == "DELETED"}
        assert {f"ns-0/{n}" for n in DOOMED} <= deleted or inf.counters.gone, "the diff did not reach the client"

    upstream = Upstream(read_log(str(journal)))
    report = check(upstream, [(inf.id, inf.spec, inf.records) for inf in informers], relist_rvs(inner, outer))
    details = []
    for client in report.clients:
        if client.violations:
            inf = next(i for i in informers if i.id == client.client)
            details.append("\n".join([*map(str, client.violations), *list(iter_records(inf.records))[-40:]]))
    assert report.total_violations == 0, "\n\n".join(details)


def labelled(name: str) -> dict[str, Any]:
    cm = configmap(name, "ns-0" if name != "e2e-after" else "ns-1", v="1")
    cm["metadata"]["labels"] = {"tier": "gone" if name in DOOMED else "kept"}
    return cm
