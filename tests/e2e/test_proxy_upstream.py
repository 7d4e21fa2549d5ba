"""The proxy and its upstream: one upstream watch per resource, pass-through, 429 before sync, the upstream
killed and restarted, compaction and relists that client watches live through.

The upstream is a real ``watchcache sim`` process; where a test needs it on a known port (to start it
late, or to restart it where the proxy expects it) it is launched here with ``--listen 127.0.0.1:PORT``.
"""

from __future__ import annotations

import http.client
import itertools
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.processes import Proc, Stack, free_port, logged, python_m, start, start_stack, wait_logged, wait_ready
from tests.support.httpkube import (
    WatchStream,
    cm_path,
    configmap,
    get,
    get_ok,
    key_of,
    path_with,
    pipelined,
    pod,
    request,
    rv_of,
    summarize,
    write,
)

PODS = "/api/v1/pods"
CONFIGMAPS = "/api/v1/configmaps"


# ---------------------------------------------------------------------------------------------- processes


def start_sim_on(port: int, *args: str, timeout: float = 30.0) -> Proc:
    """``watchcache sim ARGS`` on a given port (``start`` always picks port 0)."""
    return Proc(python_m("watchcache", "sim", *args, "--listen", f"127.0.0.1:{port}"), name="sim").up(timeout)


def stop_all(*procs: Proc | None) -> None:
    """Stop every process (proxies first, as given), even if one of them fails to stop."""
    errors = []
    for proc in procs:
        if proc is None:
            continue
        try:
            proc.stop()
        except Exception as e:
            errors.append(e)
    if errors:
        raise errors[0]


def debug_cache(url: str) -> dict[str, Any]:
    return get_ok(url, "/debug/cache")


