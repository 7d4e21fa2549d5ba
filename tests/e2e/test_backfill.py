"""Backfill end to end: `watchcache sim` + `watchcache serve --workers 2`, restarted on the same port.

After the proxy restarts (SIGKILL of its whole process group, or SIGTERM), clients come back
with resourceVersions from before its new window. Each must be served from the upstream's
history — every update once and in order, selector transitions included — at the cost of one
or two fetches, counted by the simulated cluster itself; a paged LIST goes on across the
restart; and only an rv the upstream compacted gets 410, saying so. (The informer scenario,
with the checker, is tests/reliability/test_restarts.py.)
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.processes import Proc, free_port, python_m, start, wait_ready
from tests.support.httpkube import WatchStream, configmap, get, get_ok, path_with, request, rv_of

CM = "/api/v1/namespaces/ns-0/configmaps"


def start_proxy(sim: Proc, port: int, key: Path, *args: str) -> Proc:
    """``watchcache serve --workers 2`` on a fixed port (so that a restart takes the same one), its own group."""
    cmd = [sys.executable, "-m", "watchcache", "serve", "--upstream", sim.url, "--workers", "2"]
    cmd += ["--resources", "configmaps", "--continue-token-key-file", str(key), *args]
    cmd += ["--listen", f"127.0.0.1:{port}"]
    proc = Proc(cmd, name="proxy", new_session=True).up(30)
    wait_ready(proc)
    return proc


def kill_group(proc: Proc) -> None:
    proc.kill()  # its own session: the supervisor and its workers


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include ``labels``."""
    text = get(url, "/metrics").body.decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"([a-z_]+)\{([^}]*)\} (\S+)", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def write(sim: Proc, name: str, **labels: str) -> int:
    body = {"metadata": {"labels": labels}, "data": {"v": str(time.monotonic_ns())}}
    res = request(sim.url, "PATCH", f"{CM}/{name}", body, content_type="application/merge-patch+json")
    assert res.status == 200, res
    return rv_of(res.json())


@pytest.fixture
def sim() -> Iterator[Proc]:
    proc = start("sim", "--objects", "20", "--namespaces", "2", "--churn", "0")
    for i in range(6):
        res = request(proc.url, "POST", CM, {**configmap(f"c{i}", "ns-0", v="0"), "metadata": {"name": f"c{i}"}})
        assert res.status == 201, res
    yield proc
    proc.stop()


def watch_events(url: str, rv: int, until_rv: int, **query: str) -> list[tuple[str, str, int]]:
    """A watch from ``rv`` read until it reaches ``until_rv`` (a BOOKMARK or event at or past it)."""
    path = path_with(CM, watch="1", resourceVersion=str(rv), allowWatchBookmarks=True, timeoutSeconds=30, **query)
    got: list[tuple[str, str, int]] = []
    with WatchStream(url, path, timeout=20) as stream:
        assert stream.status == 200
        while True:
            event = stream.next(20)
            assert event is not None, f"the watch from {rv} ended early: {got}"
            obj = event["object"]
            if event["type"] == "ERROR":
                raise AssertionError(f"watch from {rv}: {obj.get('code')} {obj.get('message')}")
            erv = int(obj["metadata"]["resourceVersion"])
            if event["type"] != "BOOKMARK":
                got.append((event["type"], obj["metadata"]["name"], erv))
            if erv >= until_rv:
                return got


