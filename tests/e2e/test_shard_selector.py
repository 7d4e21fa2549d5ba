"""shardSelector (KEP-5866) through a real proxy process in front of a churning sim, over HTTP.

The proxy answers from its cache whatever the upstream supports: N shards' paged LISTs at one
resourceVersion are disjoint and together the full LIST at that rv, while pods churn; a sharded
watch gets its shard's initial events and then only its shard's changes; a bad selector is kube's
500. The sim is the proxy's upstream only: every answer checked here is the proxy's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from harness.processes import Stack, start_stack
from tests.support.httpkube import (
    WatchStream,
    cm_path,
    configmap,
    get,
    get_ok,
    key_of,
    path_with,
    write,
)
from watchcache.selectors.shards import HASH_SPACE, fnv1a_64

PODS = "/api/v1/pods"
NS = "shard-e2e"


def hex16(value: int) -> str:
    return "0x10000000000000000" if value == HASH_SPACE else f"0x{value:016x}"


def shards(n: int, field: str = "uid") -> list[tuple[str, int, int]]:
    """(selector, lo, hi) of N equal shards of the hash space."""
    bounds = [i * HASH_SPACE // n for i in range(n + 1)]
    return [
        (f"shardRange(object.metadata.{field}, '{hex16(lo)}', '{hex16(hi)}')", lo, hi)
        for lo, hi in itertools.pairwise(bounds)
    ]


@pytest.fixture(scope="module")
def churning() -> Iterator[Stack]:
    # Two workers: each owns some kinds and follows the others' (a follower's copy of an object
    # has no recorded uid: its hash reads it from the body).
    stack = start_stack(
        "--workers",
        "2",
        "--resources",
        "pods,configmaps",
        sim_args=("--objects", "90", "--namespaces", "3", "--churn", "60"),
    )
    try:
        yield stack
        assert stack.proxy.process.poll() is None, "the proxy died:\n" + "".join(stack.proxy.log[-40:])
    finally:
        try:
            stack.proxy.stop()
        finally:
            stack.sim.stop()


def paged(
    url: str, path: str, limit: int, selector: str, **first: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every page of a sharded LIST, as client-go pages (the selector on every page, the rv on the
    first only): (items, each page's metadata)."""
    items: list[dict[str, Any]] = []
    metas: list[dict[str, Any]] = []
    cont = None
    while True:
        query = {"continue": cont} if cont else first
        body = get_ok(url, path, limit=limit, shardSelector=selector, **query)
        items.extend(body["items"])
        metas.append(body["metadata"])
        cont = body["metadata"].get("continue")
        if not cont:
            return items, metas


def reads_passed_through(url: str) -> float:
    """Reads the proxy forwarded to the upstream, over every worker (writes are forwarded by design)."""
    lines = get(url, "/metrics").body.decode().splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("watchcache_passthrough_requests_total{") and 'reason="write"' not in line
    )


@pytest.mark.parametrize(("n", "limit"), [(2, 7), (3, 0), (4, 25)])
def test_n_shards_partition_the_list_at_one_rv_while_pods_churn(churning: Stack, n: int, limit: int) -> None:
    url = churning.proxy.url
    rv = get_ok(url, PODS, limit=1)["metadata"]["resourceVersion"]  # a consistent read: may pass through
    passed = reads_passed_through(url)
    exact = {"resourceVersion": rv, "resourceVersionMatch": "Exact"}
    full = [key_of(o) for o in get_ok(url, PODS, **exact)["items"]]
    assert len(full) >= 30
    union: list[str] = []
    for selector, lo, hi in shards(n):
        if limit:
            items, metas = paged(url, PODS, limit, selector, **exact)
        else:
            body = get_ok(url, PODS, shardSelector=selector, **exact)
            items, metas = body["items"], [body["metadata"]]
        assert all(m["resourceVersion"] == rv for m in metas)
        assert all(m["shardInfo"] == {"selector": selector} for m in metas)
        assert all(lo <= fnv1a_64(o["metadata"]["uid"]) < hi for o in items)
        union.extend(key_of(o) for o in items)
    assert sorted(union) == sorted(full) and len(set(union)) == len(union)
    assert reads_passed_through(url) == passed, "answered by the upstream, not the cache"


def test_namespace_shards_and_a_namespaced_list(churning: Stack) -> None:
    url = churning.proxy.url
    rv = get_ok(url, PODS, limit=1)["metadata"]["resourceVersion"]
    exact = {"resourceVersion": rv, "resourceVersionMatch": "Exact"}
    full = get_ok(url, PODS, **exact)["items"]
    by_shard = [get_ok(url, PODS, shardSelector=s, **exact)["items"] for s, _, _ in shards(2, "namespace")]
    assert sorted(key_of(o) for part in by_shard for o in part) == sorted(key_of(o) for o in full)
    for part in by_shard:  # a namespace is never split
        namespaces = {o["metadata"]["namespace"] for o in part}
        assert all(
            o["metadata"]["namespace"] not in namespaces for other in by_shard if other is not part for o in other
        )
    ns = full[0]["metadata"]["namespace"]
    in_ns = [key_of(o) for o in get_ok(url, f"/api/v1/namespaces/{ns}/pods", **exact)["items"]]
    halves = [get_ok(url, f"/api/v1/namespaces/{ns}/pods", shardSelector=s, **exact)["items"] for s, _, _ in shards(2)]
    assert sorted(key_of(o) for h in halves for o in h) == sorted(in_ns)


