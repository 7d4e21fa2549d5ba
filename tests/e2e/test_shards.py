"""`watchcache serve --workers 3` in front of the simulated cluster: every worker serves every
resource, one upstream watch per resource in total, answers are the same on every worker."""

from __future__ import annotations

import os
import signal
import time

import orjson
import pytest

from harness.processes import Stack, start, start_stack
from harness.waiting import wait_until
from tests.support.httpkube import WatchStream, get, get_ok, key_of, path_with, request, rv_of

RESOURCES = {
    "pods": "/api/v1/pods",
    "configmaps": "/api/v1/configmaps",
    "namespaces": "/api/v1/namespaces",
    "nodes": "/api/v1/nodes",
    "services": "/api/v1/services",
    "serviceaccounts": "/api/v1/serviceaccounts",
    "apps/v1/deployments": "/apis/apps/v1/deployments",
}


@pytest.fixture
def sharded() -> Stack:
    s = start_stack("--workers", "3", sim_args=("--objects", "200", "--namespaces", "3"))
    yield s
    s.proxy.stop()
    s.sim.stop()


def worker_views(url: str, tries: int = 300) -> dict[int, dict]:
    """/debug/shards of every worker, found by opening fresh connections (SO_REUSEPORT spreads them)."""
    seen: dict[int, dict] = {}
    for _ in range(tries):
        view = get_ok(url, "/debug/shards")
        seen[view["worker"]] = view
        if len(seen) == view["workers"]:
            return seen
    raise AssertionError(f"only reached workers {sorted(seen)}")


def _restarted(url: str, owner: int, victim: int) -> bool:
    """Whether worker ``owner`` answers again, as a new process (not yet: it is not accepting)."""
    try:
        return worker_views(url, tries=20)[owner]["pid"] != victim
    except AssertionError:
        return False


def test_every_worker_serves_every_resource_with_one_upstream_watch_each(sharded):
    url = sharded.proxy.url
    views = worker_views(url)
    assert sorted(views) == [0, 1, 2]
    owners = views[0]["owners"]
    assert {v["workers"] for v in views.values()} == {3}
    # Each worker owns what the map gives it: every kind cached from the start, the others (served,
    # cached on demand) once a read starts them.
    assert all(set(v["owned"]) <= {r for r, o in owners.items() if o == w} for w, v in views.items())
    assert set().union(*(v["owned"] for v in views.values())) >= set(RESOURCES)
    # Many fresh connections per resource: every worker answers every resource, owner or follower.
    for _ in range(12):
        for path in RESOURCES.values():
            assert get(url, path, resourceVersion="0").status == 200
    views = worker_views(url)
    for w, view in views.items():
        assert set(view["owned"]) | set(view["following"]) >= {r for r in RESOURCES if owners[r] != w} & set(
            view["following"]
        )
    upstream = get_ok(sharded.sim.url, "/debug/cache")["resources"]
    for name in ("pods", "configmaps", "namespaces", "nodes", "services", "serviceaccounts", "apps/v1/deployments"):
        assert upstream[name]["watchers"] == 1, (name, upstream[name])
        assert upstream[name]["watch_requests"] == 1, (name, upstream[name])


def test_continue_tokens_and_exact_reads_cross_workers(sharded):
    url = sharded.proxy.url
    first = get_ok(url, "/api/v1/pods", limit=10)
    rv = first["metadata"]["resourceVersion"]
    names = [key_of(p) for p in first["items"]]
    token = first["metadata"].get("continue")
    pages = 1
    while token:  # each page on a fresh connection: a different worker most of the time
        page = get_ok(url, "/api/v1/pods", limit=10, **{"continue": token})
        assert page["metadata"]["resourceVersion"] == rv
        names += [key_of(p) for p in page["items"]]
        token = page["metadata"].get("continue")
        pages += 1
    assert pages >= 20 and len(names) == len(set(names))
    exact = get_ok(sharded.sim.url, "/api/v1/pods", resourceVersion=rv, resourceVersionMatch="Exact")
    assert names == [key_of(p) for p in exact["items"]]


