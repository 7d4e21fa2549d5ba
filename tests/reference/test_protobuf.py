"""Full objects in protobuf through watchcache against kube-apiserver's own, live (the reference tier).

The objects of ``tests/protobuf/capture.py`` (pods, configmaps, secrets, nodes, namespaces,
services, service accounts, deployments; labelled for this run) are made in the kit, then with
client-go's typed Accept (``protobuf, */*``) and with protobuf alone:

- every GET, and every LIST at kube's resourceVersion (``resourceVersionMatch=Exact``) with label
  and field selectors, is kube's bytes; a page (``limit``) has kube's items, rv and
  remainingItemCount (its continue token is the proxy's own);
- watches from that rv (one with a label selector an object leaves: its DELETED) get kube's frames
  for the same changes;
- a ``sendInitialEvents`` watch of every kind gets kube's ADDED frames and its end bookmark (the
  kind's empty object);
- none of these reads passed through (``watchcache_passthrough_requests_total``, every reason).

One worker (``--workers 1``): every request finds the protobuf cache once it is ready (a worker
group's followers are checked in the suite tier: tests/protobuf/test_workers.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from harness.kube.kit import (
    DEFAULT_RESOURCES,
    Api,
    KubeEnv,
    Serving,
    drop_namespace,
    needs_kube,
    start_proxy,
    wait_for,
    with_query,
)
from harness.processes import Proc
from tests.protobuf import capture
from tests.protobuf.capture import LABEL, NS, PB, watch_frames
from watchcache.kubeproto import objects

pytestmark = [pytest.mark.reference, needs_kube]

TYPED = PB + ", */*"


@dataclass
class Env:
    api: Api
    proxy: Api
    proc: Proc
    names: dict[str, list[str]]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    kube = KubeEnv.from_environ()
    serving = Serving.make(tmp_path_factory.mktemp("protobuf"))
    api = Api(kube.url, kube.token, kube.ca)
    names = capture.setup(api)
    proc = start_proxy(kube, serving, "--workers", "1", resources=DEFAULT_RESOURCES + ",secrets")
    proxy = Api(proc.url, kube.token, str(serving.ca.crt))
    try:
        yield Env(api, proxy, proc, names)
    finally:
        proc.stop()
        capture.teardown(api)


def answer(api: Api, path: str, accept: str) -> tuple[int, str, bytes]:
    status, headers, body = api.raw("GET", path, accept=accept)
    return status, headers.get("content-type", ""), body


def page_without_token(body: bytes) -> tuple[str, str, int | None, list[bytes], bool]:
    unknown = objects.unknown(body)
    page = objects.list_page(unknown.raw)
    return unknown.kind, page.resource_version, page.remaining, page.items, bool(page.continue_token)


def warm(env: Env, path: str) -> None:
    """Until the proxy answers ``path`` (a LIST at resourceVersion=0: from its cache) in protobuf."""
    deadline = time.monotonic() + 30
    while answer(env.proxy, path, TYPED)[1] != PB:
        assert time.monotonic() < deadline, f"{path}: no protobuf cache"
        time.sleep(0.2)


def same(env: Env, path: str, accept: str) -> None:
    """The proxy answers ``path`` in protobuf with kube's bytes (waiting for its protobuf cache, first)."""
    status, content_type, expected = answer(env.api, path, accept)
    assert (status, content_type) == (200, PB), (path, status, expected[:200])
    deadline = time.monotonic() + 20
    while True:
        status, content_type, got = answer(env.proxy, path, accept)
        if (status, content_type) == (200, PB):
            break
        assert time.monotonic() < deadline, (path, status, content_type, got[:200])
        time.sleep(0.2)
    if "limit=" in path:
        assert page_without_token(got) == page_without_token(expected), path
    else:
        assert got == expected, path


def passed_through(env: Env) -> float:
    """Requests the proxy passed through so far, whatever the reason."""
    _, _, body = answer(env.proxy, "/metrics", "text/plain")
    lines = body.decode().splitlines()
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith("watchcache_passthrough_requests_total{"))


