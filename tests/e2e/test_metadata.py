"""PartialObjectMetadata and content negotiation through a real proxy in front of the simulated cluster.

Metadata informers (client-go's ``metadata`` package: the garbage collector, quota and
namespace controllers) ask for ``as=PartialObjectMetadata(List)``, preferring protobuf; the
proxy must answer from its cache in the representation they negotiate — before this, it
answered full objects and every metadata watch died at its first event.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.metaclient import (
    META_JSON,
    META_LIST_JSON,
    META_LIST_PB,
    META_PB,
    Target,
    WatchReader,
    fetch,
    query,
)
from harness.processes import Stack, start_stack
from harness.reflector import FLAVORS, Informer
from tests.support import httpkube as hk

PODS = "/api/v1/namespaces/ns-0/pods"


@pytest.fixture(scope="module")
def quiet() -> Iterator[Stack]:
    s = start_stack("--bookmark-interval", "1")
    yield s
    s.proxy.stop()
    s.sim.stop()


def full_metadata(url: str, path: str) -> dict[str, dict[str, Any]]:
    return {hk.key_of(o): o["metadata"] for o in hk.get_ok(url, path)["items"]}


@pytest.mark.parametrize("accept", [META_LIST_PB, META_LIST_JSON], ids=["protobuf", "json"])
def test_a_paged_metadata_list_is_every_objects_metadata(quiet: Stack, accept: str) -> None:
    target = Target(quiet.proxy.url)
    expected = full_metadata(quiet.proxy.url, PODS)
    seen: dict[str, dict[str, Any]] = {}
    token = None
    pages = 0
    rvs = set()
    while True:
        answer = fetch(target, query(PODS, limit=7, **{"continue": token}), accept)
        assert answer.status == 200, answer
        assert answer.content_type == (
            "application/vnd.kubernetes.protobuf" if "protobuf" in accept else "application/json"
        )
        doc = answer.decoded()
        assert (doc["kind"], doc["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
        assert {(i["kind"], i["apiVersion"]) for i in doc["items"]} == {("PartialObjectMetadata", "meta.k8s.io/v1")}
        for item in doc["items"]:
            seen[hk.key_of(item)] = item["metadata"]
        rvs.add(doc["metadata"]["resourceVersion"])
        pages += 1
        token = doc["metadata"].get("continue")
        if not token:
            break
        assert doc["metadata"]["remainingItemCount"] == len(expected) - len(seen)
    assert pages > 1 and len(rvs) == 1
    assert seen == expected


@pytest.mark.parametrize("accept", [META_PB, META_JSON], ids=["protobuf", "json"])
def test_a_metadata_get(quiet: Stack, accept: str) -> None:
    name = next(iter(full_metadata(quiet.proxy.url, PODS))).split("/")[1]
    full = hk.get_ok(quiet.proxy.url, f"{PODS}/{name}")
    answer = fetch(Target(quiet.proxy.url), f"{PODS}/{name}", accept)
    assert answer.status == 200
    assert answer.decoded() == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": full["metadata"],
    }
    missing = fetch(Target(quiet.proxy.url), f"{PODS}/no-such-pod", accept)
    assert missing.status == 404 and missing.content_type == "application/json"  # errors negotiate plain JSON


@pytest.mark.parametrize("accept", [META_PB, META_JSON], ids=["protobuf", "json"])
def test_a_metadata_watch_sees_every_change_as_partial_object_metadata(quiet: Stack, accept: str) -> None:
    target = Target(quiet.proxy.url)
    ns = "ns-1"
    name = "meta-watch-" + ("pb" if "protobuf" in accept else "json")
    rv = fetch(target, query(f"/api/v1/namespaces/{ns}/configmaps", limit=1), META_LIST_JSON).decoded()["metadata"][
        "resourceVersion"
    ]
    path = query(
        f"/api/v1/namespaces/{ns}/configmaps",
        watch=1,
        resourceVersion=rv,
        labelSelector="team=blue",
        allowWatchBookmarks=True,
    )
    with WatchReader(target, path, accept) as stream:
        assert stream.status == 200
        assert stream.content_type == (
            "application/vnd.kubernetes.protobuf;stream=watch" if "protobuf" in accept else "application/json"
        )
        cm = hk.configmap(name, ns, k="v")
        cm["metadata"]["labels"] = {"team": "blue"}
        assert hk.request(quiet.proxy.url, "POST", f"/api/v1/namespaces/{ns}/configmaps", cm).status == 201
        patch = {"metadata": {"annotations": {"a": "1"}}}
        path_cm = f"/api/v1/namespaces/{ns}/configmaps/{name}"
        assert (
            hk.request(quiet.proxy.url, "PATCH", path_cm, patch, content_type="application/merge-patch+json").status
            == 200
        )
        relabel = {"metadata": {"labels": {"team": "red"}}}
        assert (
            hk.request(quiet.proxy.url, "PATCH", path_cm, relabel, content_type="application/merge-patch+json").status
            == 200
        )
        events = []
        while len([e for e in events if e[0] != "BOOKMARK"]) < 3:
            event = stream.next(5.0)
            assert event is not None
            events.append(event)
        changes = [
            (t, o["metadata"].get("labels"), o["metadata"].get("annotations")) for t, o in events if t != "BOOKMARK"
        ]
        assert changes == [
            ("ADDED", {"team": "blue"}, None),
            ("MODIFIED", {"team": "blue"}, {"a": "1"}),
            # left the selection: DELETED with the previous state, at the new rv
            ("DELETED", {"team": "blue"}, {"a": "1"}),
        ]
        assert {o["kind"] for _, o in events} == {"PartialObjectMetadata"}
        deleted = next(o for t, o in events if t == "DELETED")
        current = hk.get_ok(quiet.proxy.url, path_cm)
        assert deleted["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
        # periodic bookmarks (--bookmark-interval 1) are PartialObjectMetadata too, as kube sends them
        while True:
            event = stream.next(5.0)
            assert event is not None
            if event[0] == "BOOKMARK":
                assert event[1]["kind"] == "PartialObjectMetadata"
                assert event[1]["apiVersion"] == "meta.k8s.io/v1"
                assert set(event[1]["metadata"]) == {"resourceVersion"}
                break
    hk.request(quiet.proxy.url, "DELETE", path_cm)


@pytest.mark.parametrize("accept", [META_PB, META_JSON], ids=["protobuf", "json"])
def test_send_initial_events_in_metadata(quiet: Stack, accept: str) -> None:
    expected = full_metadata(quiet.proxy.url, "/api/v1/namespaces/ns-2/pods")
    path = query(
        "/api/v1/namespaces/ns-2/pods",
        watch=1,
        sendInitialEvents=True,
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks=True,
    )
    with WatchReader(Target(quiet.proxy.url), path, accept) as stream:
        seen = {}
        while True:
            event = stream.next(5.0)
            assert event is not None
            kind, obj = event
            assert obj["kind"] == "PartialObjectMetadata"
            if kind == "BOOKMARK":
                assert obj["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
                break
            assert kind == "ADDED"
            seen[hk.key_of(obj)] = obj["metadata"]
    assert seen == expected


def test_full_and_metadata_watchers_of_one_selection_each_get_their_own_frames(quiet: Stack) -> None:
    target = Target(quiet.proxy.url)
    rv = hk.get_ok(quiet.proxy.url, "/api/v1/namespaces/ns-1/configmaps")["metadata"]["resourceVersion"]
    path = query("/api/v1/namespaces/ns-1/configmaps", watch=1, resourceVersion=rv)
    streams = [WatchReader(target, path, accept) for accept in (None, META_PB, META_JSON, "application/json")]
    try:
        hk.request(quiet.proxy.url, "POST", "/api/v1/namespaces/ns-1/configmaps", hk.configmap("shared", "ns-1", k="v"))
        got = [s.next(5.0) for s in streams]
        assert all(g is not None and g[0] == "ADDED" for g in got)
        kinds = [g[1]["kind"] for g in got if g is not None]
        assert kinds == ["ConfigMap", "PartialObjectMetadata", "PartialObjectMetadata", "ConfigMap"]
        assert got[0] == got[3]
        assert got[1] == got[2]
    finally:
        for s in streams:
            s.close()
        hk.request(quiet.proxy.url, "DELETE", "/api/v1/namespaces/ns-1/configmaps/shared")


def passthrough_counts(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "watchcache_passthrough_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["reason"]] = out.get(sample.labels["reason"], 0) + sample.value
    return out


def test_odd_accept_headers_get_kubes_406_and_what_cannot_be_cached_is_passed_through_and_counted(quiet: Stack) -> None:
    target = Target(quiet.proxy.url)
    before = passthrough_counts(quiet.proxy.url)
    # every reason is exported from the start, zeros included
    assert set(before) >= {
        "non-resource", "impersonation", "write", "subresource", "uncached-resource",
        "table", "table-crd", "protobuf", "media-type", "consistent-read",
    }  # fmt: skip
    answer = fetch(target, PODS, "text/html")
    assert (answer.status, answer.content_type) == (406, "application/json")
    status = answer.decoded()
    assert status["reason"] == "NotAcceptable" and status["details"] == {}
    assert status["message"].startswith("406: Not Acceptable\n\nAvailable representations: application/json, ")
    answer = fetch(target, PODS, "application/json;as=Foo;g=meta.k8s.io;v=v1")
    assert answer.status == 406
    assert answer.decoded()["message"].startswith("only the following media types are accepted: application/json")

    kubectl = (
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
        "application/json"
    )
    # kubectl's Table: printed from the cache (at resourceVersion=0: a consistent read would pass through
    # while this cache cannot prove itself fresh, see below)
    table = fetch(target, PODS + "?resourceVersion=0", kubectl)
    assert (table.status, table.decoded()["kind"]) == (200, "Table")
    fetch(target, PODS, "application/yaml")
    fetch(target, PODS, "application/vnd.kubernetes.protobuf")  # full objects in protobuf: only the upstream
    # protobuf preferred, JSON accepted (client-go's typed default): JSON from the cache, not counted (at
    # resourceVersion=0: a small consistent read of a cache behind the upstream's rv -- the writes of the
    # tests before moved it -- would be passed through for its freshness, docs/consistency.md)
    typed = fetch(target, PODS + "?resourceVersion=0", "application/vnd.kubernetes.protobuf, */*")
    assert (typed.status, typed.content_type) == (200, "application/json")
    after = passthrough_counts(quiet.proxy.url)
    delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert delta == {"media-type": 1, "protobuf": 1}


@pytest.fixture
def churning() -> Iterator[Stack]:
    s = start_stack("--bookmark-interval", "1", sim_args=("--objects", "300", "--namespaces", "3", "--churn", "60"))
    yield s
    s.proxy.stop()
    s.sim.stop()


def test_metadata_informers_sync_without_decode_errors_or_relists_over_churn(churning: Stack) -> None:
    target = Target(churning.proxy.url)
    informers = [
        Informer(target, "/api/v1/pods", "Pod", "v1", FLAVORS[flavor], watch_seconds=3, page=40)
        for flavor in ("metadata", "metadata-json")
    ]
    threads = [threading.Thread(target=i.run) for i in informers]
    for t in threads:
        t.start()
    try:
        time.sleep(6.0)  # the sim churns pods at 60 writes/s meanwhile
        # A last write, through the proxy: once it is in a store, every earlier event is.
        pod = hk.pod("informer-final", "ns-0")
        assert hk.request(churning.proxy.url, "POST", "/api/v1/namespaces/ns-0/pods", pod).status == 201
        for informer in informers:
            assert informer.wait_for("ns-0/informer-final", 30)
    finally:
        for informer in informers:
            informer.halt()
        for t in threads:
            t.join(30)
    for informer in informers:
        assert informer.decode_errors == [] and informer.errors == [], informer
        assert informer.lists == 1, f"a metadata informer relisted: {informer}"
        assert informer.events > 100 and informer.watches >= 2 and informer.bookmarks > 0
        # the store equals the proxy's state at the informer's last rv, exactly
        exact = hk.get_ok(churning.proxy.url, "/api/v1/pods", resourceVersion=informer.rv, resourceVersionMatch="Exact")
        assert informer.store == {hk.key_of(o): o["metadata"] for o in exact["items"]}
