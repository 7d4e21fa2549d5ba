"""Reads through the caching proxy (``watchcache serve --upstream``) in front of a churning ``watchcache sim``.

Every answer the proxy gives from its cache is checked against the upstream itself: a list at
resourceVersion R through the proxy must equal the sim's own ``resourceVersionMatch=Exact`` list at R,
and a watch through the proxy must carry exactly the events the sim's own watch carries.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from harness.processes import Stack, start_stack
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
    summarize,
)

PODS = "/api/v1/pods"
CONFIGMAPS = "/api/v1/configmaps"


@pytest.fixture(scope="module")
def churning() -> Iterator[Stack]:
    """Proxy caching pods and configmaps in front of a sim writing 100 pod changes a second.

    The sim's periodic bookmarks are far apart (kube-apiserver's are about a minute): a quiet resource's
    cache moves only with its own events and the proxy's consistent-read proofs.
    """
    stack = start_stack(
        "--resources",
        "pods,configmaps",
        sim_args=("--objects", "60", "--namespaces", "3", "--churn", "100", "--bookmark-interval", "300"),
    )
    try:
        yield stack
        assert stack.proxy.process.poll() is None, "the proxy died:\n" + "".join(stack.proxy.log[-40:])
    finally:
        try:
            stack.proxy.stop()
        finally:
            stack.sim.stop()


def versions(items: list[dict[str, Any]]) -> dict[str, int]:
    """key -> resourceVersion, failing on a key listed twice."""
    out: dict[str, int] = {}
    for item in items:
        key = key_of(item)
        assert key not in out, f"{key} listed twice"
        out[key] = rv_of(item)
    return out


def sim_exact(stack: Stack, path: str, rv: int | str) -> dict[str, int]:
    """The upstream's own state at exactly ``rv``."""
    listed = get_ok(stack.sim.url, path, resourceVersion=str(rv), resourceVersionMatch="Exact")
    assert listed["metadata"]["resourceVersion"] == str(rv)
    return versions(listed["items"])


