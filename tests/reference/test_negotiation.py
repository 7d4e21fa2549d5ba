"""Differential: the same request to a real kube-apiserver v1.36 and through the proxy in front of it.

Content negotiation (full objects, PartialObjectMetadata(List) in JSON and protobuf, Table,
YAML, odd Accept headers and kube's 406s) for a built-in kind (ConfigMap) and a custom
resource, over GET, LIST (paged), WATCH and ``sendInitialEvents`` watches; answers compared
by status, Content-Type and body (protobuf byte for byte where the object is the same,
JSON modulo field order; a LIST's own resourceVersion and continue token are the proxy's).
Then client-go-style metadata informers through the proxy over churn: the apiserver's
state exactly, no decode error, no relist.

Needs the reference apiserver (``shared/tools/kube-reference``); skipped without it.
Objects live in namespace ``negotiation-<xdist worker>`` and CRD
``widgets.<worker>.negotiation.example.com``, created here and deleted at the end (the namespace too).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from harness.kube.crds import delete_crd, ensure_crd
from harness.kube.kit import Api
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
from harness.processes import Proc, start, wait_ready
from harness.reflector import FLAVORS, Informer
from watchcache.kubeproto import objects

pytestmark = pytest.mark.skipif(
    not os.environ.get("KUBE_REFERENCE_KUBECONFIG"),
    reason="no reference kube-apiserver: see shared/tools/kube-reference/README.md",
)

# Per pytest-xdist worker: each worker that runs tests of this module has its own fixture.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
NS = f"negotiation-{_WORKER}"
GROUP = f"{_WORKER}.negotiation.example.com"
CRD_NAME = f"widgets.{GROUP}"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
WIDGETS = f"/apis/{GROUP}/v1/namespaces/{NS}/widgets"
LABEL = "negotiation-e2e"

KUBECTL = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
# Accept headers served from the cache, passed through, or refused (406) — each compared.
HEADERS = [
    None,
    "application/json",
    "*/*",
    "application/vnd.kubernetes.protobuf, */*",  # client-go typed: protobuf, kube's bytes (its protobuf cache)
    META_PB,
    META_JSON,
    META_LIST_PB,
    META_LIST_JSON,
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1",
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1",
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    KUBECTL,
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "text/html",
    "application/*",
    "application/json;as=PartialObjectMetadata",
    "application/json;as=Foo;g=meta.k8s.io;v=v1",
    "application/json;stream=foo",
    "application/json;sv=v2",
    "application/json;q=0",
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v2,application/json",
]
# No deliberate difference: full objects in protobuf come from the resource's protobuf cache (made on
# the first protobuf read, warmed in ``ref``: until it has synced, a typed client would get JSON).
DIFFERS: set[str] = set()


@dataclass
class Ref:
    kube: Target
    proxy: Target
    proc: Proc


def _ok(answer: Any, *codes: int) -> None:
    assert answer.status in codes, (answer.status, answer.body[:500])


def _cleanup(kube: Target) -> None:
    for path in (CONFIGMAPS, WIDGETS):  # the whole namespace is this test's
        fetch(kube, path, None, method="DELETE")
    api = _api(kube)
    try:
        delete_crd(api, CRD_NAME)  # gone before a next run creates it again
    finally:
        api.close()
    # The namespace: without kube-controller-manager nothing finalizes it, so the test does.
    fetch(kube, f"/api/v1/namespaces/{NS}", None, method="DELETE")
    finalize = {"metadata": {"name": NS}, "spec": {"finalizers": []}}
    fetch(kube, f"/api/v1/namespaces/{NS}/finalize", None, method="PUT", body=finalize)


def _api(kube: Target) -> Api:
    return Api(kube.url, kube.token, kube.ca_file)


@pytest.fixture(scope="module")
def ref() -> Iterator[Ref]:
    kube = Target(os.environ["KUBE_REFERENCE_URL"], os.environ["KUBE_REFERENCE_TOKEN"], os.environ["KUBE_REFERENCE_CA"])
    _ok(fetch(kube, "/api/v1/namespaces", None, method="POST", body={"metadata": {"name": NS}}), 201, 409)
    crd = {
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    api = _api(kube)
    try:
        ensure_crd(api, crd)  # after a deletion of it still under way (a run before this one) has ended
    finally:
        api.close()
    _cleanup_objects(kube)
    for i in range(5):
        cm = {
            "metadata": {"name": f"cm-{i}", "labels": {LABEL: "1", "team": "blue" if i % 2 else "red"}},
            "data": {"k": str(i)},
        }
        _ok(fetch(kube, CONFIGMAPS, None, method="POST", body=cm), 201)
        widget = {
            "apiVersion": f"{GROUP}/v1",
            "kind": "Widget",
            "metadata": {
                "name": f"w-{i}",
                "labels": {LABEL: "1"},
                "finalizers": ["example.com/keep"] if i == 0 else [],
            },
            "spec": {"size": i},
        }
        _ok(fetch(kube, WIDGETS, None, method="POST", body=widget), 201)
    proc = start(
        "serve",
        "--kubeconfig", os.environ["KUBE_REFERENCE_KUBECONFIG"],
        "--authentication", "none",
        "--resources", f"configmaps,{GROUP}/v1/widgets",
        "--bookmark-interval", "1",
        "--workers", "1",
    )  # fmt: skip
    try:
        wait_ready(proc)
        proxy = Target(proc.url, kube.token)
        deadline = time.monotonic() + 30
        # at resourceVersion=0: a consistent read of a few objects may pass through (kube answers protobuf)
        while not fetch(
            proxy, query(CONFIGMAPS, resourceVersion="0"), "application/vnd.kubernetes.protobuf, */*"
        ).content_type.startswith("application/vnd.kubernetes.protobuf"):
            assert time.monotonic() < deadline, "the proxy's protobuf cache of configmaps is not ready"
            time.sleep(0.2)
        yield Ref(kube, proxy, proc)
    finally:
        proc.stop()
        _cleanup_objects(kube)
        _cleanup(kube)


def _cleanup_objects(kube: Target) -> None:
    # the finalizer of w-0 would keep it (and the CRD) forever: drop it first
    conn = kube.connect(10)
    try:
        headers = {**kube.headers(None), "Content-Type": "application/merge-patch+json"}
        conn.request("PATCH", f"{WIDGETS}/w-0", body=b'{"metadata":{"finalizers":null}}', headers=headers)
        conn.getresponse().read()
    finally:
        conn.close()
    for path in (CONFIGMAPS, WIDGETS):
        fetch(kube, query(path, labelSelector=LABEL), None, method="DELETE")


def _comparable(answer: Any, *, list_body: bool) -> Any:
    """An answer's body, parsed, with what is legitimately the proxy's own removed."""
    if answer.content_type.startswith("application/yaml"):
        if not list_body:
            return answer.body
        # The list's own metadata (the last key, at column 0) holds each server's rv: writes elsewhere in
        # the cluster move it between the two reads. The bytes of everything else must be the same.
        head, sep, tail = answer.body.partition(b"\nmetadata:\n")
        return head + sep + re.sub(rb"(?m)^  (resourceVersion|continue): .*$", rb"  \1: <own>", tail)
    try:
        doc = answer.decoded()
    except ValueError:  # a full object in protobuf: its bytes; a list's without its rv and token
        if list_body and answer.body.startswith(b"k8s\x00"):
            unknown = objects.unknown(answer.body)
            page = objects.list_page(unknown.raw)
            return unknown.kind, page.items, page.remaining, "<token>" if page.continue_token else ""
        return answer.body
    if isinstance(doc, dict) and list_body and isinstance(doc.get("metadata"), dict):
        meta = dict(doc["metadata"])
        meta.pop("resourceVersion", None)
        if "continue" in meta:
            meta["continue"] = "<token>"
        doc = {**doc, "metadata": meta}
    if isinstance(doc, dict) and doc.get("kind") == "Table":
        # Age cells are relative to the moment of the answer
        doc = {**doc, "rows": [{"object": r["object"]} for r in doc.get("rows", [])]}
    return doc


def _same(ref: Ref, path: str, accept: str | None, *, list_body: bool) -> None:
    want = fetch(ref.kube, path, accept)
    got = fetch(ref.proxy, path, accept)
    context = (path, accept, want.body[:300], got.body[:300])
    assert got.status == want.status, context
    assert got.content_type == want.content_type, context
    if want.content_type.startswith("application/vnd.kubernetes.protobuf") and not list_body:
        assert got.body == want.body, context  # the same object: the same bytes
    assert _comparable(got, list_body=list_body) == _comparable(want, list_body=list_body), context


@pytest.mark.parametrize("accept", [h for h in HEADERS if h not in DIFFERS])
@pytest.mark.parametrize("path", [f"{CONFIGMAPS}/cm-1", f"{WIDGETS}/w-0"], ids=["configmap", "widget"])
def test_get(ref: Ref, path: str, accept: str | None) -> None:
    _same(ref, query(path, resourceVersion="0"), accept, list_body=False)


@pytest.mark.parametrize(
    "accept",
    [
        META_PB,
        "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/vnd.kubernetes.protobuf",
        "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
    ],
    ids=["json-error", "protobuf-error", "pretty-json-error"],
)
@pytest.mark.parametrize("path", [f"{CONFIGMAPS}/missing", f"{WIDGETS}/missing"], ids=["configmap", "widget"])
def test_errors_are_encoded_as_the_apiserver_encodes_them(ref: Ref, path: str, accept: str) -> None:
    path = query(path, resourceVersion="0")
    want, got = fetch(ref.kube, path, accept), fetch(ref.proxy, path, accept)
    assert (got.status, got.content_type) == (want.status, want.content_type)
    assert got.status == 404
    if got.content_type.startswith("application/vnd.kubernetes.protobuf"):
        assert got.body == want.body  # the same Status, byte for byte
    else:
        assert got.decoded() == want.decoded()


@pytest.mark.parametrize("accept", [h for h in HEADERS if h not in DIFFERS])
@pytest.mark.parametrize("path", [CONFIGMAPS, WIDGETS], ids=["configmaps", "widgets"])
def test_list_first_page(ref: Ref, path: str, accept: str | None) -> None:
    # (not resourceVersion=0: kube's watch cache ignores the limit then, and so does the proxy)
    _same(
        ref,
        query(path, labelSelector=LABEL, limit=2, resourceVersion="1", resourceVersionMatch="NotOlderThan"),
        accept,
        list_body=True,
    )


@pytest.mark.parametrize("accept", [META_LIST_PB, META_LIST_JSON])
def test_a_paged_list_through_the_proxy_is_the_apiservers(ref: Ref, accept: str) -> None:
    def items(target: Target) -> list[Any]:
        out: list[Any] = []
        token = None
        while True:
            answer = fetch(target, query(CONFIGMAPS, limit=2, **{"continue": token}), accept)
            _ok(answer, 200)
            doc = answer.decoded()
            out.extend(doc["items"])
            token = doc["metadata"].get("continue")
            if not token:
                return out

    assert items(ref.proxy) == items(ref.kube)


def test_the_proxy_answered_from_its_cache(ref: Ref) -> None:
    """The comparisons above must not have been pass-throughs: metadata reads counted no pass-through."""
    before = fetch(ref.proxy, "/debug/cache", None).decoded()["passed_through"]
    for accept in (META_PB, META_JSON):
        _ok(fetch(ref.proxy, query(f"{CONFIGMAPS}/cm-1", resourceVersion="0"), accept), 200)
    for accept in (META_LIST_PB, META_LIST_JSON):
        _ok(fetch(ref.proxy, query(CONFIGMAPS, limit=2, resourceVersion="0"), accept), 200)
    after = fetch(ref.proxy, "/debug/cache", None).decoded()["passed_through"]
    assert after == before


def _events(reader: WatchReader, count: int) -> list[bytes]:
    """The next ``count`` frames that are not periodic bookmarks (raw bytes)."""
    out: list[bytes] = []
    while len(out) < count:
        raw = reader.raw(10.0)
        assert raw is not None, f"watch ended after {len(out)} events"
        kind, obj = _decode(reader, raw)
        if kind == "BOOKMARK" and "annotations" not in obj["metadata"]:
            continue
        out.append(raw)
    return out


def _decode(reader: WatchReader, raw: bytes) -> tuple[str, dict[str, Any]]:
    from harness.metaclient import decode_event

    return decode_event(raw, reader.protobuf)


def _patch(kube: Target, path: str, patch: bytes) -> None:
    conn = kube.connect(10)
    try:
        headers = {**kube.headers(None), "Content-Type": "application/merge-patch+json"}
        conn.request("PATCH", path, body=patch, headers=headers)
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()[:300]
        resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    "accept",
    [META_PB, META_JSON, None, "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1"],
    ids=["metadata-protobuf", "metadata-json", "full-json", "metadata-v1beta1"],
)
def test_watch_events_are_the_apiservers(ref: Ref, accept: str | None) -> None:
    start = fetch(ref.kube, query(CONFIGMAPS, limit=1), None).decoded()["metadata"]["resourceVersion"]
    path = query(CONFIGMAPS, watch=1, resourceVersion=start, labelSelector="team=blue", allowWatchBookmarks=True)
    name = f"watched-{abs(hash(accept)) % 10_000}"
    with WatchReader(ref.kube, path, accept) as want, WatchReader(ref.proxy, path, accept) as got:
        assert (got.status, got.content_type) == (want.status, want.content_type)
        cm = {"metadata": {"name": name, "labels": {LABEL: "1", "team": "blue"}}, "data": {"k": "v"}}
        _ok(fetch(ref.kube, CONFIGMAPS, None, method="POST", body=cm), 201)
        _patch(ref.kube, f"{CONFIGMAPS}/{name}", b'{"metadata":{"annotations":{"a":"1"}}}')
        _patch(ref.kube, f"{CONFIGMAPS}/{name}", b'{"metadata":{"labels":{"team":"red"}}}')  # leaves the selection
        _patch(ref.kube, f"{CONFIGMAPS}/{name}", b'{"metadata":{"labels":{"team":"blue"}}}')  # comes back
        _ok(fetch(ref.kube, f"{CONFIGMAPS}/{name}", None, method="DELETE"), 200)
        expected, actual = _events(want, 5), _events(got, 5)
        types = [_decode(want, raw)[0] for raw in expected]
        assert types == ["ADDED", "MODIFIED", "DELETED", "ADDED", "DELETED"]
        if want.protobuf:
            assert actual == expected  # byte for byte
        else:
            assert [_decode(got, raw) for raw in actual] == [_decode(want, raw) for raw in expected]


@pytest.mark.parametrize("accept", [META_PB, META_JSON], ids=["protobuf", "json"])
def test_send_initial_events_are_the_apiservers(ref: Ref, accept: str) -> None:
    path = query(
        CONFIGMAPS,
        watch=1,
        sendInitialEvents=True,
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks=True,
        labelSelector=LABEL,
    )

    def initial(target: Target) -> tuple[str, list[tuple[str, dict[str, Any]]], dict[str, Any]]:
        with WatchReader(target, path, accept) as reader:
            events = []
            while True:
                raw = reader.raw(10.0)
                assert raw is not None
                kind, obj = _decode(reader, raw)
                if kind == "BOOKMARK":
                    meta = dict(obj["metadata"])
                    meta.pop("resourceVersion")
                    return (
                        reader.content_type,
                        sorted(events, key=lambda e: e[1]["metadata"]["name"]),
                        {**obj, "metadata": meta},
                    )
                events.append((kind, obj))

    assert initial(ref.proxy) == initial(ref.kube)


@pytest.mark.parametrize(
    "accept", ["text/html", "application/yaml", "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"]
)
def test_watch_refusals_are_the_apiservers(ref: Ref, accept: str) -> None:
    path = query(CONFIGMAPS, watch=1, resourceVersion="0", timeoutSeconds=1)
    want, got = fetch(ref.kube, path, accept), fetch(ref.proxy, path, accept)
    assert (got.status, got.content_type) == (want.status, want.content_type)
    if want.body:
        assert _comparable(got, list_body=False) == _comparable(want, list_body=False)
    else:  # PartialObjectMetadataList on a watch: kube's stream ends at its first event, empty
        assert got.body == b""


def _churn(kube: Target, seconds: float) -> None:
    """Creates, updates and deletes for ``seconds``, then one last create: ``churn-final``."""
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        name = f"churn-{i % 40}"
        if i % 3 == 0:
            fetch(kube, CONFIGMAPS, None, method="POST", body={"metadata": {"name": name, "labels": {LABEL: "1"}}})
        elif i % 3 == 1:
            conn = kube.connect(10)
            try:
                headers = {**kube.headers(None), "Content-Type": "application/merge-patch+json"}
                patch = b'{"metadata":{"annotations":{"n":"%d"}}}' % i
                conn.request("PATCH", f"{CONFIGMAPS}/{name}", body=patch, headers=headers)
                conn.getresponse().read()
            finally:
                conn.close()
        else:
            fetch(kube, f"{CONFIGMAPS}/churn-{(i * 7) % 40}", None, method="DELETE")
        i += 1
    final = {"metadata": {"name": "churn-final", "labels": {LABEL: "1"}}}
    _ok(fetch(kube, CONFIGMAPS, None, method="POST", body=final), 201)


@pytest.mark.parametrize("protobuf", [True, False], ids=["protobuf", "json"])
def test_metadata_informers_through_the_proxy_match_the_apiserver(ref: Ref, protobuf: bool) -> None:
    fetch(ref.kube, f"{CONFIGMAPS}/churn-final", None, method="DELETE")
    flavor = FLAVORS["metadata" if protobuf else "metadata-json"]
    informer = Informer(ref.proxy, CONFIGMAPS, "ConfigMap", "v1", flavor, watch_seconds=2, page=3)
    control = Informer(
        ref.kube, CONFIGMAPS, "ConfigMap", "v1", flavor, watch_seconds=2, page=3
    )  # the same, against kube
    runners = [threading.Thread(target=i.run) for i in (informer, control)]
    for t in runners:
        t.start()
    try:
        time.sleep(0.5)
        _churn(ref.kube, 6.0)
        # Events arrive in order: once the last write is in a store, every earlier one is.
        for inf in (control, informer):
            assert inf.wait_for(f"{NS}/churn-final", 30), inf
    finally:
        for inf in (informer, control):
            inf.halt()
        for t in runners:
            t.join(30)
    truth = {
        f"{NS}/{i['metadata']['name']}": i["metadata"]
        for i in fetch(ref.kube, CONFIGMAPS, META_LIST_JSON).decoded()["items"]
    }
    for inf in (control, informer):
        assert inf.decode_errors == [] and inf.errors == [], inf
        assert inf.lists == 1, inf
        assert inf.events > 20
        assert inf.store == truth
