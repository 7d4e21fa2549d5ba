"""Full objects in protobuf through a real proxy process, compared byte for byte with kube-apiserver's recorded answers.

The upstream is ``RecordedUpstream`` (kube's own bytes, fixtures/recorded.json, made by
capture.py against kube-apiserver v1.36): the proxy lists and watches it in JSON and, once a
client asks for protobuf, in protobuf too. Every answer below is compared with what kube-apiserver
answered the same request: GETs, LISTs at the recorded rv (with label and field selectors, and a
paged one whose continue token is the proxy's own), watch frames from that rv (a selector-leave
DELETED included), initial events and bookmarks.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.processes import Proc, start, wait_ready
from tests.protobuf.recorded import PB, RecordedUpstream, b, from_cache
from watchcache.kubeproto import meta_pb2, objects

TYPED = PB + ", */*"  # client-go's typed clients
RESOURCES = "pods,configmaps,secrets,nodes,namespaces,services,serviceaccounts,apps/v1/deployments"


@pytest.fixture(scope="module")
def proxy(upstream: RecordedUpstream) -> Iterator[Proc]:
    proc = start(
        "serve", "--upstream", upstream.url, "--authentication", "none", "--workers", "1", "--resources", RESOURCES
    )
    wait_ready(proc)
    yield proc
    proc.stop()


def request(proc: Proc, path: str, accept: str) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection(proc.host_port, timeout=10)
    try:
        conn.request("GET", path, headers={"Accept": accept})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def in_protobuf(proc: Proc, path: str, accept: str = TYPED) -> bytes:
    """The proxy's answer once its protobuf cache of the resource is ready (JSON or pass-through before)."""
    deadline = time.monotonic() + 20
    while True:
        status, content_type, body = request(proc, path, accept)
        if content_type == PB and status == 200:
            return body
        assert time.monotonic() < deadline, f"{path}: still {status} {content_type} {body[:200]!r}"
        time.sleep(0.1)


def watch(proc: Proc, path: str, count: int) -> tuple[str, list[bytes]]:
    """The first ``count`` frames of a protobuf watch, and its content type."""
    conn = http.client.HTTPConnection(proc.host_port, timeout=15)
    conn.request("GET", path, headers={"Accept": TYPED})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()[:300]
    frames: list[bytes] = []
    pending = b""
    while len(frames) < count:
        chunk = resp.read1(65536)
        assert chunk, f"{path}: the stream ended after {len(frames)} frames"
        got, pending = objects.split_frames(pending + chunk)
        frames.extend(got)
    conn.close()
    return resp.getheader("Content-Type") or "", frames[:count]


def without_continue(body: bytes) -> tuple[str, str, int | None, list[bytes], bool]:
    unknown = objects.unknown(body)
    page = objects.list_page(unknown.raw)
    return unknown.kind, page.resource_version, page.remaining, page.items, bool(page.continue_token)


def normalized_bookmark(frame: bytes) -> tuple[str, bytes, bytes]:
    """A bookmark's object without its ObjectMeta: the kind's empty object, which kube writes whole."""
    kind, body = objects.watch_event(frame)
    assert kind == "BOOKMARK"
    unknown = objects.unknown(body)
    return (unknown.kind, *objects.without_meta(unknown.raw))


def bookmark_meta(frame: bytes) -> tuple[str, dict[str, str]]:
    return objects.bookmark_meta(objects.unknown(objects.watch_event(frame)[1]).raw)


def passed_through(proc: Proc) -> float:
    """Requests this proxy passed through so far, whatever the reason."""
    _, _, body = request(proc, "/metrics", "text/plain")
    lines = body.decode().splitlines()
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith("watchcache_passthrough_requests_total{"))


def test_gets_and_lists_are_kube_apiservers_bytes(proxy: Proc, record: dict[str, Any]) -> None:
    for kind in record["kinds"].values():  # every protobuf cache ready (until then: JSON)
        in_protobuf(proxy, kind["path"] + "?resourceVersion=0")
    before = passed_through(proxy)
    for read in record["reads"]:
        expected = b(read["body"])
        got = in_protobuf(proxy, from_cache(read["path"]))
        if "limit=" in read["path"]:
            # the continue token is the proxy's own (signed); everything else is kube's
            assert without_continue(got) == without_continue(expected), read["path"]
            assert without_continue(got)[4]
        else:
            assert got == expected, read["path"]
    assert passed_through(proxy) == before  # every answer from the cache


def test_a_client_that_accepts_only_protobuf_gets_it_from_the_cache(proxy: Proc, record: dict[str, Any]) -> None:
    for read in record["reads"][:6]:
        assert in_protobuf(proxy, from_cache(read["path"]), PB) == b(read["body"]), read["path"]
    status, _content_type, body = request(proxy, "/metrics", "text/plain")
    assert status == 200
    line = next(x for x in body.decode().splitlines() if 'passthrough_requests_total{reason="protobuf"}' in x)
    assert line.endswith(" 0.0") or line.endswith(" 0"), line