def test_a_restart_storm_of_60_watches_from_old_rvs_costs_the_upstream_at_most_two_lists_and_410_only_once_compacted(
    sim: Proc, tmp_path: Path
) -> None:
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    port = free_port()
    proxy = start_proxy(sim, port, key)
    try:
        start_rv = rv_of(get_ok(proxy.url, CM, limit=1))
        writes = [(f"c{i % 6}", write(sim, f"c{i % 6}", round=str(i))) for i in range(40)]
        kill_group(proxy)  # SIGKILL: no final bookmark, nothing handed over
        proxy = start_proxy(sim, port, key)
        head = write(sim, "c0", round="after")
        writes.append(("c0", head))
        lists = metric(sim.url, "apiserver_request_total", resource="configmaps", verb="LIST")
        held = [start_rv] + [rv for _, rv in writes[:-1]]
        asked = [held[i % len(held)] for i in range(60)]
        with concurrent.futures.ThreadPoolExecutor(60) as pool:
            try:
                results = list(pool.map(lambda rv: (rv, watch_events(proxy.url, rv, head)), asked))
            except Exception as e:
                raise AssertionError("".join(proxy.log[-40:])) from e
        for rv, got in results:  # each client: exactly the updates after its rv, in order
            assert got == [("MODIFIED", name, wrv) for name, wrv in writes if wrv > rv], rv
        fetched = metric(sim.url, "apiserver_request_total", resource="configmaps", verb="LIST") - lists
        assert 1 <= fetched <= 2, f"{fetched} LISTs reached the upstream for 60 clients"
        # Per worker: the owner's fetches from the sim, a follower's from the owner.
        per_worker = [metric(proxy.url, "watchcache_backfill_fetches_total", outcome="ok", worker=w) for w in "01"]
        assert max(per_worker) >= 1 and all(n <= 2 for n in per_worker), per_worker
        # Those that came after the span was in place were served at once, without waiting.
        served = metric(proxy.url, "watchcache_backfill_requests_total", outcome="served")
        assert served >= 1 and metric(proxy.url, "watchcache_backfill_requests_total") == served
        # Once the upstream compacted, an rv older than the window gets kube's own 410 for that watch.
        assert request(sim.url, "POST", "/sim/compact").status == 200
        path = path_with(CM, watch="1", resourceVersion=str(start_rv - 3), timeoutSeconds=10)
        with WatchStream(proxy.url, path, timeout=20) as stream:
            event = stream.next(20)
        assert event is not None and event["type"] == "ERROR", event
        status = event["object"]
        assert status["code"] == 410 and status["reason"] == "Expired"
        assert re.fullmatch(rf"too old resource version: {start_rv - 3} \(\d+\)", status["message"]), status
        assert metric(proxy.url, "watchcache_backfill_fetches_total", outcome="gone") >= 1
    finally:
        kill_group(proxy)