def test_gets_and_lists_are_kube_apiservers_bytes(env: Env) -> None:
    for path, _, _ in capture.KINDS.values():  # every protobuf cache ready (until then: JSON, or kube's answer)
        warm(env, with_query(path, labelSelector=LABEL, resourceVersion="0"))
    rv = env.api.get("/api/v1/namespaces", labelSelector=LABEL)["metadata"]["resourceVersion"]
    # A GET at resourceVersion=0 (a consistent one may pass through, answered by kube itself); the
    # LISTs read kube's rv exactly.
    reads = [
        path.replace("%7BR%7D", rv) if "?" in path else path + "?resourceVersion=0"
        for _, path in capture.expected_reads(env.names)
    ]
    before = passed_through(env)
    for path in reads:
        same(env, path, TYPED)
    for path in reads[::3]:
        same(env, path, PB)
    assert passed_through(env) == before  # every answer from the proxy's cache


def test_watch_frames_are_kube_apiservers(env: Env) -> None:
    rv = env.api.get("/api/v1/namespaces", labelSelector=LABEL)["metadata"]["resourceVersion"]
    for kind in ("pods", "configmaps"):  # the protobuf caches are ready
        warm(env, with_query(f"/api/v1/namespaces/{NS}/{kind}", labelSelector=LABEL, resourceVersion="0"))
    plan = {
        "configmaps": (with_query(f"/api/v1/namespaces/{NS}/configmaps", labelSelector=LABEL), 3),
        "web-pods": (with_query(f"/api/v1/namespaces/{NS}/pods", labelSelector=f"{LABEL},app=web"), 1),
        "n2-pods": (
            with_query(f"/api/v1/namespaces/{NS}/pods", labelSelector=LABEL, fieldSelector="spec.nodeName=proto-n2"),
            2,
        ),
    }
    frames: dict[tuple[str, str], list[bytes]] = {}
    threads = []
    for name, (path, count) in plan.items():
        for target, api in (("kube", env.api), ("proxy", env.proxy)):
            out = frames[(name, target)] = []
            path_rv = f"{path}&watch=1&resourceVersion={rv}&timeoutSeconds=20"
            threads.append(
                threading.Thread(target=watch_frames, args=(api, path_rv, out), kwargs={"until": _enough(count)})
            )
    for t in threads:
        t.start()
    time.sleep(1.0)
    cms, pods = f"/api/v1/namespaces/{NS}/configmaps", f"/api/v1/namespaces/{NS}/pods"
    env.api.create(cms, {"metadata": {"name": "cm-c", "labels": capture.LABELS}, "data": {"new": "1"}})
    env.api.merge_patch(f"{cms}/cm-a", {"data": {"k": "v2"}})
    env.api.delete(f"{cms}/cm-c")
    env.api.merge_patch(f"{pods}/p-web-2", {"metadata": {"labels": {"app": "old"}}})
    env.api.merge_patch(f"{pods}/p-db", {"metadata": {"annotations": {"touched": "yes"}}})
    for t in threads:
        t.join(30)
    for name, (_, count) in plan.items():
        kube, proxy = frames[(name, "kube")], frames[(name, "proxy")]
        assert len(kube) == count, (name, [objects.watch_event(f)[0] for f in kube])
        assert [objects.watch_event(f)[0] for f in proxy] == [objects.watch_event(f)[0] for f in kube], name
        assert proxy == kube, name


def _enough(count: int) -> Any:
    return lambda frames: len(frames) >= count


def test_initial_events_of_every_kind_are_kube_apiservers(env: Env) -> None:
    """A ``sendInitialEvents`` watch of each kind: kube's ADDED frames, then its end bookmark (the kind's
    empty object; its rv is each server's own)."""
    for path, _, _ in capture.KINDS.values():
        warm(env, with_query(path, labelSelector=LABEL, resourceVersion="0"))
        watch = with_query(
            path,
            labelSelector=LABEL,
            watch="1",
            sendInitialEvents="true",
            resourceVersionMatch="NotOlderThan",
            allowWatchBookmarks="true",
            timeoutSeconds="20",
        )
        got: dict[str, list[bytes]] = {}
        for target, api in (("kube", env.api), ("proxy", env.proxy)):
            frames = got[target] = []
            watch_frames(api, watch, frames, until=_ends_initial)
        kube, proxy = got["kube"], got["proxy"]
        assert [objects.watch_event(f)[0] for f in proxy] == [objects.watch_event(f)[0] for f in kube], path
        assert proxy[:-1] == kube[:-1], path
        assert _empty_object(proxy[-1]) == _empty_object(kube[-1]), path


