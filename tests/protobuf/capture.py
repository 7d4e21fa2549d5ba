"""Record kube-apiserver's protobuf answers: the suite tier's fixtures for full objects in protobuf.

Run once against the reference kit (shared/tools/kube-reference)::

    eval "$(../shared/tools/kube-reference/env.sh)"
    .venv/bin/python -m tests.protobuf.capture        # writes tests/protobuf/fixtures/recorded.json

It creates labelled objects of each kind the proxy caches by default (``KINDS``) in namespace
``proto-capture``, then at one resourceVersion ``R`` records, per kind: the collection (labelled
objects only) in JSON and in protobuf — what the recorded upstream (``recorded.py``) serves the
proxy — and kube's protobuf answers the tests replay against the proxy (GET of each object, LISTs
with selectors, a paged LIST), and a bookmark frame. Then it changes pods and configmaps while
watching in protobuf from ``R``: the upstream's stream (cluster-wide), and what a client with a
label selector and one with ``sendInitialEvents`` receive. The objects are removed at the end.
Binary bodies are stored base64.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path
from typing import Any

from harness.kube.kit import Api, ApiError, KubeEnv, wait_for, with_query
from watchcache.kubeproto import objects

FIXTURES = Path(__file__).parent / "fixtures"
PB = "application/vnd.kubernetes.protobuf"
# Per run: a namespace kube cannot delete without its controller manager stays (Terminating), and
# the cluster-wide lists select this run's objects only.
RUN = str(int(time.time()))
NS = f"proto-capture-{RUN}"
LABEL = f"proto-capture={RUN}"
LABELS = {"proto-capture": RUN}

CONTAINER = {
    "name": "app",
    "image": "registry.example/app:1.2.3",
    "args": ["--port", "8080"],
    "env": [
        {"name": "MODE", "value": "prod"},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ],
    "ports": [{"containerPort": 8080, "name": "http"}],
    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
    "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}],
}


def pod(name: str, app: str, node: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {**LABELS, "app": app}, "annotations": {"team": "blue"}},
        "spec": {
            "nodeName": node,
            "containers": [CONTAINER, {**CONTAINER, "name": "sidecar", "ports": []}],
            "volumes": [{"name": "config", "configMap": {"name": "cm-a"}}],
            **spec,
        },
    }


# path (collection, cluster-wide), namespaced, objects to create (namespaced ones in NS)
KINDS: dict[str, tuple[str, bool, list[dict[str, Any]]]] = {
    "namespaces": ("/api/v1/namespaces", False, []),  # NS itself, made first
    "nodes": (
        "/api/v1/nodes",
        False,
        [
            {"metadata": {"name": "proto-n1", "labels": {**LABELS, "zone": "a"}}, "spec": {"unschedulable": True}},
            {"metadata": {"name": "proto-n2", "labels": {**LABELS, "zone": "b"}}},
        ],
    ),
    "serviceaccounts": ("/api/v1/serviceaccounts", True, [{"metadata": {"name": "builder", "labels": LABELS}}]),
    "configmaps": (
        "/api/v1/configmaps",
        True,
        [
            {"metadata": {"name": "cm-a", "labels": {**LABELS, "app": "web"}}, "data": {"k": "v", "e": ""}},
            {"metadata": {"name": "cm-b", "labels": LABELS}, "binaryData": {"b": "AAEC"}},
        ],
    ),
    "secrets": (
        "/api/v1/secrets",
        True,
        [
            {"metadata": {"name": "s-opaque", "labels": LABELS}, "type": "Opaque", "data": {"k": "dmFsdWU="}},
            {
                "metadata": {"name": "s-custom", "labels": LABELS},
                "type": "example.com/custom",
                "stringData": {"a": "b"},
            },
        ],
    ),
    "services": (
        "/api/v1/services",
        True,
        [
            {
                "metadata": {"name": "svc-a", "labels": LABELS},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080, "name": "http"}]},
            }
        ],
    ),
    "pods": (
        "/api/v1/pods",
        True,
        [
            pod("p-web-1", "web", "proto-n1", hostNetwork=True),
            pod("p-web-2", "web", "proto-n2"),
            pod("p-db", "db", "proto-n2", restartPolicy="Never", schedulerName="other-scheduler"),
        ],
    ),
    "deployments": (
        "/apis/apps/v1/deployments",
        True,
        [
            {
                "metadata": {"name": "dep-a", "labels": LABELS},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "dep"}},
                    "template": {
                        "metadata": {"labels": {"app": "dep"}},
                        "spec": {"containers": [{**CONTAINER, "volumeMounts": []}]},
                    },
                },
            }
        ],
    ),
}


# kube's protobuf answers replayed against the proxy: (kind, path and query), R filled in.
def expected_reads(names: dict[str, list[str]]) -> list[tuple[str, str]]:
    exact = {"resourceVersion": "{R}", "resourceVersionMatch": "Exact"}
    reads: list[tuple[str, str]] = []
    for kind, (path, namespaced, _) in KINDS.items():
        scoped = path.replace("/api/v1/", f"/api/v1/namespaces/{NS}/").replace(
            "/apis/apps/v1/", f"/apis/apps/v1/namespaces/{NS}/"
        )
        base = scoped if namespaced else path
        for name in names[kind]:
            reads.append((kind, f"{base}/{name}"))
        reads.append((kind, with_query(base, labelSelector=LABEL, **exact)))
        reads.append((kind, with_query(path, labelSelector=LABEL, **exact)))
    pods = KINDS["pods"][0].replace("/api/v1/", f"/api/v1/namespaces/{NS}/")
    reads += [
        ("pods", with_query(pods, labelSelector=f"{LABEL},app=web", **exact)),
        ("pods", with_query(pods, labelSelector=LABEL, fieldSelector="spec.nodeName=proto-n2", **exact)),
        ("pods", with_query(pods, labelSelector=LABEL, fieldSelector="spec.restartPolicy=Never", **exact)),
        ("pods", with_query(pods, labelSelector=LABEL, fieldSelector="spec.hostNetwork=false", **exact)),
        ("pods", with_query(pods, labelSelector=LABEL, fieldSelector="status.phase=Pending", **exact)),
        ("pods", with_query(pods, labelSelector=LABEL, limit="2", **exact)),
        ("nodes", with_query("/api/v1/nodes", labelSelector=LABEL, fieldSelector="spec.unschedulable=true", **exact)),
        ("nodes", with_query("/api/v1/nodes", labelSelector=LABEL, fieldSelector="spec.unschedulable=false", **exact)),
        (
            "secrets",
            with_query(f"/api/v1/namespaces/{NS}/secrets", labelSelector=LABEL, fieldSelector="type=Opaque", **exact),
        ),
        (
            "namespaces",
            with_query("/api/v1/namespaces", labelSelector=LABEL, fieldSelector="status.phase=Active", **exact),
        ),
    ]
    return reads


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def get(api: Api, path: str, accept: str) -> bytes:
    status, _, body = api.raw("GET", path, accept=accept)
    assert status == 200, (path, accept, status, body[:300])
    return body


def watch_frames(api: Api, path: str, out: list[bytes], *, until: Any = None) -> None:
    """The protobuf frames of one watch until it ends (or ``until(frames)`` is true)."""
    conn = api.connect(timeout=30)
    conn.request("GET", path, headers=api.headers(PB))
    resp = conn.getresponse()
    assert resp.status == 200, (path, resp.status, resp.read()[:300])
    pending = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        frames, pending = objects.split_frames(pending + chunk)
        out.extend(frames)
        if until is not None and until(out):
            break
    conn.close()


def setup(api: Api) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {"namespaces": [NS]}
    if not api.exists(f"/api/v1/namespaces/{NS}"):
        api.create("/api/v1/namespaces", {"metadata": {"name": NS, "labels": LABELS}})
    try:  # a kit with a controller manager makes it too
        api.create(f"/api/v1/namespaces/{NS}/serviceaccounts", {"metadata": {"name": "default"}})
    except ApiError as e:
        if e.status != 409:
            raise
    for kind, (path, namespaced, objs) in KINDS.items():
        if kind == "namespaces":
            continue
        base = (
            path.replace("/api/v1/", f"/api/v1/namespaces/{NS}/").replace(
                "/apis/apps/v1/", f"/apis/apps/v1/namespaces/{NS}/"
            )
            if namespaced
            else path
        )
        names[kind] = []
        for obj in objs:
            try:
                api.create(base, obj)
            except ApiError as e:
                if e.status != 409:
                    raise
            names[kind].append(obj["metadata"]["name"])
    return names


def teardown(api: Api) -> None:
    for name in ("proto-n1", "proto-n2"):
        api.delete(f"/api/v1/nodes/{name}")
    api.delete(f"/api/v1/namespaces/{NS}")


def bookmark(api: Api, kind: str, entry: dict[str, Any], rv: str) -> None:
    frames: list[bytes] = []
    path = with_query(
        entry["path"],
        watch="1",
        resourceVersion=rv,
        allowWatchBookmarks="true",
        timeoutSeconds="4",
        labelSelector=LABEL,
    )
    watch_frames(api, path, frames, until=lambda f: any(objects.watch_event(x)[0] == "BOOKMARK" for x in f))
    entry["bookmark"] = b64(next(f for f in frames if objects.watch_event(f)[0] == "BOOKMARK"))


def capture(api: Api) -> dict[str, Any]:
    before = api.get("/api/v1/namespaces", limit="1")["metadata"]["resourceVersion"]
    names = setup(api)
    time.sleep(1.0)  # the controllers of a kit with a control plane settle (a service's endpoints...)
    # One more write, so that etcd's rv is past every object's (kube's bookmarks need its caches past a watch's start).
    api.create(f"/api/v1/namespaces/{NS}/configmaps", {"metadata": {"name": "unlabelled"}})
    rv = api.get("/api/v1/namespaces", labelSelector=LABEL)["metadata"]["resourceVersion"]
    record: dict[str, Any] = {"R": rv, "namespace": NS, "label": LABEL, "kinds": {}, "discovery": {}}
    for path in ("/api/v1", "/apis/apps/v1"):
        record["discovery"][path] = json.loads(get(api, path, "application/json"))
    for kind, (path, _, _) in KINDS.items():
        query = with_query(path, labelSelector=LABEL, resourceVersion=rv, resourceVersionMatch="Exact")
        record["kinds"][kind] = {
            "path": path,
            "json": json.loads(get(api, query, "application/json")),
            "protobuf": b64(get(api, query, PB)),
        }
    # kube sends a bookmark once its cache is past the watch's start: from before this run's objects.
    threads = [threading.Thread(target=bookmark, args=(api, kind, record["kinds"][kind], before)) for kind in KINDS]
    for t in threads:
        t.start()
    time.sleep(0.5)
    for path, _, _ in KINDS.values():
        api.get(path, limit="1")  # a consistent read: kube asks etcd for progress, its caches move on
    for t in threads:
        t.join(30)
    reads = []
    for kind, path in expected_reads(names):
        path = path.replace("%7BR%7D", rv).replace("{R}", rv)
        reads.append({"kind": kind, "path": path, "body": b64(get(api, path, PB))})
    record["reads"] = reads
    record["watches"] = watches(api, rv)
    return record


def watches(api: Api, rv: str) -> dict[str, Any]:
    """Changes to pods and configmaps, watched in protobuf from ``rv`` by the upstream's reflector and by clients."""
    plan = {
        "upstream-pods": with_query(
            "/api/v1/pods",
            watch="1",
            resourceVersion=rv,
            labelSelector=LABEL,
            allowWatchBookmarks="true",
            timeoutSeconds="6",
        ),
        "upstream-configmaps": with_query(
            "/api/v1/configmaps",
            watch="1",
            resourceVersion=rv,
            labelSelector=LABEL,
            allowWatchBookmarks="true",
            timeoutSeconds="6",
        ),
        "client-configmaps": with_query(
            f"/api/v1/namespaces/{NS}/configmaps", watch="1", resourceVersion=rv, labelSelector=LABEL
        ),
        "client-web-pods": with_query(
            f"/api/v1/namespaces/{NS}/pods", watch="1", resourceVersion=rv, labelSelector=f"{LABEL},app=web"
        ),
        "client-n2-pods": with_query(
            f"/api/v1/namespaces/{NS}/pods",
            watch="1",
            resourceVersion=rv,
            labelSelector=LABEL,
            fieldSelector="spec.nodeName=proto-n2",
        ),
    }
    frames: dict[str, list[bytes]] = {k: [] for k in plan}
    expect = {"client-configmaps": 3, "client-web-pods": 1, "client-n2-pods": 2}
    threads = [
        threading.Thread(
            target=watch_frames,
            args=(api, path, frames[k]),
            kwargs={"until": _enough(expect.get(k))},
        )
        for k, path in plan.items()
    ]
    for t in threads:
        t.start()
    time.sleep(0.5)
    cms = f"/api/v1/namespaces/{NS}/configmaps"
    pods = f"/api/v1/namespaces/{NS}/pods"
    api.create(cms, {"metadata": {"name": "cm-c", "labels": LABELS}, "data": {"new": "1"}})
    api.merge_patch(f"{cms}/cm-a", {"data": {"k": "v2"}})
    api.delete(f"{cms}/cm-c")
    api.merge_patch(f"{pods}/p-web-2", {"metadata": {"labels": {"app": "old"}}})  # leaves app=web
    api.merge_patch(f"{pods}/p-db", {"metadata": {"annotations": {"touched": "yes"}}})  # stays on proto-n2
    for t in threads:
        t.join(30)
    initial: list[bytes] = []
    path = with_query(
        cms,
        watch="1",
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true",
        labelSelector=LABEL,
    )
    watch_frames(api, path, initial, until=lambda f: objects.watch_event(f[-1])[0] == "BOOKMARK")
    out: dict[str, Any] = {k: [b64(f) for f in v] for k, v in frames.items()}
    out["client-initial-configmaps"] = [b64(f) for f in initial]
    out["plan"] = plan
    out["initial-path"] = path
    return out