def test_remaining_item_count_is_kubes_unfiltered_rest(churning: Stack) -> None:
    url = churning.proxy.url
    rv = get_ok(url, PODS, limit=1)["metadata"]["resourceVersion"]
    exact = {"resourceVersion": rv, "resourceVersionMatch": "Exact"}
    total = len(get_ok(url, PODS, **exact)["items"])
    body = get_ok(url, PODS, limit=2, shardSelector=shards(2)[0][0], **exact)
    assert body["metadata"]["remainingItemCount"] == total - 2


def test_a_sharded_watch_sees_its_shard_only(churning: Stack) -> None:
    url = churning.proxy.url
    write(url, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    (low, _, mid), (high, _, _) = shards(2)
    streams = [
        WatchStream(
            url,
            path_with(
                cm_path(NS),
                watch=True,
                shardSelector=s,
                sendInitialEvents=True,
                resourceVersionMatch="NotOlderThan",
                allowWatchBookmarks=True,
            ),
        )
        for s in (low, high)
    ]
    try:
        for w in streams:
            assert w.status == 200
            w.until(lambda e: e["type"] == "BOOKMARK")  # no ConfigMaps yet in NS: no initial ADDED
        created: list[dict[str, Any]] = []
        # Until both halves have some (12 uids in one half: 1 in 2048; 64 rule it out).
        while len(created) < 12 or len({fnv1a_64(o["metadata"]["uid"]) < mid for o in created}) < 2:
            assert len(created) < 64
            created.append(write(url, "POST", cm_path(NS), configmap(f"c{len(created)}", NS, k="v")))
        names = [o["metadata"]["name"] for o in created]
        for name in names:
            write(url, "DELETE", cm_path(NS, name))
        in_low = [o["metadata"]["name"] for o in created if fnv1a_64(o["metadata"]["uid"]) < mid]
        in_high = [n for n in names if n not in in_low]
        for w, expected in zip(streams, (in_low, in_high), strict=True):
            # Deletes went in creation order: the shard's last one ends its events.
            events = w.until(
                lambda e, end=expected[-1]: e["type"] == "DELETED" and e["object"]["metadata"]["name"] == end
            )
            seen = [(e["type"], e["object"]["metadata"]["name"]) for e in events if e["type"] != "BOOKMARK"]
            assert seen == [("ADDED", n) for n in expected] + [("DELETED", n) for n in expected]
    finally:
        for w in streams:
            w.close()
    # A new watch's initial events are its shard of what is there now.
    created = [write(url, "POST", cm_path(NS), configmap(f"d{i}", NS)) for i in range(6)]
    with WatchStream(
        url, path_with(cm_path(NS), watch=True, shardSelector=low, resourceVersion=0, timeoutSeconds=2)
    ) as w:
        got = [e for e in iter(w.next, None) if e["type"] == "ADDED"]
    assert {e["object"]["metadata"]["name"] for e in got} == {
        o["metadata"]["name"] for o in created if fnv1a_64(o["metadata"]["uid"]) < mid
    }


def test_bad_selectors_are_kubes_500_for_lists_and_watches(churning: Stack) -> None:
    url = churning.proxy.url
    for watch in (None, True):
        res = get(url, PODS, shardSelector="shardRange(object.metadata.uid, '0x0', '0x8000000000000000')", watch=watch)
        assert res.status == 500, res
        body = res.json()
        assert body["kind"] == "Status" and "reason" not in body and body["code"] == 500
        assert body["message"] == (
            'invalid shard selector: hexStart must be a 0x-prefixed 16-digit hex value, got "0x0" '
            '(did you mean "0x0000000000000000"?)'
        )
    # An empty parameter is no parameter, as kube.
    assert "shardInfo" not in get_ok(url, PODS, shardSelector="", limit=1)["metadata"]


def test_tables_and_metadata_lists_carry_no_shard_info(churning: Stack) -> None:
    url = churning.proxy.url
    selector = shards(2)[0][0]
    q = path_with(PODS, shardSelector=selector, resourceVersion=0)
    for accept, kind in (
        ("application/json;as=Table;v=v1;g=meta.k8s.io", "Table"),
        ("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io", "PartialObjectMetadataList"),
    ):
        res = request_accept(url, q, accept)
        assert res["kind"] == kind and "shardInfo" not in res["metadata"]
        rows = res.get("rows") if kind == "Table" else res["items"]
        assert rows and len(rows) < len(get_ok(url, PODS, resourceVersion=0)["items"])


def request_accept(url: str, path: str, accept: str) -> Any:
    import http.client
    import json

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers={"Accept": accept})
        resp = conn.getresponse()
        assert resp.status == 200
        return json.loads(resp.read())
    finally:
        conn.close()


def sharded_passed_through(url: str, reason: str) -> float:
    lines = get(url, "/metrics").body.decode().splitlines()
    prefix = f'watchcache_passthrough_sharded_requests_total{{reason="{reason}"'
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


def test_a_sharded_read_the_upstream_answers_is_counted(churning: Stack) -> None:
    """An uncached kind's LIST goes to the upstream, sharded or not as it serves the parameter: counted,
    so an operator sees sharded clients that the proxy did not shard."""
    url = churning.proxy.url
    before = sharded_passed_through(url, "uncached-resource")
    res = get(url, "/api/v1/secrets", shardSelector=shards(2)[0][0])
    assert res.status == 200, res
    assert sharded_passed_through(url, "uncached-resource") == before + 1
    assert get(url, "/api/v1/secrets").status == 200  # without the parameter: not counted
    assert sharded_passed_through(url, "uncached-resource") == before + 1