def _ends_initial(frames: list[bytes]) -> bool:
    return bool(frames) and objects.watch_event(frames[-1])[0] == "BOOKMARK"


def _empty_object(frame: bytes) -> tuple[str, bytes, bytes, dict[str, str]]:
    unknown = objects.unknown(objects.watch_event(frame)[1])
    return (unknown.kind, *objects.without_meta(unknown.raw), objects.bookmark_meta(unknown.raw)[1])


# Per kind, a labelled object to create and delete (ADDED, DELETED) besides the MODIFIED of its first object.
TRANSIENT: dict[str, dict[str, Any]] = {
    "nodes": {"metadata": {"name": "proto-n3", "labels": capture.LABELS}},
    "serviceaccounts": {"metadata": {"name": "transient", "labels": capture.LABELS}},
    "configmaps": {"metadata": {"name": "transient", "labels": capture.LABELS}, "data": {"x": "1"}},
    "secrets": {"metadata": {"name": "transient", "labels": capture.LABELS}, "stringData": {"x": "1"}},
    "services": {
        "metadata": {"name": "transient", "labels": capture.LABELS},
        "spec": {"ports": [{"port": 81, "name": "x"}], "type": "ClusterIP"},
    },
}


def _collection(path: str, namespaced: bool) -> str:
    if not namespaced:
        return path
    group = "/apis/apps/v1/" if path.startswith("/apis/apps/v1/") else "/api/v1/"
    return path.replace(group, f"{group}namespaces/{NS}/")


def test_watch_frames_of_every_kind_are_kube_apiservers(env: Env) -> None:
    """A watch of each built-in kind cached here, through the proxy and direct from the same rv: a MODIFIED
    of an object (and for most kinds an ADDED and a DELETED), the same frames byte for byte."""
    plan: dict[str, tuple[str, int]] = {}
    for kind, (path, namespaced, _) in capture.KINDS.items():
        warm(env, with_query(path, labelSelector=LABEL, resourceVersion="0"))
        plan[kind] = (_collection(path, namespaced), 3 if kind in TRANSIENT else 1)
    rv = env.api.get("/api/v1/namespaces", labelSelector=LABEL)["metadata"]["resourceVersion"]
    frames: dict[tuple[str, str], list[bytes]] = {}
    threads = []
    for kind, (collection, count) in plan.items():
        watch = with_query(collection, labelSelector=LABEL, watch="1", resourceVersion=rv, timeoutSeconds="30")
        for target, api in (("kube", env.api), ("proxy", env.proxy)):
            out = frames[(kind, target)] = []
            threads.append(
                threading.Thread(target=watch_frames, args=(api, watch, out), kwargs={"until": _enough(count)})
            )
    for t in threads:
        t.start()
    time.sleep(1.0)
    for kind, (collection, _) in plan.items():
        name = env.names[kind][0]
        env.api.merge_patch(f"{collection}/{name}", {"metadata": {"annotations": {"proto2-touched": rv}}})
        if kind in TRANSIENT:
            env.api.create(collection, TRANSIENT[kind])
            env.api.delete(f"{collection}/{TRANSIENT[kind]['metadata']['name']}")
    for t in threads:
        t.join(40)
    for kind, (_, count) in plan.items():
        kube, proxy = frames[(kind, "kube")][:count], frames[(kind, "proxy")][:count]
        assert len(kube) == count, (kind, [objects.watch_event(f)[0] for f in kube])
        assert [objects.watch_event(f)[0] for f in proxy] == [objects.watch_event(f)[0] for f in kube], kind
        assert proxy == kube, kind