def test_initial_events_end_with_kubes_bookmark(proxy: Proc, record: dict[str, Any]) -> None:
    """Each ADDED carries what kube's GET of the object answers; the end bookmark is the kind's empty object."""
    rv = record["R"]
    for kind in ("nodes", "deployments", "secrets"):
        entry = record["kinds"][kind]
        gets: dict[bytes, bytes] = {}
        for read in record["reads"]:
            if read["kind"] == kind and "?" not in read["path"]:
                body = b(read["body"])
                gets[objects.unknown(body).raw] = body
        items = objects.list_page(objects.unknown(b(entry["protobuf"])).raw).items
        in_protobuf(proxy, entry["path"] + "?resourceVersion=0")
        path = entry["path"] + "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        path += f"&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=5"
        _, frames = watch(proxy, path, len(items) + 1)
        assert [objects.watch_event(f) for f in frames[:-1]] == [("ADDED", gets[item]) for item in items]
        assert normalized_bookmark(frames[-1]) == normalized_bookmark(b(entry["bookmark"]))
        end_rv, annotations = bookmark_meta(frames[-1])
        assert int(end_rv) >= int(rv) and annotations == {"k8s.io/initial-events-end": "true"}


def test_watch_frames_are_kubes(proxy: Proc, upstream: RecordedUpstream, record: dict[str, Any]) -> None:
    watches = record["watches"]
    plan = watches["plan"]
    for kind in ("pods", "configmaps"):
        in_protobuf(proxy, f"/api/v1/{kind}?resourceVersion=0")  # the protobuf caches are ready
    upstream.release()
    for name in ("client-configmaps", "client-web-pods", "client-n2-pods"):
        expected = [b(f) for f in watches[name]]
        content_type, frames = watch(proxy, plan[name] + "&timeoutSeconds=5", len(expected))
        assert content_type == PB + ";stream=watch"
        assert [objects.watch_event(f)[0] for f in frames] == [objects.watch_event(f)[0] for f in expected], name
        assert frames == expected, name
    # initial events (the newest state) and the bookmark that ends them
    expected = [b(f) for f in watches["client-initial-configmaps"]]
    deadline = time.monotonic() + 10
    while True:
        _, frames = watch(proxy, watches["initial-path"] + "&timeoutSeconds=5", len(expected))
        if frames[:-1] == expected[:-1] or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # the proxy's cache has not applied the last change yet
    assert frames[:-1] == expected[:-1]
    assert normalized_bookmark(frames[-1]) == normalized_bookmark(expected[-1])
    assert b"k8s.io/initial-events-end" in frames[-1]
    # a periodic bookmark (the cache's tick: 2 s before the watch's deadline), kube's empty object too
    expected = [b(f) for f in watches["client-configmaps"]]
    _, frames = watch(proxy, plan["client-configmaps"] + "&allowWatchBookmarks=true&timeoutSeconds=4", 4)
    assert frames[:3] == expected
    upstream_bookmark = next(b(f) for f in watches["upstream-configmaps"] if objects.watch_event(b(f))[0] == "BOOKMARK")
    assert normalized_bookmark(frames[3]) == normalized_bookmark(upstream_bookmark)
    assert bookmark_meta(frames[3])[1] == {}


def test_the_simulated_cluster_refuses_full_protobuf_as_kube_refuses_a_custom_resource(record: dict[str, Any]) -> None:
    sim = start("sim", "--objects", "5", "--namespaces", "1")
    try:
        status, content_type, body = request(sim, "/api/v1/pods", PB)
        assert (status, content_type) == (406, PB)
        assert body == b(record["refused"])
        status, content_type, _ = request(sim, "/api/v1/pods", TYPED)
        assert (status, content_type) == (200, "application/json")
    finally:
        sim.stop()


def test_an_error_event_is_a_protobuf_status(proxy: Proc) -> None:
    """A watch from before the protobuf cache's history: kube's 410 as an ERROR event, in protobuf."""
    in_protobuf(proxy, "/api/v1/serviceaccounts?resourceVersion=0")
    content_type, frames = watch(proxy, "/api/v1/serviceaccounts?watch=1&resourceVersion=1", 1)
    assert content_type == PB + ";stream=watch"
    kind, body = objects.watch_event(frames[0])
    assert kind == "ERROR"
    unknown = objects.unknown(body)
    status = meta_pb2.Status.FromString(unknown.raw)
    assert (unknown.api_version, unknown.kind, status.code, status.reason) == ("v1", "Status", 410, "Expired")
    assert status.message.startswith("too old resource version: 1 (")
