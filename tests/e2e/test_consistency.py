"""The API contract over plain HTTP: consistent chunked lists, gapless watches, expiry,
bookmarks, error Status objects and the process lifecycle.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.processes import Proc, start
from harness.waiting import wait_until
from tests.support.httpkube import (
    WatchStream,
    configmap,
    get,
    get_ok,
    key_of,
    path_with,
    pod,
    request,
    rv_of,
)

PODS = "/api/v1/pods"


def _write(url: str, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
    res = request(url, method, path, body, content_type=content_type)
    assert res.status in (200, 201), res
    return res.json()


def create_pod(url: str, ns: str, name: str, **kw: Any) -> dict[str, Any]:
    return _write(url, "POST", f"/api/v1/namespaces/{ns}/pods", pod(name, ns, **kw))


def delete_pod(url: str, ns: str, name: str) -> dict[str, Any]:
    return _write(url, "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")


def try_delete_pod(url: str, key: str) -> bool:
    """Delete ``ns/name``; False if it is already gone (the churn deletes pods too)."""
    res = request(url, "DELETE", "/api/v1/namespaces/{}/pods/{}".format(*key.split("/")))
    assert res.status in (200, 404), res
    return res.status == 200


def label_pod(url: str, ns: str, name: str, value: str) -> dict[str, Any]:
    patch = {"metadata": {"labels": {"e2e-touched": value}}}
    return _write(url, "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}", patch, "application/merge-patch+json")


def create_cm(url: str, ns: str, name: str, **data: str) -> dict[str, Any]:
    return _write(url, "POST", f"/api/v1/namespaces/{ns}/configmaps", configmap(name, ns, **data))


def patch_cm(url: str, ns: str, name: str, **data: str) -> dict[str, Any]:
    return _write(
        url, "PATCH", f"/api/v1/namespaces/{ns}/configmaps/{name}", {"data": data}, "application/merge-patch+json"
    )


def item_versions(items: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        key = key_of(item)
        assert key not in out, f"{key} listed twice"
        out[key] = rv_of(item)
    return out


@pytest.fixture
def churning() -> Iterator[Proc]:
    proc = start("serve", "--simulated", "--sim-objects", "300", "--sim-namespaces", "3", "--sim-churn", "200")
    yield proc
    proc.stop()


# ---------------------------------------------------------------------------------------------- chunked lists


def test_chunked_list_is_one_consistent_snapshot_while_writes_happen(churning: Proc) -> None:
    url = churning.url
    pages: list[dict[str, Any]] = [get_ok(url, PODS, limit=20)]
    token = pages[0]["metadata"]["continue"]
    # The keys that exist at the list's rv: where to pick pods to delete or change "ahead" of the cursor.
    r0 = pages[0]["metadata"]["resourceVersion"]
    at_r = set(item_versions(get_ok(url, PODS, resourceVersion=r0, resourceVersionMatch="Exact")["items"]))
    created: list[str] = []
    deleted_seen: list[str] = []
    deleted_unseen: list[str] = []
    touched_unseen: dict[str, int] = {}
    for round_ in range(100):
        last_key = key_of(pages[-1]["items"][-1])
        # Writes between pages: to pods before the cursor, after it, and to another resource.
        alive = {key_of(p) for p in get_ok(url, PODS)["items"]}
        ahead = sorted(k for k in at_r & alive if k > last_key)
        behind = sorted(k for k in at_r & alive if k <= last_key)
        ns = f"ns-{round_ % 3}"
        created.append(key_of(create_pod(url, ns, f"aaa-e2e-{round_}")))
        created.append(key_of(create_pod(url, ns, f"zzz-e2e-{round_}")))
        if len(ahead) > 2:
            victim = ahead[len(ahead) // 2]
            if try_delete_pod(url, victim):  # (unless the churn deleted it first)
                deleted_unseen.append(victim)
            touched = ahead[-1]
            res = request(
                url,
                "PATCH",
                "/api/v1/namespaces/{}/pods/{}".format(*touched.split("/")),
                {"metadata": {"labels": {"e2e-touched": str(round_)}}},
                content_type="application/merge-patch+json",
            )
            assert res.status in (200, 404), res
            if res.status == 200:
                touched_unseen[touched] = rv_of(res.json())
        if behind and try_delete_pod(url, behind[0]):
            deleted_seen.append(behind[0])
        create_cm(url, ns, f"e2e-cm-{round_}", round=str(round_))

        page = get_ok(url, PODS, limit=20, **{"continue": token})
        pages.append(page)
        assert len(page["items"]) <= 20
        token = page["metadata"].get("continue")
        if not token:
            break
    else:
        pytest.fail("the chunked list never ended")
    assert len(pages) >= 10, "too few pages to mean anything"
    assert deleted_unseen and deleted_seen and touched_unseen, "the writes between pages did not happen"

    list_rvs = {p["metadata"]["resourceVersion"] for p in pages}
    assert len(list_rvs) == 1, f"pages report different list resourceVersions: {list_rvs}"
    r = int(list_rvs.pop())

    union = [item for p in pages for item in p["items"]]
    versions = item_versions(union)  # no duplicates
    keys = [key_of(item) for item in union]
    assert keys == sorted(keys), "pages are not in key order"

    exact = get_ok(url, PODS, resourceVersion=r, resourceVersionMatch="Exact")
    assert exact["metadata"]["resourceVersion"] == str(r)
    assert "continue" not in exact["metadata"]
    assert versions == item_versions(exact["items"])
    assert all(v <= r for v in versions.values())

    # The writes made between pages are invisible to the list at R...
    assert not set(created) & set(versions), "a pod created after the list's rv shows up in it"
    assert set(deleted_unseen) <= set(versions), "a pod deleted after the list's rv is missing from it"
    assert set(deleted_seen) <= set(versions)
    assert set(touched_unseen) <= set(versions)
    for key, touched_rv in touched_unseen.items():
        assert versions[key] < touched_rv, f"{key} listed at its version after the list's rv"
    assert versions.keys() == at_r
    # ...and visible to a list at the current rv.
    now = item_versions(get_ok(url, PODS)["items"])
    assert set(created) <= set(now)
    assert not (set(deleted_unseen) | set(deleted_seen)) & set(now)

    # remainingItemCount: the items still to come after each page, absent on the last one.
    total = len(union)
    seen = 0
    for p in pages[:-1]:
        seen += len(p["items"])
        assert len(p["items"]) == 20
        assert p["metadata"].get("remainingItemCount") == total - seen
    assert "remainingItemCount" not in pages[-1]["metadata"]
    assert "continue" not in pages[-1]["metadata"]


def relabel_app(url: str, key: str, app: str) -> bool:
    res = request(
        url,
        "PATCH",
        "/api/v1/namespaces/{}/pods/{}".format(*key.split("/")),
        {"metadata": {"labels": {"app": app}}},
        content_type="application/merge-patch+json",
    )
    assert res.status in (200, 404), res
    return res.status == 200


def test_chunked_list_with_label_selector_filters_the_snapshot_not_the_present(churning: Proc) -> None:
    url = churning.url
    selector = "app in (auth,catalog,e2e-moved)"
    pages = [get_ok(url, PODS, limit=5, labelSelector=selector)]
    r = int(pages[0]["metadata"]["resourceVersion"])
    at_r = {
        key_of(i): i["metadata"]["labels"]["app"]
        for i in get_ok(url, PODS, resourceVersion=r, resourceVersionMatch="Exact")["items"]
    }
    token = pages[0]["metadata"].get("continue")
    moved_out: list[str] = []  # selected at R, relabelled out of the selection before their page
    moved_in: list[str] = []  # not selected at R, relabelled into the selection before their page
    while token:
        last_key = key_of(pages[-1]["items"][-1])
        ahead = sorted(k for k in at_r if k > last_key and k not in moved_out + moved_in)
        auth = [k for k in ahead if at_r[k] == "auth"]
        frontend = [k for k in ahead if at_r[k] == "frontend"]
        if auth and relabel_app(url, auth[0], "frontend"):
            moved_out.append(auth[0])
        if frontend and relabel_app(url, frontend[-1], "e2e-moved"):
            moved_in.append(frontend[-1])
        page = get_ok(url, PODS, limit=5, labelSelector=selector, **{"continue": token})
        assert "remainingItemCount" not in page["metadata"], "remainingItemCount with a selector"
        pages.append(page)
        token = page["metadata"].get("continue")
        assert len(pages) < 200
    assert moved_out and moved_in, "no pod was relabelled between pages"
    assert {p["metadata"]["resourceVersion"] for p in pages} == {str(r)}
    union = item_versions([item for p in pages for item in p["items"]])
    exact = get_ok(url, PODS, resourceVersion=r, resourceVersionMatch="Exact", labelSelector=selector)
    assert union == item_versions(exact["items"])
    assert set(union) == {k for k, app in at_r.items() if app in ("auth", "catalog")}
    assert set(moved_out) <= set(union)
    assert not set(moved_in) & set(union)


def test_watch_from_list_rv_replays_every_change(churning: Proc) -> None:
    url = churning.url
    first = get_ok(url, PODS, limit=20)
    r = int(first["metadata"]["resourceVersion"])
    state = item_versions(get_ok(url, PODS, resourceVersion=r, resourceVersionMatch="Exact")["items"])

    # Our own writes (churn keeps writing pods in between): (type, key, rv) in commit order.
    mine: list[tuple[str, str, int]] = []
    some = sorted(state)[:3]
    for i in range(4):
        ns = f"ns-{i % 3}"
        obj = create_pod(url, ns, f"e2e-replay-{i}", node="node-3")
        mine.append(("ADDED", key_of(obj), rv_of(obj)))
        obj = label_pod(url, ns, f"e2e-replay-{i}", "x")
        mine.append(("MODIFIED", key_of(obj), rv_of(obj)))
        create_cm(url, ns, f"e2e-replay-{i}")  # another resource: must not show up in a pod watch
    with WatchStream(url, path_with(PODS, watch=1, resourceVersion=r)) as stream:
        assert stream.status == 200
        # More writes once the watch is open: replay and live events must join without a gap.
        for i in range(4):
            ns, name = f"ns-{i % 3}", f"e2e-replay-{i}"
            obj = delete_pod(url, ns, name)
            mine.append(("DELETED", key_of(obj), rv_of(obj)))
        for key in some:
            # A churned pod may be gone already; skip those (404).
            res = request(url, "DELETE", "/api/v1/namespaces/{}/pods/{}".format(*key.split("/")))
            if res.status == 200:
                mine.append(("DELETED", key, rv_of(res.json())))
            else:
                assert res.status == 404, res
        marker = create_pod(url, "ns-0", "e2e-replay-marker")
        m = rv_of(marker)
        events = stream.until(lambda e: e["object"]["metadata"].get("name") == "e2e-replay-marker", timeout=10)

    assert all(e["type"] in ("ADDED", "MODIFIED", "DELETED") for e in events), events[:3]
    assert all(e["object"]["kind"] == "Pod" for e in events)
    rvs = [rv_of(e["object"]) for e in events]
    assert rvs[0] > r
    assert all(a < b for a, b in itertools.pairwise(rvs)), "resourceVersions not strictly increasing"
    triples = [(e["type"], key_of(e["object"]), rv_of(e["object"])) for e in events]
    assert len(set(triples)) == len(triples), "duplicate events"
    ours = [t for t in triples if t in set(mine)]
    assert ours == sorted(mine, key=lambda t: t[2]), "one of our writes is missing or out of order"
    assert rvs[-1] == m

    # Replaying every event onto the state at R gives the state at the marker's rv.
    for event_type, key, rv in triples:
        if event_type == "DELETED":
            assert key in state, f"DELETED for {key} which did not exist"
            del state[key]
        else:
            assert (key in state) == (event_type == "MODIFIED"), f"{event_type} for {key}"
            state[key] = rv
    at_m = get_ok(url, PODS, resourceVersion=m, resourceVersionMatch="Exact")
    assert state == item_versions(at_m["items"])


# ---------------------------------------------------------------------------------------------- expiry


@pytest.mark.parametrize("command", ["serve", "sim"])
def test_watch_from_before_the_history_window_is_410_expired(command: str) -> None:
    flags = ["--simulated", "--sim-objects", "10"] if command == "serve" else ["--objects", "10"]
    proc = start(command, *flags, "--history-max-events", "5")
    try:
        url = proc.url
        ns, name = "default", "e2e-expiry"
        rvs = [rv_of(create_cm(url, ns, name, n="0"))]
        for i in range(1, 11):
            rvs.append(rv_of(patch_cm(url, ns, name, n=str(i))))
        path = f"/api/v1/namespaces/{ns}/configmaps"

        with WatchStream(url, path_with(path, watch=1, resourceVersion=rvs[0])) as stream:
            assert stream.status == 200
            event = stream.next()
            assert event is not None
            assert event["type"] == "ERROR", event
            status = event["object"]
            assert status["kind"] == "Status"
            assert status["apiVersion"] == "v1"
            assert status["status"] == "Failure"
            assert status["code"] == 410
            assert status["reason"] == "Expired"
            assert status["message"].startswith(f"too old resource version: {rvs[0]} ("), status
            assert stream.next() is None, "the watch goes on after its ERROR event"

        # Within the window the same watch replays what followed.
        with WatchStream(url, path_with(path, watch=1, resourceVersion=rvs[8])) as stream:
            events = [stream.next(), stream.next()]
        assert [(e["type"], rv_of(e["object"]), e["object"]["data"]) for e in events if e] == [
            ("MODIFIED", rvs[9], {"n": "9"}),
            ("MODIFIED", rvs[10], {"n": "10"}),
        ]

        # A list at an exact rv before the window is 410 too.
        res = get(url, path, resourceVersion=rvs[0], resourceVersionMatch="Exact")
        assert res.status == 410, res
        assert (res.json()["reason"], res.json()["code"]) == ("Expired", 410)
    finally:
        proc.stop()


def test_expired_continue_token_is_410_with_an_inconsistent_continue_token() -> None:
    proc = start("serve", "--simulated", "--sim-objects", "6", "--sim-namespaces", "3", "--history-max-events", "5")
    try:
        url = proc.url
        path = "/api/v1/configmaps"
        first = get_ok(url, path, limit=1)
        assert [key_of(i) for i in first["items"]] == ["ns-0/app-config"]
        for i in range(8):  # more configmap writes than the window keeps: the list's rv leaves it
            create_cm(url, "default", f"e2e-expire-{i}")

        res = get(url, path, limit=1, **{"continue": first["metadata"]["continue"]})
        assert res.status == 410, res
        status = res.json()
        assert (status["kind"], status["reason"], status["code"]) == ("Status", "Expired", 410)
        assert "use the continue token in this response" in status["message"]
        # The message promises a token; kube-apiserver puts one in the Status (continuing at the latest rv).
        token = status["metadata"].get("continue")
        assert token, "410 for an expired continue token carries no metadata.continue"
        rest = get_ok(url, path, **{"continue": token})
        assert [key_of(i) for i in rest["items"]] == ["ns-1/app-config", "ns-2/app-config"]
    finally:
        proc.stop()


# ---------------------------------------------------------------------------------------------- bookmarks


@pytest.fixture
def bookmarking() -> Iterator[Proc]:
    proc = start("serve", "--simulated", "--sim-objects", "30", "--sim-namespaces", "3", "--bookmark-interval", "0.5")
    yield proc
    proc.stop()


def test_periodic_bookmark(bookmarking: Proc) -> None:
    url = bookmarking.url
    path = "/api/v1/namespaces/ns-0/configmaps"
    r = int(get_ok(url, path)["metadata"]["resourceVersion"])
    with WatchStream(url, path_with(path, watch=1, resourceVersion=r, allowWatchBookmarks=True)) as stream:
        # A write this watch does not select moves the rv; a bookmark tells the watcher so.
        elsewhere = rv_of(create_cm(url, "ns-1", "e2e-elsewhere"))
        events = stream.until(lambda e: e["type"] == "BOOKMARK", timeout=3.5)
    assert len(events) == 1, events
    bookmark = events[0]["object"]
    assert set(bookmark) == {"kind", "apiVersion", "metadata"}, bookmark
    assert (bookmark["kind"], bookmark["apiVersion"]) == ("ConfigMap", "v1")
    assert set(bookmark["metadata"]) == {"resourceVersion"}
    assert int(bookmark["metadata"]["resourceVersion"]) >= elsewhere


def test_no_bookmarks_unless_asked(bookmarking: Proc) -> None:
    url = bookmarking.url
    path = "/api/v1/namespaces/ns-0/configmaps"
    r = int(get_ok(url, path)["metadata"]["resourceVersion"])
    with WatchStream(url, path_with(path, watch=1, resourceVersion=r, timeoutSeconds=1)) as stream:
        create_cm(url, "ns-1", "e2e-elsewhere")
        ours = create_cm(url, "ns-0", "e2e-here")
        events = []
        while (event := stream.next(4)) is not None:
            events.append(event)
    assert [(e["type"], rv_of(e["object"])) for e in events] == [("ADDED", rv_of(ours))]


def test_streaming_list_sends_state_then_initial_events_end_bookmark(bookmarking: Proc) -> None:
    url = bookmarking.url
    path = "/api/v1/namespaces/ns-1/pods"
    listed = get_ok(url, path)
    expected = item_versions(listed["items"])
    assert expected
    query = path_with(
        path, watch=1, sendInitialEvents=True, resourceVersionMatch="NotOlderThan", allowWatchBookmarks=True
    )
    with WatchStream(url, query) as stream:
        assert stream.status == 200
        events = stream.until(lambda e: e["type"] == "BOOKMARK", timeout=3)
        # After the initial-events-end bookmark the watch goes on live.
        created = create_pod(url, "ns-1", "e2e-after-initial")
        live = stream.until(lambda e: e["type"] != "BOOKMARK", timeout=3)
    initial, bookmark = events[:-1], events[-1]
    assert all(e["type"] == "ADDED" for e in initial), [e["type"] for e in initial]
    assert all(e["object"]["kind"] == "Pod" for e in initial)
    assert item_versions([e["object"] for e in initial]) == expected
    meta = bookmark["object"]["metadata"]
    assert meta["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert set(meta) == {"resourceVersion", "annotations"}, meta
    assert int(meta["resourceVersion"]) >= int(listed["metadata"]["resourceVersion"])
    # the rest is a Pod's zero values, as kube's bookmark (cache/zeros.py)
    assert bookmark["object"] == {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": {"containers": None},
                                  "status": {}}  # fmt: skip
    assert [(e["type"], key_of(e["object"])) for e in live[-1:]] == [("ADDED", key_of(created))]
    assert rv_of(live[-1]["object"]) == rv_of(created)


# ---------------------------------------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def quick_timeout() -> Iterator[Proc]:
    """Read-only requests only: shared by the error tests of this module (per xdist worker)."""
    proc = start("serve", "--simulated", "--sim-objects", "10", "--fresh-wait", "0.5")
    yield proc
    proc.stop()


ERRORS = [
    pytest.param(PODS, {"labelSelector": "app in (a"}, 400, "BadRequest", None, id="bad-label-selector"),
    pytest.param(PODS, {"labelSelector": "a===b"}, 400, "BadRequest", None, id="bad-label-operator"),
    pytest.param(
        PODS,
        {"fieldSelector": "spec.containers=x"},
        400,
        "BadRequest",
        "field label not supported: spec.containers",
        id="unsupported-field",
    ),
    pytest.param(PODS, {"resourceVersionMatch": "Exact"}, 422, "Invalid", None, id="match-without-rv"),
    pytest.param(PODS, {"continue": "garbage"}, 400, "BadRequest", None, id="garbage-continue"),
    pytest.param(PODS, {"limit": "ten"}, 400, "BadRequest", None, id="non-numeric-limit"),
    pytest.param("/api/v1/foos", {}, 404, "NotFound", None, id="unknown-resource"),
    pytest.param("/api/v1/namespaces/ns-0/foos", {}, 404, "NotFound", None, id="unknown-namespaced-resource"),
    pytest.param(
        "/api/v1/namespaces/default/pods/nope", {}, 404, "NotFound", 'pods "nope" not found', id="missing-object"
    ),
]


@pytest.mark.parametrize(("path", "query", "code", "reason", "message"), ERRORS)
def test_errors_are_status_objects(
    quick_timeout: Proc, path: str, query: dict[str, str], code: int, reason: str, message: str | None
) -> None:
    res = get(quick_timeout.url, path, **query)
    assert res.status == code, res
    assert res.headers.get_content_type() == "application/json"
    status = res.json()
    assert status["kind"] == "Status"
    assert status["apiVersion"] == "v1"
    assert status["status"] == "Failure"
    assert status["code"] == code
    assert status["reason"] == reason
    assert status["message"]
    if message is not None:
        assert status["message"] == message


def test_future_resource_version_is_504_with_retry_after(quick_timeout: Proc) -> None:
    url = quick_timeout.url
    current = int(get_ok(url, PODS)["metadata"]["resourceVersion"])
    for path in (PODS, "/api/v1/namespaces/ns-0/pods"):
        started = time.monotonic()
        res = get(url, path, resourceVersion=current + 1000)
        waited = time.monotonic() - started
        assert res.status == 504, res
        status = res.json()
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 504, "Timeout")
        assert status["message"].startswith(f"Timeout: Too large resource version: {current + 1000}")
        assert int(res.headers["Retry-After"]) >= 1
        assert 0.4 <= waited < 3, f"waited {waited:.2f}s with --fresh-wait 0.5"


# ---------------------------------------------------------------------------------------------- lifecycle


def test_health_endpoints(quick_timeout: Proc) -> None:
    for path in ("/readyz", "/healthz", "/livez"):
        res = get(quick_timeout.url, path)
        assert (res.status, res.body) == (200, b"ok"), (path, res)
    verbose = get(quick_timeout.url, "/readyz", verbose="")
    assert verbose.status == 200
    assert b"[+]cache-synced:pods" in verbose.body
    assert verbose.body.rstrip().endswith(b"readyz check passed")


@pytest.mark.parametrize("command", ["serve", "sim"])
def test_sigterm_ends_open_watches_and_exits_zero(command: str) -> None:
    flags = ["--simulated", "--sim-objects", "10"] if command == "serve" else ["--objects", "10"]
    proc = start(command, *flags)
    try:
        path = "/api/v1/namespaces/default/configmaps"
        r = get_ok(proc.url, path)["metadata"]["resourceVersion"]
        with WatchStream(proc.url, path_with(path, watch=1, resourceVersion=r)) as stream:
            created = create_cm(proc.url, "default", "e2e-before-term")
            event = stream.next()
            assert event is not None and event["type"] == "ADDED"
            assert rv_of(event["object"]) == rv_of(created)

            started = time.monotonic()
            proc.process.send_signal(signal.SIGTERM)
            assert stream.next(5) is None, "the watch stream did not end cleanly"
            rc = proc.process.wait(5)
            elapsed = time.monotonic() - started
        assert rc == 0, "".join(proc.log)
        assert elapsed < 5
    finally:
        if proc.process.poll() is None:
            proc.process.kill()
            proc.process.wait()


def test_sigterm_lets_an_in_flight_read_finish() -> None:
    proc = start("serve", "--simulated", "--sim-objects", "10", "--fresh-wait", "2")
    try:
        current = int(get_ok(proc.url, PODS)["metadata"]["resourceVersion"])
        outcome: dict[str, Any] = {}

        def read() -> None:
            try:
                outcome["response"] = get(proc.url, PODS, resourceVersion=current + 100)
            except Exception as e:
                outcome["error"] = e

        reader = threading.Thread(target=read)
        reader.start()
        # The server has the LIST, waiting for a resourceVersion that will not come.
        wait_until(lambda: get_ok(proc.url, "/debug/cache")["inflight"] == 1)
        proc.process.send_signal(signal.SIGTERM)
        assert proc.process.wait(5) == 0
        reader.join(5)
        assert "error" not in outcome, f"the in-flight LIST got no response: {outcome.get('error')!r}"
        res = outcome["response"]
        assert res.json()["kind"] == "Status", res
        assert res.status in (429, 503, 504), res
    finally:
        if proc.process.poll() is None:
            proc.process.kill()
            proc.process.wait()