def test_a_protobuf_watch_from_before_the_protobuf_cache_is_backfilled_with_kubes_frames(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A typed client resuming from an rv older than the proxy's protobuf cache (made on its first protobuf
    read, after that rv): the proxy backfills the history from kube in protobuf, and the watch gets kube's
    own frames, as a JSON watch from before its cache gets kube's history."""
    kube = KubeEnv.from_environ()
    api = Api(kube.url, kube.token, kube.ca)
    ns = f"proto2-pb-backfill-{int(time.time() * 1000) % 10**9}"
    api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    cms = f"/api/v1/namespaces/{ns}/configmaps"
    proc = None
    try:
        old_rv = api.create(cms, {"metadata": {"name": "cm"}, "data": {"v": "0"}})["metadata"]["resourceVersion"]
        for i in range(1, 4):
            api.merge_patch(f"{cms}/cm", {"data": {"v": str(i)}})
        serving = Serving.make(tmp_path_factory.mktemp("protobuf-backfill"))
        proc = start_proxy(kube, serving, "--workers", "1", resources="configmaps")
        proxy = Api(proc.url, kube.token, str(serving.ca.crt))
        deadline = time.monotonic() + 30  # the first protobuf read makes the protobuf cache, after old_rv
        while answer(proxy, with_query(cms, resourceVersion="0"), TYPED)[1] != PB:
            assert time.monotonic() < deadline, "no protobuf cache"
            time.sleep(0.2)
        # The ConfigMap's own events: with the kit's controllers running, kube-root-ca.crt may be
        # created in the new namespace after old_rv (an ADDED before them, at kube as through the proxy).
        only_cm = "metadata.name=cm"
        watch = with_query(cms, watch="1", resourceVersion=old_rv, timeoutSeconds="20", fieldSelector=only_cm)
        got: dict[str, list[bytes]] = {}
        for target, client in (("kube", api), ("proxy", proxy)):
            frames = got[target] = []
            watch_frames(client, watch, frames, until=_enough(3))
        assert [objects.watch_event(f)[0] for f in got["kube"]] == ["MODIFIED"] * 3
        assert got["proxy"] == got["kube"]
        backfilled = f"backfilled configmaps from rv {old_rv} from the upstream:"  # (cluster-wide: others write too)
        # (logged once the fetch's span is in the cache; the log is read by a thread of the test's)
        wait_for(lambda: any(backfilled in line for line in proc.log), 10, f"'{backfilled}' in the proxy's log")
    finally:
        if proc is not None:
            proc.stop()
        drop_namespace(api, ns, ("configmaps",))
        api.close()


def test_the_bookmark_of_a_kind_without_objects_is_kubes_empty_object(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A protobuf cache learns its kind's empty object from the upstream's own bookmark: also when the kind
    has no object at all (the proxy's learning once skipped an empty list, and its bookmarks were bare
    until its watch's first periodic bookmark, a minute on)."""
    kube = KubeEnv.from_environ()
    api = Api(kube.url, kube.token, kube.ca)
    path = "/api/v1/podtemplates"
    if api.get(path, limit="1")["items"]:
        pytest.skip("the kit holds podtemplates: this test needs a kind without objects")
    serving = Serving.make(tmp_path_factory.mktemp("protobuf-empty"))
    proc = start_proxy(kube, serving, "--workers", "1", resources="podtemplates")
    try:
        proxy = Api(proc.url, kube.token, str(serving.ca.crt))
        deadline = time.monotonic() + 30  # the first protobuf read makes the protobuf cache
        while answer(proxy, with_query(path, resourceVersion="0"), TYPED)[1] != PB:
            assert time.monotonic() < deadline, "no protobuf cache"
            time.sleep(0.2)
        watch = with_query(path, watch="1", sendInitialEvents="true", resourceVersionMatch="NotOlderThan",
                           allowWatchBookmarks="true", timeoutSeconds="10")  # fmt: skip
        got: dict[str, list[bytes]] = {}
        for target, client in (("kube", api), ("proxy", proxy)):
            frames = got[target] = []
            watch_frames(client, watch, frames, until=_ends_initial)
        assert [objects.watch_event(f)[0] for f in got["proxy"]] == ["BOOKMARK"]
        assert _empty_object(got["proxy"][-1]) == _empty_object(got["kube"][-1])
        assert objects.without_meta(objects.unknown(objects.watch_event(got["kube"][-1])[1]).raw) != (b"", b"")
    finally:
        proc.stop()
        api.close()