def write(url: str, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
    res = request(url, method, path, body, content_type=content_type)
    assert res.status in (200, 201), res
    return res.json()


def create_pod(url: str, ns: str, name: str) -> dict[str, Any]:
    return write(url, "POST", f"/api/v1/namespaces/{ns}/pods", pod(name, ns))


def label_pod(url: str, ns: str, name: str, value: str) -> dict[str, Any]:
    patch = {"metadata": {"labels": {"e2e-touched": value}}}
    return write(url, "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}", patch, "application/merge-patch+json")


def delete_pod(url: str, ns: str, name: str) -> dict[str, Any]:
    return write(url, "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")


# ---------------------------------------------------------------------------------------------- list table cells


@pytest.mark.parametrize("path", [PODS, "/api/v1/namespaces/ns-1/pods"])
def test_list_rv0_any_is_an_exact_state_of_the_upstream(churning: Stack, path: str) -> None:
    listed = get_ok(churning.proxy.url, path, resourceVersion="0")
    assert (listed["kind"], listed["apiVersion"]) == ("PodList", "v1")
    r = int(listed["metadata"]["resourceVersion"])
    got = versions(listed["items"])
    assert got, "empty list"
    assert got == sim_exact(churning, path, r), f"the proxy's rv=0 list is not the upstream's state at its rv {r}"


def test_list_and_get_not_older_than_include_a_write_just_made(churning: Stack) -> None:
    proxy = churning.proxy.url
    created = create_pod(proxy, "ns-2", "e2e-not-older-than")
    w = rv_of(created)
    for query in ({"resourceVersionMatch": "NotOlderThan"}, {}):  # the legacy form (no match, no limit) too
        listed = get_ok(proxy, PODS, resourceVersion=str(w), **query)
        r = int(listed["metadata"]["resourceVersion"])
        assert r >= w, f"NotOlderThan {w} answered with an older list at {r}"
        got = versions(listed["items"])
        assert got.get(key_of(created)) == w, "the write the rv came from is missing"
        assert got == sim_exact(churning, PODS, r)
    fetched = get_ok(proxy, "/api/v1/namespaces/ns-2/pods/e2e-not-older-than", resourceVersion=str(w))
    assert rv_of(fetched) == w
    assert fetched["kind"] == "Pod"


def test_list_exact_returns_the_past_after_later_writes(churning: Stack) -> None:
    proxy = churning.proxy.url
    victim = create_pod(proxy, "ns-0", "e2e-exact-victim")
    touched = create_pod(proxy, "ns-0", "e2e-exact-touched")
    n = int(get_ok(proxy, PODS)["metadata"]["resourceVersion"])
    at_n = sim_exact(churning, PODS, n)
    assert {key_of(victim), key_of(touched)} <= set(at_n)

    delete_pod(proxy, "ns-0", "e2e-exact-victim")
    touched_later = rv_of(label_pod(proxy, "ns-0", "e2e-exact-touched", "later"))
    born_later = create_pod(proxy, "ns-0", "e2e-exact-born-later")

    for query in (
        {"resourceVersionMatch": "Exact"},
        {"resourceVersionMatch": "Exact", "limit": "1000"},
        {"limit": 1000},
    ):
        listed = get_ok(proxy, PODS, resourceVersion=str(n), **query)
        assert listed["metadata"]["resourceVersion"] == str(n), query
        got = versions(listed["items"])
        assert got == at_n, f"Exact list at {n} ({query}) is not the upstream's state at {n}"
        assert got[key_of(touched)] == rv_of(touched) < touched_later
        assert key_of(victim) in got
        assert key_of(born_later) not in got
    now = versions(get_ok(proxy, PODS)["items"])
    assert key_of(victim) not in now
    assert now[key_of(touched)] == touched_later


def test_paged_list_is_one_snapshot_while_writes_happen_between_pages(churning: Stack) -> None:
    proxy = churning.proxy.url
    first = get_ok(proxy, PODS, limit=10)
    pages = [first]
    r = int(first["metadata"]["resourceVersion"])
    at_r = sim_exact(churning, PODS, r)
    token = first["metadata"]["continue"]
    created: list[str] = []
    deleted_ahead: list[str] = []
    for round_ in range(50):
        ns = f"ns-{round_ % 3}"
        # Writes through the proxy between pages: creates at both ends of the key space, a delete ahead of the cursor.
        created.append(key_of(create_pod(proxy, ns, f"aaa-e2e-page-{round_}")))
        created.append(key_of(create_pod(proxy, ns, f"zzz-e2e-page-{round_}")))
        cursor = key_of(pages[-1]["items"][-1])
        ahead = sorted(k for k in at_r if k > cursor and k not in deleted_ahead)
        if len(ahead) > 3 and len(deleted_ahead) < 3:
            ns_, name = ahead[len(ahead) // 2].split("/")
            if request(proxy, "DELETE", f"/api/v1/namespaces/{ns_}/pods/{name}").status == 200:
                deleted_ahead.append(f"{ns_}/{name}")
        page = get_ok(proxy, PODS, limit=10, **{"continue": token})
        pages.append(page)
        assert len(page["items"]) <= 10
        token = page["metadata"].get("continue")
        if not token:
            break
    else:
        pytest.fail("the paged list never ended")
    assert len(pages) >= 5, "too few pages to mean anything"
    assert deleted_ahead, "no delete happened ahead of the cursor"
    assert {p["metadata"]["resourceVersion"] for p in pages} == {str(r)}, "pages report different list rvs"
    union = [item for p in pages for item in p["items"]]
    keys = [key_of(i) for i in union]
    assert keys == sorted(keys), "pages are not in key order"
    assert versions(union) == at_r, "the pages' union is not the upstream's state at the list's rv"
    assert not set(created) & set(keys)
    assert set(deleted_ahead) <= set(keys)


def test_not_older_than_the_upstreams_own_list_rv_on_a_quiet_resource(churning: Stack) -> None:
    """An rv of the same resource from the upstream itself (what a client holds after a list the proxy passed
    through, or one another replica served): the proxy must prove it has caught up, not wait for a bookmark
    that comes once a minute and answer 504."""
    n = int(get_ok(churning.sim.url, CONFIGMAPS)["metadata"]["resourceVersion"])
    res = get(churning.proxy.url, CONFIGMAPS, resourceVersion=str(n), resourceVersionMatch="NotOlderThan")
    assert res.status == 200, res
    r = int(res.json()["metadata"]["resourceVersion"])
    assert r >= n
    assert versions(res.json()["items"]) == sim_exact(churning, CONFIGMAPS, r)


INVALID_LISTS = [
    pytest.param({"resourceVersionMatch": "Exact"}, id="exact-without-rv"),
    pytest.param({"resourceVersionMatch": "Exact", "limit": "5"}, id="exact-paged-without-rv"),
    pytest.param({"resourceVersionMatch": "Exact", "resourceVersion": "0"}, id="exact-rv0"),
    pytest.param({"resourceVersionMatch": "NotOlderThan"}, id="not-older-than-without-rv"),
    pytest.param({"resourceVersionMatch": "Newest", "resourceVersion": "5"}, id="unknown-match"),
]


@pytest.mark.parametrize("query", INVALID_LISTS)
def test_invalid_list_cells_are_422(churning: Stack, query: dict[str, str]) -> None:
    for path in (PODS, "/api/v1/namespaces/ns-0/configmaps"):
        res = get(churning.proxy.url, path, **query)
        assert res.status == 422, res
        status = res.json()
        assert (status["kind"], status["apiVersion"], status["status"]) == ("Status", "v1", "Failure")
        assert (status["code"], status["reason"]) == (422, "Invalid")
        assert status["details"]["causes"], status
        upstream = get(churning.sim.url, path, **query)
        assert (upstream.status, upstream.json()["reason"]) == (422, "Invalid")


def test_continue_with_a_resource_version(churning: Stack) -> None:
    proxy = churning.proxy.url
    first = get_ok(proxy, PODS, limit=5)
    token = first["metadata"]["continue"]
    rv = first["metadata"]["resourceVersion"]
    res = get(proxy, PODS, limit=5, resourceVersion=rv, **{"continue": token})
    assert res.status == 400, res
    assert (res.json()["kind"], res.json()["reason"]) == ("Status", "BadRequest")
    res = get(proxy, PODS, limit=5, resourceVersion=rv, resourceVersionMatch="Exact", **{"continue": token})
    assert res.status == 422, res
    # resourceVersion="0" with a continue token: "Invalid, treated as Continue Token, Exact".
    second = get_ok(proxy, PODS, limit=5, resourceVersion="0", **{"continue": token})
    assert second["metadata"]["resourceVersion"] == rv
    assert key_of(second["items"][0]) > key_of(first["items"][-1])


def test_the_next_page_of_a_list_the_upstream_answered_is_the_upstreams(churning: Stack) -> None:
    """A consistent chunked LIST the proxy could not prove fresh passed through: the client then
    brings the upstream's continue token to the proxy, which must pass that page through too."""
    first = get_ok(churning.sim.url, PODS, limit=5)  # the upstream's own first page (and token)
    token = first["metadata"]["continue"]
    expected = get_ok(churning.sim.url, PODS, limit=5, **{"continue": token})
    second = get_ok(churning.proxy.url, PODS, limit=5, **{"continue": token})
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert [key_of(i) for i in second["items"]] == [key_of(i) for i in expected["items"]]
    # A token that is not even well-formed is still the proxy's to refuse.
    assert get(churning.proxy.url, PODS, limit=5, **{"continue": "garbage"}).status == 400


# ---------------------------------------------------------------------------------------------- most recent


def test_most_recent_get_and_list_read_your_own_writes(churning: Stack) -> None:
    """A quiet resource (configmaps) while pods churn: the cache's rv lags the upstream's all the time.

    Twenty rounds, ten clients at a time (consistent reads arriving together share the proxy's proofs):
    each creates a configmap through the proxy and at once reads it back, GET and LIST; every fourth
    also patches it and deletes it, reading back after each.
    """
    proxy = churning.proxy.url

    # A consistent read may wait for a proof (up to --fresh-wait, 3 s) and then pass through: a roomy timeout.
    def get_one(ns: str, name: str) -> Any:
        return request(proxy, "GET", f"/api/v1/namespaces/{ns}/configmaps/{name}", timeout=15)

    def list_ns(ns: str) -> dict[str, int]:
        res = request(proxy, "GET", f"/api/v1/namespaces/{ns}/configmaps", timeout=15)
        assert res.status == 200, res
        return versions(res.json()["items"])

    def round_trip(i: int) -> None:
        ns, name = f"ns-{i % 3}", f"e2e-ryw-{i}"
        path = f"/api/v1/namespaces/{ns}/configmaps/{name}"
        w = rv_of(write(proxy, "POST", f"/api/v1/namespaces/{ns}/configmaps", configmap(name, ns, i=str(i))))
        res = get_one(ns, name)
        assert res.status == 200, f"round {i}: GET right after the create: {res}"
        assert (rv_of(res.json()), res.json()["data"]) == (w, {"i": str(i)})
        assert list_ns(ns).get(f"{ns}/{name}") == w, f"round {i}: LIST right after the create misses it"
        if i % 4:
            return
        patched = write(proxy, "PATCH", path, {"data": {"i": "patched"}}, "application/merge-patch+json")
        res = get_one(ns, name)
        assert res.status == 200, res
        assert (rv_of(res.json()), res.json()["data"]) == (rv_of(patched), {"i": "patched"}), f"round {i}: old data"
        write(proxy, "DELETE", path)
        assert get_one(ns, name).status == 404, f"round {i}: GET right after the delete still finds it"
        assert f"{ns}/{name}" not in list_ns(ns), f"round {i}: LIST right after the delete still has it"

    with ThreadPoolExecutor(10) as pool:
        for done in [pool.submit(round_trip, i) for i in range(20)]:
            done.result()


def test_get_of_a_missing_object_is_a_404_status(churning: Stack) -> None:
    path = "/api/v1/namespaces/ns-0/pods/e2e-does-not-exist"
    expected = get(churning.sim.url, path)
    assert expected.status == 404
    for query in ({}, {"resourceVersion": "0"}):
        res = get(churning.proxy.url, path, **query)
        assert res.status == 404, (query, res)
        assert res.headers.get_content_type() == "application/json"
        status = res.json()
        assert status == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'pods "e2e-does-not-exist" not found',
            "reason": "NotFound",
            "details": {"name": "e2e-does-not-exist", "kind": "pods"},
            "code": 404,
        }, status
        assert status == expected.json()


# ---------------------------------------------------------------------------------------------- watch


def read_until_rv(stream: WatchStream, rv: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    events = stream.until(lambda e: e["type"] != "BOOKMARK" and rv_of(e["object"]) >= rv, timeout=timeout)
    return [e for e in events if rv_of(e["object"]) <= rv]


def test_watch_from_a_list_rv_carries_exactly_the_upstreams_events(churning: Stack) -> None:
    proxy, sim = churning.proxy.url, churning.sim.url
    listed = get_ok(proxy, PODS)
    r = listed["metadata"]["resourceVersion"]
    query = path_with(PODS, watch=1, resourceVersion=r)
    with WatchStream(proxy, query) as through_proxy, WatchStream(sim, query) as direct:
        assert (through_proxy.status, direct.status) == (200, 200)
        first = through_proxy.next()  # a churn write first, so the comparison is not only of our own writes
        assert first is not None and first["type"] != "ERROR", first
        ours = [
            create_pod(proxy, "ns-1", "e2e-watched"),
            label_pod(proxy, "ns-1", "e2e-watched", "one"),
            label_pod(proxy, "ns-1", "e2e-watched", "two"),
            delete_pod(proxy, "ns-1", "e2e-watched"),
        ]
        last = rv_of(ours[-1])
        seen = [first, *read_until_rv(through_proxy, last)]
        expected = read_until_rv(direct, last)

    rvs = [rv_of(e["object"]) for e in seen]
    assert rvs[0] > int(r)
    assert all(a < b for a, b in itertools.pairwise(rvs)), f"rvs not increasing: {summarize(seen)}"
    assert rvs[-1] == last
    assert len({(key_of(e["object"]), rv_of(e["object"])) for e in seen}) == len(seen), "duplicate events"
    assert [e["type"] for e in seen if key_of(e["object"]) == "ns-1/e2e-watched"] == [
        "ADDED",
        "MODIFIED",
        "MODIFIED",
        "DELETED",
    ]
    assert [rv_of(e["object"]) for e in seen if key_of(e["object"]) == "ns-1/e2e-watched"] == [rv_of(o) for o in ours]
    assert len(seen) > len(ours), "the churn wrote nothing meanwhile: the comparison means little"
    # Event for event (type and whole object), the proxy's stream is the upstream's.
    assert seen == expected, f"proxy {summarize(seen)} != upstream {summarize(expected)}"