def versions(items: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        key = key_of(item)
        assert key not in out, f"{key} listed twice"
        out[key] = rv_of(item)
    return out


def merge_patch(url: str, path: str, patch: dict[str, Any]) -> Any:
    return write(url, "PATCH", path, patch, "application/merge-patch+json")


def checked(stream: WatchStream, into: list[dict[str, Any]]) -> Callable[[float], dict[str, Any]]:
    """A reader that appends each event to ``into`` and fails on an ERROR event or the end of the stream."""

    def read(timeout: float) -> dict[str, Any]:
        event = stream.next(timeout)
        assert event is not None, f"the client watch ended; got {summarize(into)}"
        assert event["type"] != "ERROR", f"the client watch got {event['object']}; before it: {summarize(into)}"
        into.append(event)
        return event

    return read


@pytest.fixture(scope="module")
def small_stack() -> Iterator[Stack]:
    """Shared by the pass-through tests (they write only objects of their own)."""
    stack = start_stack("--resources", "pods,configmaps", sim_args=("--objects", "30", "--namespaces", "3"))
    try:
        yield stack
        assert stack.proxy.process.poll() is None, "the proxy died:\n" + "".join(stack.proxy.log[-40:])
    finally:
        stop_all(stack.proxy, stack.sim)


# ---------------------------------------------------------------------------------------------- fan-in


def wait_for_reflector_watches(sim: str, resources: tuple[str, ...], timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        stats = debug_cache(sim)["resources"]
        if all(stats[r]["watchers"] >= 1 for r in resources) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_one_upstream_watch_per_resource_however_many_client_watches() -> None:
    # No churn, and upstream bookmarks far apart: nothing but our writes moves any rv.
    stack = start_stack(
        "--resources",
        "pods,configmaps",
        sim_args=("--objects", "40", "--namespaces", "3", "--bookmark-interval", "300"),
    )
    streams: list[tuple[WatchStream, bool, str]] = []
    try:
        proxy, sim = stack.proxy.url, stack.sim.url
        before = wait_for_reflector_watches(sim, ("pods", "configmaps"))
        assert (before["pods"]["watchers"], before["configmaps"]["watchers"]) == (1, 1), before
        r = get_ok(proxy, PODS)["metadata"]["resourceVersion"]

        pod_selectors = [{}, {"labelSelector": "app=e2e-fanout"}, {"fieldSelector": "spec.nodeName=node-0"}]
        scopes = [None, "ns-0", "ns-1", "ns-2"]
        starts: list[dict[str, Any]] = [{}, {"resourceVersion": "0"}, {"resourceVersion": r}]
        for i in range(50):
            resource = "pods" if i % 2 == 0 else "configmaps"
            ns = scopes[(i // 2) % len(scopes)]
            query: dict[str, Any] = {**starts[i % len(starts)], "allowWatchBookmarks": i % 4 == 0 or None}
            if resource == "pods":
                query.update(pod_selectors[(i // 3) % len(pod_selectors)])
            path = f"/api/v1/namespaces/{ns}/{resource}" if ns else f"/api/v1/{resource}"
            stream = WatchStream(proxy, path_with(path, watch=1, **query))
            streams.append((stream, ns in (None, "ns-0"), resource))
            assert stream.status == 200, f"watch {i} ({path} {query}): {stream.status}"

        created_pod = write(
            sim, "POST", "/api/v1/namespaces/ns-0/pods", pod("e2e-fanout", "ns-0", labels={"app": "e2e-fanout"})
        )
        created_cm = write(sim, "POST", cm_path("ns-0"), configmap("e2e-fanout", "ns-0"))
        for stream, selected, resource in streams:
            if not selected:
                continue
            want = rv_of(created_pod if resource == "pods" else created_cm)
            events = stream.until(
                lambda e: e["type"] == "ADDED" and e["object"]["metadata"]["name"] == "e2e-fanout", timeout=10
            )
            assert rv_of(events[-1]["object"]) == want

        after = debug_cache(sim)["resources"]
        for resource in ("pods", "configmaps"):
            assert after[resource]["watchers"] == 1, f"{resource}: {after[resource]['watchers']} upstream watches"
            assert after[resource]["watch_requests"] == before[resource]["watch_requests"], (
                f"{resource}: the client watches made the proxy watch the upstream again: {before} -> {after}"
            )
    finally:
        for stream, _, _ in streams:
            stream.close()
        stop_all(stack.proxy, stack.sim)


# ---------------------------------------------------------------------------------------------- pass-through


def test_writes_pass_through_with_the_upstreams_status_codes(small_stack: Stack) -> None:
    proxy, sim = small_stack.proxy.url, small_stack.sim.url
    path = cm_path("ns-1", "e2e-pass")

    res = request(proxy, "POST", cm_path("ns-1"), configmap("e2e-pass", "ns-1", k="v1"))
    assert res.status == 201, res
    created = res.json()
    assert get_ok(sim, path) == created, "the create did not land on the upstream as answered"

    res = request(proxy, "POST", cm_path("ns-1"), configmap("e2e-pass", "ns-1", k="again"))
    assert (res.status, res.json()["reason"]) == (409, "AlreadyExists"), res

    replacement = {**created, "data": {"k": "v2"}}
    res = request(proxy, "PUT", path, replacement)
    assert res.status == 200, res
    updated = res.json()
    assert get_ok(sim, path)["data"] == {"k": "v2"}
    assert rv_of(updated) > rv_of(created)

    res = request(proxy, "PUT", path, {**created, "data": {"k": "stale"}})  # the old resourceVersion
    assert (res.status, res.json()["reason"]) == (409, "Conflict"), res
    assert get_ok(sim, path)["data"] == {"k": "v2"}

    res = request(proxy, "PATCH", path, {"data": {"extra": "x"}}, content_type="application/merge-patch+json")
    assert res.status == 200, res
    assert get_ok(sim, path)["data"] == {"k": "v2", "extra": "x"}
    assert res.json() == get_ok(sim, path)

    res = request(proxy, "DELETE", path)
    assert res.status == 200, res
    assert get(sim, path).status == 404

    for method, body, ctype in (
        ("DELETE", None, "application/json"),
        ("PATCH", {"data": {}}, "application/merge-patch+json"),
        ("PUT", replacement, "application/json"),
    ):
        res = request(proxy, method, path, body, content_type=ctype)
        assert (res.status, res.json()["reason"]) == (404, "NotFound"), (method, res)
        assert res.json() == request(sim, method, path, body, content_type=ctype).json()

    res = request(proxy, "POST", cm_path("no-such-ns"), configmap("x", "no-such-ns"))
    assert (res.status, res.json()["reason"]) == (404, "NotFound"), res


def raw_write(url: str, method: str, path: str, body: bytes) -> tuple[int, Any]:
    """A write with a JSON body and *no* Content-Type header (kube-apiserver then reads it as JSON)."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Accept": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_a_write_without_content_type_passes_through_as_sent(small_stack: Stack) -> None:
    """kube-apiserver reads a body without Content-Type as JSON; the proxy must not label it otherwise."""
    proxy, sim = small_stack.proxy.url, small_stack.sim.url
    body = json.dumps({"metadata": {"name": "e2e-no-ctype"}, "data": {"k": "v"}}).encode()
    assert raw_write(sim, "POST", cm_path("ns-2"), body)[0] == 201  # the upstream takes it as JSON
    write(sim, "DELETE", cm_path("ns-2", "e2e-no-ctype"))
    status, answer = raw_write(proxy, "POST", cm_path("ns-2"), body)
    assert status == 201, answer
    status, answer = raw_write(proxy, "PUT", cm_path("ns-2", "e2e-no-ctype"), body)
    assert status == 200, answer
    assert get_ok(sim, cm_path("ns-2", "e2e-no-ctype"))["data"] == {"k": "v"}


@pytest.mark.parametrize("path", ["/api", "/apis", "/version", "/api/v1", "/apis/apps/v1", "/apis/nope.example.com/v1"])
def test_discovery_is_the_upstreams(small_stack: Stack, path: str) -> None:
    through = get(small_stack.proxy.url, path)
    direct = get(small_stack.sim.url, path)
    assert through.status == direct.status, (through, direct)
    assert through.json() == direct.json()
    assert through.headers.get_content_type() == direct.headers.get_content_type()


@pytest.mark.parametrize(
    "path",
    [
        "//api/v1/namespaces/ns-0/configmaps?limit=1",
        "/api/v1/namespaces/ns-0//configmaps",
        "/api//v1/namespaces/ns-0/configmaps/app-config?resourceVersion=0",
        "/api/v1/namespaces/ns-0/./configmaps",
        "/api/v1/namespaces/ns-0/configmaps/..",
        "/api/v1/namespaces/ns-0/configmaps/a%2Fb",
        "/api/v1/namespaces/ns-0/configmaps/app-config%00",
        "/api/v1/namespaces/ns-0/configmaps/app-config%FF",
    ],
)
def test_a_path_kube_routes_otherwise_gets_the_upstreams_answer(small_stack: Stack, path: str) -> None:
    # The cache would have answered 200 (or 400) for each: the sim's own answer (404) comes back.
    through, direct = get(small_stack.proxy.url, path), get(small_stack.sim.url, path)
    assert (through.status, through.json()) == (direct.status, direct.json()) and direct.status == 404, through
    assert through.headers.get_content_type() == direct.headers.get_content_type()


def test_a_query_pair_go_drops_is_served_as_without_it(small_stack: Stack) -> None:
    # Go's ParseQuery drops a pair with a bad escape or a ';': kube lists without that selector or limit.
    proxy, path = small_stack.proxy.url, cm_path("ns-1")
    everything = get_ok(proxy, path, resourceVersion=0)["items"]
    assert everything
    for query in ("labelSelector=%zz", "labelSelector=x%3Dy;z", "limit=1;labelSelector=x"):
        answer = get(proxy, f"{path}?resourceVersion=0&{query}")
        assert answer.status == 200, (query, answer)
        assert answer.json()["items"] == everything, query


def test_an_uncached_resource_is_passed_through_and_counted() -> None:
    # One process: each worker of several keeps its own /debug/cache counts.
    sim_args = ("--objects", "20", "--namespaces", "2")
    stack = start_stack("--resources", "pods", "--no-cache-on-demand", "--workers", "1", sim_args=sim_args)
    try:
        proxy, sim = stack.proxy.url, stack.sim.url
        before = debug_cache(proxy)
        assert "configmaps" not in before["resources"], before
        assert set(before["resources"]) == {"pods"}

        listed = get_ok(proxy, CONFIGMAPS)
        assert listed == get_ok(sim, CONFIGMAPS)
        assert get_ok(proxy, cm_path("ns-0", "app-config")) == get_ok(sim, cm_path("ns-0", "app-config"))
        # A watch passes through too, streamed.
        query = path_with(cm_path("ns-1"), watch=1, resourceVersion=listed["metadata"]["resourceVersion"])
        with WatchStream(proxy, query) as stream:
            created = write(sim, "POST", cm_path("ns-1"), configmap("e2e-uncached", "ns-1"))
            event = stream.next()
        assert event is not None and event["type"] == "ADDED", event
        assert event["object"] == created

        counts = debug_cache(proxy)["passed_through"]
        previous = before["passed_through"].get("uncached-resource", 0)
        assert counts.get("uncached-resource", 0) - previous == 3, counts
    finally:
        stop_all(stack.proxy, stack.sim)


# ---------------------------------------------------------------------------------------------- readiness


def test_reads_get_429_until_the_upstream_is_reachable_and_synced() -> None:
    port = free_port()
    proxy = start("serve", "--upstream", f"http://127.0.0.1:{port}", "--resources", "pods,configmaps")
    sim: Proc | None = None
    try:
        # Concurrently: a worker that only follows a resource may hold a read up to 5 s before its 429.
        queries = [{}, {"watch": 1}, {"watch": 1, "resourceVersion": "0"}, {"resourceVersion": "0"}]
        with ThreadPoolExecutor(len(queries)) as pool:
            answers = list(pool.map(lambda q: request(proxy.url, "GET", path_with(PODS, **q), timeout=15), queries))
        for query, res in zip(queries, answers, strict=True):
            assert res.status == 429, (query, res)
            status = res.json()
            assert (status["kind"], status["code"], status["reason"]) == ("Status", 429, "TooManyRequests"), status
            assert int(res.headers["Retry-After"]) >= 1, res.headers
        ready = get(proxy.url, "/readyz")
        assert ready.status != 200, ready
        # Pass-through has nowhere to go yet: a Status, not a hang or a dropped connection.
        res = get(proxy.url, "/version")
        assert res.status == 503 and res.json()["kind"] == "Status", res

        sim = start_sim_on(port, "--objects", "15", "--namespaces", "2")
        wait_ready(proxy, timeout=30)
        listed = get_ok(proxy.url, PODS)
        expected = get_ok(sim.url, PODS)
        assert len(listed["items"]) == 15
        assert versions(listed["items"]) == versions(expected["items"])
        r = listed["metadata"]["resourceVersion"]
        with WatchStream(proxy.url, path_with(PODS, watch=1, resourceVersion=r)) as stream:
            assert stream.status == 200
            created = write(sim.url, "POST", "/api/v1/namespaces/ns-0/pods", pod("e2e-late", "ns-0"))
            event = stream.next()
        assert event is not None and (event["type"], rv_of(event["object"])) == ("ADDED", rv_of(created))
    finally:
        stop_all(proxy, sim)


def test_readyz_once_synced_with_fewer_cached_resources_than_workers() -> None:
    """A worker that owns no cached resource must not hold the group's readiness back."""
    sim = start("sim", "--objects", "10")
    proxy: Proc | None = None
    try:
        proxy = start("serve", "--upstream", sim.url, "--resources", "pods", "--workers", "2")
        deadline = time.monotonic() + 15
        while get(proxy.url, PODS, resourceVersion="0").status != 200:  # synced: the cache answers
            assert time.monotonic() < deadline, "the pods cache never synced"
            time.sleep(0.05)
        while not all(get(proxy.url, "/readyz").status == 200 for _ in range(4)):
            assert time.monotonic() < deadline, get(proxy.url, "/readyz", verbose="").body.decode()
            time.sleep(0.1)
    finally:
        stop_all(proxy, sim)


# ---------------------------------------------------------------------------------------------- restart


def journal_records(path: Path, resource: str) -> list[tuple[int, str, str]]:
    """(rv, event type, key) of every commit of ``resource`` in a sim state file, in commit order."""
    out = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record["r"] == resource:
            out.append((record["rv"], record["t"], key_of(record["o"])))
    return out


def state_at(records: list[tuple[int, str, str]], rv: int, initial: dict[str, int] | None = None) -> dict[str, int]:
    state = dict(initial or {})
    for record_rv, kind, key in records:
        if record_rv > rv:
            break
        if kind == "DELETED":
            state.pop(key)
        else:
            state[key] = record_rv
    return state


def replay(state: dict[str, int], events: list[dict[str, Any]]) -> dict[str, int]:
    state = dict(state)
    for e in events:
        if e["type"] == "DELETED":
            state.pop(key_of(e["object"]), None)
        elif e["type"] in ("ADDED", "MODIFIED"):
            state[key_of(e["object"])] = rv_of(e["object"])
    return state


def as_records(events: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    return [(rv_of(e["object"]), e["type"], key_of(e["object"])) for e in events if e["type"] != "BOOKMARK"]


def assert_increasing(events: list[dict[str, Any]], above: int, what: str) -> None:
    rvs = [rv_of(e["object"]) for e in events if e["type"] != "BOOKMARK"]
    assert all(a < b for a, b in itertools.pairwise([above, *rvs])), f"{what}: rvs not increasing: {rvs}"


def assert_bookmarks_keep_their_promise(events: list[dict[str, Any]]) -> None:
    """A BOOKMARK at B: every event before it is at or below B, every event after it above B."""
    for i, e in enumerate(events):
        if e["type"] != "BOOKMARK":
            continue
        b = rv_of(e["object"])
        earlier = [rv_of(x["object"]) for x in events[:i] if x["type"] != "BOOKMARK"]
        later = [rv_of(x["object"]) for x in events[i + 1 :] if x["type"] != "BOOKMARK"]
        assert all(rv <= b for rv in earlier), f"BOOKMARK {b} after an event above it: {summarize(events)}"
        assert all(rv > b for rv in later), f"an event at or below an earlier BOOKMARK {b}: {summarize(events)}"


def test_upstream_killed_and_restarted_client_watch_goes_on_without_loss(tmp_path: Path) -> None:
    state_file = tmp_path / "state.jsonl"
    port = free_port()
    sim_args = ("--objects", "30", "--namespaces", "2", "--churn", "50", "--state-file", str(state_file))
    sim: Proc | None = start_sim_on(port, *sim_args)
    proxy: Proc | None = None
    try:
        proxy = start(
            "serve",
            "--upstream",
            f"http://127.0.0.1:{port}",
            "--resources",
            "pods,configmaps",
            "--bookmark-interval",
            "0.5",
        )
        wait_ready(proxy)
        listed = get_ok(proxy.url, PODS)
        start_rv = int(listed["metadata"]["resourceVersion"])
        initial = versions(listed["items"])
        events: list[dict[str, Any]] = []
        query = path_with(PODS, watch=1, resourceVersion=start_rv, allowWatchBookmarks=True)
        with WatchStream(proxy.url, query) as stream:
            read = checked(stream, events)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                read(5)

            assert sim is not None
            sim.process.kill()
            sim.process.wait()
            killed = time.monotonic()
            # While the upstream is away the proxy's cache stands still at C, and the client gets BOOKMARKs at C
            # (--bookmark-interval 0.5). The first one certainly made after the kill marks the line.
            while True:
                event = read(5)
                if event["type"] == "BOOKMARK" and time.monotonic() - killed > 1.1:
                    break
            down = len(events)
            c = rv_of(events[-1]["object"])

            sim = start_sim_on(port, *sim_args)  # the same state file: same objects, same rv, churning on
            deadline = time.monotonic() + 15
            while not any(e["type"] != "BOOKMARK" and rv_of(e["object"]) > c for e in events[down:]):
                assert time.monotonic() < deadline, f"no event after the restart: {summarize(events[down:])}"
                read(5)
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                read(5)
        last = max(rv_of(e["object"]) for e in events)
        # The proxy stopped before its log is read: whether it relisted is in the log by then, whenever
        # it did (a relist's line is written after its changes were handed to the client's watch).
        stop_all(sim, proxy)
        relisted = logged(proxy, "relisted pods")
        sim = None

        records = [r for r in journal_records(state_file, "pods") if r[0] > start_rv]
        assert state_at(journal_records(state_file, "pods"), start_rv) == initial, "the initial list is not the state"
        before, after = events[:down], events[down:]
        assert all(rv_of(e["object"]) <= c for e in before)
        assert_increasing(before, start_rv, "before the kill")
        assert as_records(before) == [r for r in records if r[0] <= c], "events lost or invented before the kill"
        assert_bookmarks_keep_their_promise(events)
        assert len(set(as_records(events))) == len(as_records(events)), "an event delivered twice"

        if relisted:
            # The proxy relisted (410 on resume): the client got the difference, then a BOOKMARK at the relist rv R.
            marks = [i for i, e in enumerate(after) if e["type"] == "BOOKMARK" and rv_of(e["object"]) > c]
            assert marks, f"relisted, but no BOOKMARK past {c}: {summarize(after)}"
            r = rv_of(after[marks[0]]["object"])
            diff, live = after[: marks[0]], after[marks[0] + 1 :]
            assert all(c < rv_of(e["object"]) <= r for e in diff if e["type"] != "BOOKMARK"), summarize(diff)
            assert replay(initial, [*before, *diff]) == state_at(records, r, initial), "wrong state after the relist"
            assert_increasing(live, r, "after the relist")
            assert as_records(live) == [x for x in records if r < x[0] <= last], "events lost after the relist"
        else:
            assert_increasing(after, c, "after the restart")
            assert as_records(after) == [x for x in records if c < x[0] <= last], "events lost across the restart"
        assert replay(initial, events) == state_at(records, last, initial), "the client's state is not the upstream's"
    finally:
        stop_all(proxy, sim)


# ---------------------------------------------------------------------------------------------- relists


def test_relist_after_upstream_compaction_keeps_client_watches_open() -> None:
    # Upstream bookmarks far apart (one could bring the reflector's rv level with the upstream's and spare it
    # the relist); the proxy's own every second, so the client learns when it has every change.
    stack = start_stack(
        "--resources",
        "pods,configmaps",
        "--bookmark-interval",
        "1",
        sim_args=("--objects", "20", "--namespaces", "2", "--bookmark-interval", "300"),
    )
    try:
        proxy, sim = stack.proxy.url, stack.sim.url
        listed = get_ok(proxy, CONFIGMAPS)
        events: list[dict[str, Any]] = []
        query = path_with(
            CONFIGMAPS, watch=1, resourceVersion=listed["metadata"]["resourceVersion"], allowWatchBookmarks=True
        )
        with WatchStream(proxy, query) as stream:
            read = checked(stream, events)
            for name in ("e2e-keep", "e2e-del", "e2e-mod"):
                write(sim, "POST", cm_path("ns-0"), configmap(name, "ns-0", v="0"))
            while not (events and events[-1]["object"]["metadata"].get("name") == "e2e-mod"):
                read(5)
            # The last write before the compaction is to a pod: the proxy's configmaps rv now trails the upstream's,
            # so its reflector's resume after the compaction is answered 410 and it must relist.
            write(sim, "POST", "/api/v1/namespaces/ns-0/pods", pod("e2e-compact", "ns-0"))
            answers = pipelined(
                sim,
                [
                    ("POST", "/sim/compact", None, "application/json"),
                    ("POST", cm_path("ns-0"), configmap("e2e-new", "ns-0", v="1"), "application/json"),
                    ("DELETE", cm_path("ns-0", "e2e-del"), None, "application/json"),
                    ("PATCH", cm_path("ns-0", "e2e-mod"), {"data": {"v": "2"}}, "application/merge-patch+json"),
                ],
            )
            assert [status for status, _ in answers] == [200, 201, 200, 200], answers
            new, deleted, modified = (body for _, body in answers[1:])
            newest = max(rv_of(new), rv_of(deleted), rv_of(modified))
            mark = len(events)
            while not (events[-1]["type"] == "BOOKMARK" and rv_of(events[-1]["object"]) >= newest):
                read(10)
            changes = events[mark:-1]
            # The watch goes on, live.
            after = write(sim, "POST", cm_path("ns-1"), configmap("e2e-after", "ns-1"))
            while events[-1]["type"] == "BOOKMARK":
                read(5)
            assert (events[-1]["type"], rv_of(events[-1]["object"])) == ("ADDED", rv_of(after))

        # The relist's changes reached the client, so its log line was written; the pipe's reader
        # thread may not have read it yet.
        wait_logged(stack.proxy, lambda line: "relisted configmaps" in line)  # else the test proved nothing
        by_name = {e["object"]["metadata"]["name"]: e for e in changes if e["type"] != "BOOKMARK"}
        assert set(by_name) == {"e2e-new", "e2e-del", "e2e-mod"}, summarize(changes)
        assert (by_name["e2e-new"]["type"], by_name["e2e-new"]["object"]) == ("ADDED", new)
        assert (by_name["e2e-mod"]["type"], by_name["e2e-mod"]["object"]) == ("MODIFIED", modified)
        assert by_name["e2e-del"]["type"] == "DELETED"
        assert rv_of(by_name["e2e-del"]["object"]) >= rv_of(deleted)
        assert_bookmarks_keep_their_promise(events)

        through = get_ok(proxy, CONFIGMAPS)
        direct = get_ok(sim, CONFIGMAPS)
        assert versions(through["items"]) == versions(direct["items"])
        assert through["items"] == direct["items"]
    finally:
        stop_all(stack.proxy, stack.sim)


@dataclass
class RelistScenario:
    """What client watches saw when changes happened upstream while the proxy could not watch."""

    events: list[dict[str, Any]]  # the first client: from the first change after the outage to a live event
    created: dict[str, Any]
    modified: dict[str, Any]
    deleted: list[dict[str, Any]]
    live: dict[str, Any]
    # What other clients got first (None: nothing, the watch stayed open) on a watch ...
    after_first_deleted: dict[str, Any] | None  # ... resumed from the rv of the diff's first DELETED
    after_first_deleted_elsewhere: dict[str, Any] | None  # ... the same, on a worker that follows only from now
    at_bookmark: dict[str, Any] | None  # ... resumed from the rv of the relist BOOKMARK
    after_list: dict[str, tuple[int, dict[str, Any] | None]]  # ... started at the rv a LIST returned
    proxy_list: dict[str, Any]
    sim_list: dict[str, Any]
    proxy_log: list[str]


def shards(conn: http.client.HTTPConnection) -> dict[str, Any]:
    conn.request("GET", "/debug/shards", headers={"Accept": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status == 200, (resp.status, body)
    return dict(json.loads(body))


def pinned(url: str, want: Callable[[dict[str, Any]], bool], attempts: int = 60) -> http.client.HTTPConnection:
    """A keep-alive connection that landed on a worker ``want`` accepts (its /debug/shards says which)."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    for _ in range(attempts):
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        if want(shards(conn)):
            return conn
        conn.close()
    raise AssertionError(f"no connection landed on the wanted worker in {attempts} attempts")


class PinnedWatch(WatchStream):
    """A watch on a connection already open (to a chosen worker)."""

    def __init__(self, conn: http.client.HTTPConnection, path: str) -> None:
        self.conn = conn
        assert conn.sock is not None
        self.sock = conn.sock
        conn.request("GET", path, headers={"Accept": "application/json"})
        self.resp = conn.getresponse()
        self.status = self.resp.status


def pinned_get(conn: http.client.HTTPConnection, path: str) -> Any:
    conn.request("GET", path, headers={"Accept": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status == 200, (resp.status, body)
    return json.loads(body)


def first_events(
    streams: dict[str, WatchStream], write_next: Callable[[], dict[str, Any]]
) -> tuple[dict[str, dict[str, Any] | None], dict[str, Any]]:
    """The first event of each freshly opened watch, of what it had to deliver before anything new was
    written (None: nothing). Each has its response head, so the server has registered it (or answered
    it) and decided what it delivers first; then ``write_next`` commits something new, which every
    watch gets after whatever came before it. Returns those first events and what ``write_next`` wrote."""
    try:
        assert all(s.status == 200 for s in streams.values()), {n: s.status for n, s in streams.items()}
        marker = write_next()
        out: dict[str, dict[str, Any] | None] = {}
        for name, stream in streams.items():
            event = stream.next(10.0)
            is_marker = event is not None and event["type"] != "ERROR" and event["object"] == marker
            out[name] = None if is_marker else event
        return out, marker
    finally:
        for stream in streams.values():
            stream.close()


@pytest.fixture(scope="module")
def relist_scenario(tmp_path_factory: pytest.TempPathFactory) -> RelistScenario:
    """Changes the proxy can only learn by relisting, made deterministic.

    The sim is killed; a second sim on another port, on the same state file, makes four changes (as
    another apiserver of the same etcd would) and stops; the sim then comes back where the proxy expects
    it, with no history before its restart. The proxy's resume gets 410, it relists, and client watches
    get the difference. ``zzz-new`` is created *before* ``aaa`` is modified, so the diff in key order
    would go back in resourceVersion; two configmaps are deleted. Before anything else is written,
    other clients resume or start watches at the rvs the proxy has handed out.

    Two workers; every configmaps request before the relist goes to the worker that owns configmaps
    (connections are pinned by asking /debug/shards on them), so the other worker starts following
    configmaps only when a client resumes there after the relist.
    """
    state_file = tmp_path_factory.mktemp("relist") / "state.jsonl"
    port = free_port()
    sim: Proc | None = start_sim_on(port, "--objects", "10", "--namespaces", "2", "--state-file", str(state_file))
    proxy: Proc | None = None
    try:
        assert sim is not None
        for name in ("aaa", "mmm", "nnn"):
            write(sim.url, "POST", cm_path("ns-0"), configmap(name, "ns-0", v="0"))
        proxy = start("serve", "--upstream", sim.url, "--resources", "configmaps,pods", "--workers", "2")
        wait_ready(proxy)
        url = proxy.url
        owner = pinned(url, lambda _: True)
        owner_id = shards(owner)["owners"]["configmaps"]
        owner.close()

        def on_owner(info: dict[str, Any]) -> bool:
            return bool(info["worker"] == owner_id)

        listed = pinned_get(pinned(url, on_owner), CONFIGMAPS)
        assert {"ns-0/aaa", "ns-0/mmm", "ns-0/nnn"} <= set(versions(listed["items"]))
        query = path_with(
            CONFIGMAPS, watch=1, resourceVersion=listed["metadata"]["resourceVersion"], allowWatchBookmarks=True
        )
        events: list[dict[str, Any]] = []
        first_part: list[dict[str, Any]] = []
        with PinnedWatch(pinned(url, on_owner), query) as stream:
            read = checked(stream, events)
            with PinnedWatch(pinned(url, on_owner), query) as cut:
                read_cut = checked(cut, first_part)
                sim.process.kill()
                sim.process.wait()
                other = start_sim_on(free_port(), "--state-file", str(state_file))
                try:
                    created = write(other.url, "POST", cm_path("ns-0"), configmap("zzz-new", "ns-0", v="1"))
                    modified = merge_patch(other.url, cm_path("ns-0", "aaa"), {"data": {"v": "2"}})
                    deleted = [write(other.url, "DELETE", cm_path("ns-0", name)) for name in ("mmm", "nnn")]
                finally:
                    stop_all(other)
                sim = start_sim_on(port, "--state-file", str(state_file))
                newest = rv_of(deleted[-1])
                while not (events and events[-1]["type"] == "BOOKMARK" and rv_of(events[-1]["object"]) >= newest):
                    read(15)
                # The second client handles events up to the first DELETED, then its connection breaks.
                while read_cut(15)["type"] != "DELETED":
                    pass

            # Nothing has been written since the relist: every rv below is the relist's own.
            cut_at = path_with(CONFIGMAPS, watch=1, resourceVersion=rv_of(first_part[-1]["object"]))
            streams: dict[str, WatchStream] = {
                "after_first_deleted": PinnedWatch(pinned(url, on_owner), cut_at),
                "after_first_deleted_elsewhere": PinnedWatch(
                    pinned(url, lambda i: i["worker"] != owner_id and "configmaps" not in i["following"]), cut_at
                ),
                "at_bookmark": PinnedWatch(
                    pinned(url, on_owner),
                    path_with(
                        CONFIGMAPS, watch=1, resourceVersion=rv_of(events[-1]["object"]), allowWatchBookmarks=True
                    ),
                ),
            }
            list_rvs = {}
            for name, q in (("most recent", {}), ("rv=0", {"resourceVersion": "0"})):
                conn = pinned(url, on_owner)
                list_rvs[name] = int(pinned_get(conn, path_with(CONFIGMAPS, **q))["metadata"]["resourceVersion"])
                streams[name] = PinnedWatch(conn, path_with(CONFIGMAPS, watch=1, resourceVersion=list_rvs[name]))
            first, live = first_events(
                streams, lambda: write(sim.url, "POST", cm_path("ns-1"), configmap("e2e-live", "ns-1"))
            )
            while events[-1]["type"] == "BOOKMARK" or rv_of(events[-1]["object"]) < rv_of(live):
                read(5)
        return RelistScenario(
            events=events,
            created=created,
            modified=modified,
            deleted=deleted,
            live=live,
            after_first_deleted=first["after_first_deleted"],
            after_first_deleted_elsewhere=first["after_first_deleted_elsewhere"],
            at_bookmark=first["at_bookmark"],
            after_list={name: (rv, first[name]) for name, rv in list_rvs.items()},
            proxy_list=get_ok(url, CONFIGMAPS),
            sim_list=get_ok(sim.url, CONFIGMAPS),
            proxy_log=list(proxy.log),
        )
    finally:
        stop_all(proxy, sim)


def test_changes_made_while_the_proxy_was_cut_off_reach_client_watches_as_a_relist_diff(
    relist_scenario: RelistScenario,
) -> None:
    s = relist_scenario
    assert any("relisted configmaps" in line for line in s.proxy_log), "no relist: the scenario proved nothing"
    events = s.events
    assert events[-1]["type"] == "ADDED", summarize(events)
    live = events[-1]
    marks = [i for i, e in enumerate(events) if e["type"] == "BOOKMARK"]
    assert marks, summarize(events)
    bookmark = events[marks[-1]]
    diff = [e for e in events[: marks[-1]] if e["type"] != "BOOKMARK"]
    newest = rv_of(s.deleted[-1])
    assert rv_of(bookmark["object"]) == newest, "the relist BOOKMARK is not at the upstream's rv"
    assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in diff) == [
        ("ADDED", "zzz-new"),
        ("DELETED", "mmm"),
        ("DELETED", "nnn"),
        ("MODIFIED", "aaa"),
    ], summarize(events)
    objects = {e["object"]["metadata"]["name"]: e["object"] for e in diff}
    assert objects["zzz-new"] == s.created
    assert objects["aaa"] == s.modified
    for gone in s.deleted:
        name = gone["metadata"]["name"]
        assert objects[name]["metadata"]["uid"] == gone["metadata"]["uid"]
        assert rv_of(gone) <= rv_of(objects[name]) <= newest
    assert (live["object"], rv_of(live["object"])) == (s.live, rv_of(s.live))
    assert_bookmarks_keep_their_promise(events)
    assert s.proxy_list["items"] == s.sim_list["items"]


def test_relist_diff_events_never_go_back_in_resource_version(relist_scenario: RelistScenario) -> None:
    rvs = [rv_of(e["object"]) for e in relist_scenario.events]
    assert rvs == sorted(rvs), f"resourceVersion goes backwards on the watch: {summarize(relist_scenario.events)}"


def assert_resume_misses_nothing(s: RelistScenario, event: dict[str, Any] | None) -> None:
    first = next(e for e in s.events if e["type"] == "DELETED")["object"]["metadata"]["name"]
    if event is not None and event["type"] == "ERROR":  # 410: the client relists and learns everything
        assert event["object"]["code"] == 410, event
        return
    others = {d["metadata"]["name"] for d in s.deleted} - {first}
    assert event is not None and event["type"] == "DELETED", (
        f"resumed after DELETED {first}: got {event} (neither the DELETED of {others} nor a 410)"
    )
    assert event["object"]["metadata"]["name"] in others


def test_a_client_resuming_from_a_relist_diff_event_misses_no_change(relist_scenario: RelistScenario) -> None:
    """The diff's DELETEDs share the relist rv: a client that got only the first must not resume silently."""
    assert_resume_misses_nothing(relist_scenario, relist_scenario.after_first_deleted)


def test_a_client_resuming_on_another_worker_from_a_relist_diff_event_misses_no_change(
    relist_scenario: RelistScenario,
) -> None:
    assert_resume_misses_nothing(relist_scenario, relist_scenario.after_first_deleted_elsewhere)


def test_after_a_relist_watches_from_the_listed_or_bookmarked_rv_are_served(relist_scenario: RelistScenario) -> None:
    s = relist_scenario
    problems = {}
    if s.at_bookmark is not None and s.at_bookmark["type"] == "ERROR":
        problems["resumed at the relist BOOKMARK"] = s.at_bookmark["object"]["message"]
    for name, (rv, event) in s.after_list.items():
        if event is not None and event["type"] == "ERROR":
            problems[f"watch from the rv {rv} of a {name} LIST"] = event["object"]["message"]
    assert not problems, problems