def _enough(count: int | None) -> Any:
    """Stop a client's watch after ``count`` frames (None: the upstream's, until its timeout)."""
    return None if count is None else (lambda frames: len(frames) >= count)


def refused(api: Api) -> str:
    """kube's 406 to a protobuf-only read of a kind it cannot write in protobuf (a custom resource)."""
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "protowidgets.proto.example.com"},
        "spec": {
            "group": "proto.example.com",
            "scope": "Namespaced",
            "names": {
                "plural": "protowidgets",
                "singular": "protowidget",
                "kind": "ProtoWidget",
                "listKind": "ProtoWidgetList",
            },
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
    try:
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    except ApiError as e:
        if e.status != 409:
            raise
    path = f"/apis/proto.example.com/v1/namespaces/{NS}/protowidgets"
    wait_for(lambda: api.raw("GET", path)[0] == 200, 30, "the CRD served")
    status, _, body = api.raw("GET", path, accept=PB)
    assert status == 406, (status, body[:200])
    api.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/protowidgets.proto.example.com")
    return b64(body)


def main() -> None:
    kube = KubeEnv.from_environ()
    api = Api(kube.url, kube.token, kube.ca)
    try:
        record = capture(api)
        record["refused"] = refused(api)
    finally:
        teardown(api)
    FIXTURES.mkdir(exist_ok=True)
    (FIXTURES / "recorded.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURES / 'recorded.json'}: R={record['R']}, {len(record['reads'])} reads")


if __name__ == "__main__":
    main()