def test_watch_resumed_on_other_workers_continues_without_loss(sharded):
    url = sharded.proxy.url
    start_rv = get_ok(url, "/api/v1/configmaps", limit=1)["metadata"]["resourceVersion"]
    written = []
    for i in range(12):
        res = request(
            url, "POST", "/api/v1/namespaces/ns-0/configmaps", {"metadata": {"name": f"r{i}"}, "data": {"i": str(i)}}
        )
        assert res.status == 201, res
        written.append(("ADDED", f"ns-0/r{i}", res.json()["metadata"]["resourceVersion"]))
    seen = []
    rv = start_rv
    while len(seen) < len(written):  # three events per connection, then resume elsewhere from the last rv
        with WatchStream(url, path_with("/api/v1/namespaces/ns-0/configmaps", watch=1, resourceVersion=rv)) as w:
            for _ in range(3):
                event = w.next(5.0)
                assert event is not None and event["type"] != "ERROR", event
                seen.append((event["type"], key_of(event["object"]), event["object"]["metadata"]["resourceVersion"]))
                rv = event["object"]["metadata"]["resourceVersion"]
                if len(seen) == len(written):
                    break
    assert seen == written


def test_sigkill_of_an_owner_is_survived(sharded):
    url = sharded.proxy.url
    views = worker_views(url)
    owner = views[0]["owners"]["pods"]
    victim = views[owner]["pid"]
    rv = get_ok(url, "/api/v1/pods", limit=1)["metadata"]["resourceVersion"]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    # Its resources are served again (by the restarted owner or a follower) within 5 s.
    while True:
        try:
            # Connections queued on the killed worker's socket are reset: clients retry, as here.
            served = get(url, "/api/v1/pods", resourceVersion="0").status == 200
            if served and worker_views(url)[owner]["pid"] != victim:
                break
        except (ConnectionError, AssertionError):
            pass  # reset on the killed socket, or the restarted worker not reached yet
        assert time.monotonic() - killed_at < 5.0, "pods not served by a restarted owner within 5 s"
        time.sleep(0.1)
    # Writes after the kill reach watchers on every worker, resumed from before the kill.
    res = request(
        url,
        "POST",
        "/api/v1/namespaces/ns-1/pods",
        {"metadata": {"name": "after-kill"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    assert res.status == 201, res
    new_rv = rv_of(res.json())
    for _ in range(6):
        with WatchStream(url, path_with("/api/v1/pods", watch=1, resourceVersion=rv, allowWatchBookmarks=True)) as w:
            event = w.until(
                lambda e: e["type"] == "ERROR" or (e["type"] != "BOOKMARK" and rv_of(e["object"]) >= new_rv),
                timeout=10.0,
            )[-1]
            # A worker whose window still holds rv resumes; a restarted owner may not: an honest 410.
            if event["type"] == "ERROR":
                assert event["object"]["code"] == 410
            else:
                assert key_of(event["object"]) == "ns-1/after-kill"
    upstream = get_ok(sharded.sim.url, "/debug/cache")["resources"]["pods"]
    assert upstream["watchers"] == 1


def test_a_restarted_owner_accepts_only_once_its_caches_are_synced():
    """While the restarted owner lists its kinds again, its peers take the clients it would answer
    429 "not synced yet" (kube's answer while its cache initialises, and what it answered before)."""
    s = start_stack("--workers", "2", sim_args=("--objects", "200", "--namespaces", "3"))
    try:
        url = s.proxy.url
        views = worker_views(url)
        owner = views[0]["owners"]["pods"]
        victim = views[owner]["pid"]
        rv = get_ok(url, "/api/v1/pods", limit=1)["metadata"]["resourceVersion"]
        # The other worker follows pods before the kill (a follower first created while its owner
        # is down has nothing to serve: its reads wait, then get the same 429).
        wait_until(
            lambda: (
                get(url, "/api/v1/pods", resourceVersion="0").status == 200
                and "pods" in worker_views(url)[1 - owner]["following"]
            ),
            what="the other worker following pods",
        )
        # The upstream refuses everything for 3 s: the restarted owner cannot list its kinds meanwhile.
        fault = request(s.sim.url, "POST", "/sim/faults", {"kind": "error", "code": 503, "seconds": 3})
        assert fault.status == 200, fault
        os.kill(victim, signal.SIGKILL)
        statuses: dict[object, int] = {}

        def watch() -> None:
            try:
                w = WatchStream(url, path_with("/api/v1/pods", watch=1, resourceVersion=rv))
            except ConnectionError:
                statuses["reset"] = statuses.get("reset", 0) + 1  # queued on the killed worker's socket
                return
            with w:  # its head is what counts: 200 and a stream, or 429
                statuses[w.status] = statuses.get(w.status, 0) + 1

        while not _restarted(url, owner, victim):
            for _ in range(20):
                watch()
        for _ in range(40):  # fresh connections: some land on the restarted owner
            watch()
        assert 429 not in statuses, statuses
        assert statuses.get(200, 0) >= 40, statuses
    finally:
        s.proxy.stop()
        s.sim.stop()


def test_sigterm_sends_a_final_bookmark_and_exits_within_the_drain_timeout():
    s = start_stack(
        "--workers",
        "2",
        sim_args=(
            "--objects",
            "20",
        ),
    )
    try:
        url = s.proxy.url
        rv = get_ok(url, "/api/v1/pods", limit=1)["metadata"]["resourceVersion"]
        watches = [
            WatchStream(url, path_with("/api/v1/pods", watch=1, resourceVersion=rv, allowWatchBookmarks=True))
            for _ in range(4)
        ]  # each has its response head: its watcher is registered (in the step that wrote the head)
        started = time.monotonic()
        s.proxy.process.send_signal(signal.SIGTERM)
        for w in watches:
            events = []
            while (event := w.next(10.0)) is not None:
                events.append(event)
            assert events and events[-1]["type"] == "BOOKMARK", events[-3:]
            assert int(events[-1]["object"]["metadata"]["resourceVersion"]) >= int(rv)
            w.close()
        assert s.proxy.process.wait(15) == 0
        assert time.monotonic() - started < 15
    finally:
        s.proxy.stop()
        s.sim.stop()


def _answer(url: str, path: str, worker: int) -> tuple[int, str]:
    """``path`` answered by ``worker`` (fresh connections until that one answers; others are skipped,
    and a connection queued on a stopped worker times out). ``path`` gets longer: /readyz?verbose
    and /debug/cache ask every worker, and wait up to 2 s for one that is stopped."""
    for _ in range(400):
        try:
            view = request(url, "GET", "/debug/shards", timeout=0.5).json()
            if view["worker"] != worker:
                continue
            res = request(url, "GET", path, timeout=5.0)
            # The same worker? A second request may land elsewhere: check again after it.
            if request(url, "GET", "/debug/shards", timeout=0.5).json()["worker"] == worker:
                return res.status, res.body.decode()
        except OSError:
            pass
    raise AssertionError(f"worker {worker} never answered {path}")


def test_readyz_waits_for_every_worker_and_every_resource():
    """A group is ready only once every worker has synced every resource it owns: a worker whose own
    caches are synced still says not ready while another has not synced (a probe reaches any one)."""
    sim_proc = start("sim", "--objects", "50", "--namespaces", "2")
    proxy = None
    try:
        sim = sim_proc.url
        # Hold the upstream (every API request 500s) and start the group behind it: nothing can sync.
        assert request(sim, "POST", "/sim/faults", {"kind": "error", "code": 500, "seconds": 120}).status == 200
        proxy = start("serve", "--upstream", sim, "--workers", "2")
        url = proxy.url
        views = worker_views(url)
        stopped, running = views[0], views[1]
        os.kill(stopped["pid"], signal.SIGSTOP)  # worker 0 will not sync until SIGCONT
        try:
            assert request(sim, "DELETE", "/sim/faults").status == 200
            # Worker 1 syncs what it owns...
            wait_until(lambda: "[-]cache-synced" not in _answer(url, "/readyz?verbose", 1)[1], 30)
            status, text = _answer(url, "/readyz?verbose", 1)
            assert all("[+]cache-synced" in line for line in text.splitlines() if "cache-synced" in line), text
            # ... and still is not ready: worker 0 has not synced.
            assert status == 500 and "[-]workers-synced failed: workers [0] not synced" in text, text
        finally:
            os.kill(stopped["pid"], signal.SIGCONT)
        wait_until(lambda: _answer(url, "/readyz", 1)[0] == 200 and _answer(url, "/readyz", 0)[0] == 200, 30)
        # Ready: every worker's every owned cache has synced.
        for w in (0, 1):
            stats = orjson.loads(_answer(url, "/debug/cache", w)[1])["resources"]
            owned = set(worker_views(url)[w]["owned"])
            assert owned and all(stats[r]["ready"] for r in stats), (w, owned, stats)
        assert running["pid"] == worker_views(url)[1]["pid"]
    finally:
        if proxy is not None:
            proxy.stop()
        sim_proc.stop()
