"""Product bugs the fault campaign found, each pinned by a failing regression test (xfail strict).

When a bug is fixed its test starts passing, ``strict=True`` turns that into a failure, and
the marker must be removed: the test then guards the fix.
"""

from __future__ import annotations

import orjson
import pytest

from harness.checker import LogEntry, WatchSpec, check, rec_bookmark, rec_event, rec_list, rec_reconnect
from harness.doubles import RecordingSink
from harness.processes import start, wait_ready
from tests.support.factories import pod
from tests.support.handlers import Harness, arun
from tests.support.httpkube import request
from watchcache.cache.predicate import SelectionPredicate
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import PODS
from watchcache.watchers.watcher import Watcher


def test_relist_diff_keeps_resource_versions_increasing_for_a_selective_watcher() -> None:
    # Upstream log: a and b (app=web) at 1 and 2; then a leaves the selection at 4 and b changes at 7.
    log = [
        LogEntry(1, "pods", "ADDED", "default/a", 1, {"app": "web"}),
        LogEntry(2, "pods", "ADDED", "default/b", 2, {"app": "web"}),
        LogEntry(4, "pods", "MODIFIED", "default/a", 4, {"app": "db"}),
        LogEntry(7, "pods", "MODIFIED", "default/b", 7, {"app": "web", "v": "2"}),
    ]
    cacher = Cacher(PODS)
    cacher.replace([pod("a", rv=1, labels={"app": "web"}), pod("b", rv=2, labels={"app": "web"})], 2)
    watcher = Watcher(
        PODS, SelectionPredicate.parse(PODS, None, "app=web", ""), 2, RecordingSink(), allow_bookmarks=True
    )
    cacher.add_watcher(watcher)
    # The proxy's upstream answered 410; a fresh list at rv 10 is handed over as a diff.
    cacher.relist([pod("a", rv=4, labels={"app": "db"}), pod("b", rv=7, labels={"app": "web", "v": "2"})], 10)

    records = [rec_list(2, {"default/a": 1, "default/b": 2}), rec_reconnect(2)]
    frames = [orjson.loads(line) for line in b"".join(watcher.take()[0]).splitlines()]
    for frame in frames:
        rv = int(frame["object"]["metadata"]["resourceVersion"])
        if frame["type"] == "BOOKMARK":
            records.append(rec_bookmark(rv))
        else:
            meta = frame["object"]["metadata"]
            records.append(rec_event(frame["type"], f"{meta['namespace']}/{meta['name']}", rv))
    seen = [(f["type"], int(f["object"]["metadata"]["resourceVersion"])) for f in frames]
    report = check(log, [("informer", WatchSpec("pods", None, "app=web"), records)], relist_rvs={10})
    # A client-go reflector remembers the rv of every event: after DELETED@10 a reconnect resumes
    # from 10 and the rest of the group (b@7) is never delivered.
    assert report.violations == [], f"frames {seen}: {[str(v) for v in report.violations]}"


@pytest.mark.timeout(60)
def test_proxy_syncs_once_upstream_errors_stop() -> None:
    sim = start("sim", "--objects", "20", "--namespaces", "2")
    proxy = None
    try:
        res = request(sim.url, "POST", "/sim/faults", {"kind": "error", "code": 500, "seconds": 2})
        assert res.status == 200, res
        proxy = start("serve", "--upstream", sim.url, "--workers", "1", "--resources", "pods")
        # kube-apiserver clients (client-go reflectors) retry every error with backoff; the fault ends
        # after 2 s, so the proxy should be ready well within 15 s.
        wait_ready(proxy, timeout=15.0)
    finally:
        if proxy is not None:
            proxy.stop()
        sim.stop()


@arun
async def test_watch_ahead_of_a_relisting_cache_gets_no_event_at_or_before_its_rv() -> None:
    h = Harness()  # the cache (a follower, say) is at rv 10: p0..p4 at rv 1..5
    # The client listed elsewhere at rv 15 (p1 changed at 12, p2 at 14) and watches here from 15.

    watch = await h.start_watch(resourceVersion="15").in_flight()  # waiting for the cache to reach 15
    # The follower catches up from its owner's new state at 18 (p3 changed at 18): a relist diff.
    objs = [pod(f"p{i}", rv=i + 1, labels={"i": str(i % 2)}) for i in (0, 4)]
    objs += [pod("p1", rv=12, labels={"i": "1"}), pod("p2", rv=14, labels={"i": "0"})]
    objs += [pod("p3", rv=18, labels={"i": "1", "v": "2"})]
    h.cacher.relist(objs, 18)
    await watch.started()
    resp = await watch.close()
    # A 410 is an honest answer too (the cache's history restarted past 15): the client relists.
    delivered = [
        (e["type"], e["object"]["metadata"]["name"], int(e["object"]["metadata"]["resourceVersion"]))
        for e in resp.events()
        if e["type"] != "ERROR"
    ]
    # kube-apiserver waits until its cache reaches 15 (or answers 504 "Too large resource version");
    # either way the client never sees p1@12 or p2@14 again.
    assert [d for d in delivered if d[2] <= 15] == [], delivered


@arun
async def test_a_watch_from_the_rv_a_list_returned_is_not_410_after_a_relist() -> None:
    h = Harness()  # pods p0..p4 at rv 1..5, cache at rv 10
    # The upstream answered 410; the fresh list at 20 differs in two objects: a group of two events at 20.
    objs = [pod(f"p{i}", rv=i + 1, labels={"i": str(i % 2)}) for i in range(3)] + [pod("p5", rv=15)]
    h.cacher.relist(objs, 20)  # p5 ADDED at 15; p3, p4 DELETED (stamped 19 and 20: one frame at 20, the last)
    listed = (await h.list()).json()
    rv = listed["metadata"]["resourceVersion"]
    assert rv == "20"
    # An informer watches from its list's rv (nothing written since): kube serves this watch.
    resp = await h.watch(resourceVersion=rv)
    errors = [e["object"] for e in resp.events() if e["type"] == "ERROR"]
    assert errors == [], errors
    # A client that got only part of the diff holds an rv below 20: it must relist, not resume.
    for partial in ("15", "19"):
        [event] = (await h.watch(resourceVersion=partial)).events()
        assert (event["type"], event["object"]["code"]) == ("ERROR", 410)