def test_a_paged_list_and_a_selector_watch_go_on_across_a_sigterm_restart(sim: Proc, tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    port = free_port()
    proxy = start_proxy(sim, port, key)
    try:
        for i in range(6):
            write(sim, f"c{i}", team="a")
        first = get_ok(proxy.url, CM, limit=2)
        rv = rv_of(first)
        token = first["metadata"]["continue"]
        left = write(sim, "c3", team="b")  # leaves a team=a watch's selection
        proxy.process.send_signal(signal.SIGTERM)
        assert proxy.process.wait(15) == 0
        proxy = start_proxy(sim, port, key)
        # The next pages read the state at rv, from before the new process's window.
        names = [o["metadata"]["name"] for o in first["items"]]
        while token:
            page = get_ok(proxy.url, CM, limit=2, **{"continue": token})
            assert rv_of(page) == rv
            names += [o["metadata"]["name"] for o in page["items"]]
            token = page["metadata"].get("continue")
        exact = get_ok(sim.url, CM, resourceVersion=str(rv), resourceVersionMatch="Exact")
        assert names == [o["metadata"]["name"] for o in exact["items"]]
        # A team=a watch resumed from rv gets c3's exit: the span began from the state at rv.
        assert watch_events(proxy.url, rv, left, labelSelector="team=a") == [("DELETED", "c3", left)]
    finally:
        kill_group(proxy)


def test_two_tiers_restarted_backfill_through_each_other(sim: Proc, tmp_path: Path) -> None:
    """sim ← inner ← outer, both restarted: the outer's Exact LIST at an old rv makes the inner backfill."""
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    inner_port, outer_port = free_port(), free_port()
    inner = start_proxy(sim, inner_port, key, "--workers", "1")
    outer = start_proxy(inner, outer_port, key, "--workers", "1")
    try:
        start_rv = rv_of(get_ok(outer.url, CM, limit=1))
        writes = [(f"c{i % 6}", write(sim, f"c{i % 6}", tier=str(i))) for i in range(10)]
        head = writes[-1][1]
        assert watch_events(outer.url, start_rv, head) == [("MODIFIED", n, rv) for n, rv in writes]
        kill_group(outer)
        kill_group(inner)
        inner = start_proxy(sim, inner_port, key, "--workers", "1")
        outer = start_proxy(inner, outer_port, key, "--workers", "1")
        lists = metric(sim.url, "apiserver_request_total", resource="configmaps", verb="LIST")
        held = writes[3][1]
        assert watch_events(outer.url, held, head) == [("MODIFIED", n, rv) for n, rv in writes if rv > held]
        assert metric(sim.url, "apiserver_request_total", resource="configmaps", verb="LIST") - lists == 1
        assert metric(inner.url, "watchcache_backfill_fetches_total", outcome="ok") == 1
        assert metric(outer.url, "watchcache_backfill_fetches_total", outcome="ok") == 1
    finally:
        kill_group(outer)
        kill_group(inner)


def first_event(url: str, rv: int) -> dict:
    """The first event of a watch from ``rv`` (through the proxy: a 410 or 429 comes as an ERROR event)."""
    path = path_with(CM, watch="1", resourceVersion=str(rv), allowWatchBookmarks=True, timeoutSeconds=20)
    with WatchStream(url, path, timeout=30) as stream:
        assert stream.status == 200
        event = stream.next(30)
    assert event is not None, f"the watch from {rv} ended without an event"
    return event


def test_a_watch_from_before_the_window_is_told_to_retry_while_the_upstream_is_down_then_gets_its_410(
    tmp_path: Path,
) -> None:
    """The campaign's race, on purpose: the upstream dies as a client resumes from before a restarted proxy's window.

    The history the client needs may still be upstream, so it gets 429 with Retry-After (client-go's
    reflector backs off and watches again from the same rv), not 410 (it would relist). Once the
    upstream is back from its journal, whose window starts at its revision, the retry meets the
    upstream's own 410, in kube's words.
    """
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    sim_port = free_port()
    argv = python_m("watchcache", "sim", "--listen", f"127.0.0.1:{sim_port}", "--objects", "10", "--namespaces", "1")
    sim = Proc([*argv, "--churn", "0", "--state-file", str(tmp_path / "journal")], name="sim").up(30)
    port = free_port()
    # (A follower's request hears "unreachable" from its owner after the owner's three attempts, ~1.5 s:
    # a wait shorter than that would end in the proxy's own deadline, a 410, on a loaded machine.)
    proxy = start_proxy(sim, port, key, "--backfill-wait", "5")
    try:
        for i in range(3):
            assert request(sim.url, "POST", CM, configmap(f"c{i}", "ns-0", v="0")).status == 201
        held = rv_of(get_ok(proxy.url, CM, resourceVersion=str(write(sim, "c0", round="0")), limit=1))
        for i in range(5):
            write(sim, f"c{i % 3}", round=str(i + 1))
        kill_group(proxy)
        proxy = start_proxy(sim, port, key, "--backfill-wait", "5")  # its window starts after ``held``
        sim.kill()
        event = first_event(proxy.url, held)
        status = event["object"]
        assert event["type"] == "ERROR" and (status["code"], status["reason"]) == (429, "TooManyRequests"), event
        assert status["details"]["retryAfterSeconds"] == 1, status
        assert "could not fetch the history older than its cache now" in status["message"], status
        assert metric(proxy.url, "watchcache_backfill_requests_total", outcome="unreachable") >= 1
        assert metric(proxy.url, "watchcache_backfill_requests_total", outcome="failed") == 0
        sim.up(30)  # back on its port from its journal: same objects and revision, no history
        deadline = time.monotonic() + 60
        while (event := first_event(proxy.url, held))["object"]["code"] == 429:  # as a reflector: back off, retry
            assert time.monotonic() < deadline, "still 429 a minute after the upstream came back"
            time.sleep(1)
        status = event["object"]
        assert (status["code"], status["reason"]) == (410, "Expired"), event
        assert re.fullmatch(rf"too old resource version: {held} \(\d+\)", status["message"]), status
        assert metric(proxy.url, "watchcache_backfill_fetches_total", outcome="gone") >= 1
    finally:
        kill_group(proxy)
        sim.stop()
