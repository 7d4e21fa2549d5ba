"""What serving PartialObjectMetadata and protobuf costs the proxy, and what protobuf saves a client.

Three measurements on the sim's pods (~3 KB, the shapes of ``watchcache.sim.fixtures``):

* ``sizes``: bytes per object of the cached full JSON, of its metadata as JSON and as protobuf;
  with the reference kube-apiserver (``KUBE_REFERENCE_*`` set, see shared/tools/kube-reference),
  the same pods are created there and listed in full JSON, full protobuf, metadata JSON and
  metadata protobuf, so the memory of holding full protobuf bytes too (design option (a))
  is measured on kube's own encoder;
* ``encode``: CPU per object to derive the metadata (once per object in the proxy): the JSON
  span (a parse of the object) and the protobuf ObjectMeta (a parse and a protobuf encode);
* ``dispatch``: in-process fan-out of pod MODIFIED events to K cluster-wide watchers of one
  encoding (the dispatcher and watchers, no sockets): ns per delivery, so full JSON and the
  metadata encodings can be compared (each metadata frame is built once per event, then shared);
* ``decode``: a client decoding the same PartialObjectMetadataList of N items in JSON
  (stdlib ``json`` and ``orjson``) and in protobuf (the ``protobuf`` runtime, upb, with our
  ``meta.proto``): a stand-in for client-go's decoders (Go is faster at both; the ratio is what
  carries over). "touched" also reads every item's name and resourceVersion, which a lazy
  decoder would otherwise skip.

Run: ``.venv/bin/python -m loadtest.bench.negotiation [--objects 5000] [--kube-pods 200]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import ssl
import statistics
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson

from harness.doubles import NullSink
from watchcache.cache.encoding import FULL_JSON, METADATA_JSON, METADATA_PROTOBUF, Encoding
from watchcache.cache.metadata import metadata_json, metadata_protobuf
from watchcache.cache.object import CachedObject, encode_object
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.dispatch.dispatcher import Dispatcher
from watchcache.kubeproto import meta_pb2
from watchcache.resources import PODS
from watchcache.sim.fixtures import make_pod
from watchcache.watchers.watcher import Watcher


def sim_pods(n: int) -> list[CachedObject]:
    rng = random.Random(1)
    out = []
    for i in range(n):
        body = make_pod(f"pod-{i}", f"ns-{i % 10}", f"node-{i % 50}", rng)
        meta = body["metadata"]
        meta.update(
            uid=f"{rng.getrandbits(128):032x}",
            resourceVersion=str(100 + i),
            creationTimestamp="2026-01-01T00:00:00Z",
        )
        out.append(encode_object(PODS, body))
    return out


def best_of(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def sizes(objs: list[CachedObject]) -> dict[str, float]:
    n = len(objs)
    full = sum(len(o.body) + 1 for o in objs) / n
    mj = sum(len(metadata_json(o)) for o in objs) / n
    mp = sum(len(metadata_protobuf(o)) for o in objs) / n
    return {"full_json": round(full), "metadata_json": round(mj), "metadata_protobuf": round(mp)}


def encode_cost(n: int) -> dict[str, float]:
    def fresh() -> list[CachedObject]:
        return sim_pods(n)

    objs = fresh()
    t_json = best_of(lambda: [metadata_json(o) for o in objs], 1)  # first call derives
    objs = fresh()
    t_pb = best_of(lambda: [metadata_protobuf(o) for o in objs], 1)
    t_again = best_of(lambda: [metadata_json(o) for o in objs])  # later calls: a slice
    return {
        "metadata_json_us": round(t_json / n * 1e6, 2),
        "metadata_protobuf_us": round(t_pb / n * 1e6, 2),
        "metadata_json_reuse_us": round(t_again / n * 1e6, 3),
    }


def decode_cost(objs: list[CachedObject]) -> dict[str, Any]:
    n = len(objs)
    json_body = b"".join(METADATA_JSON["v1"].list_parts(PODS, objs, 1000, None, None))
    pb_body = b"".join(METADATA_PROTOBUF["v1"].list_parts(PODS, objs, 1000, None, None))

    def pb_decode() -> Any:
        unknown = meta_pb2.Unknown.FromString(pb_body[4:])
        return meta_pb2.PartialObjectMetadataList.FromString(unknown.raw)

    def pb_touch() -> None:
        for item in pb_decode().items:
            _ = item.metadata.name, item.metadata.resourceVersion

    def json_touch() -> None:
        for item in json.loads(json_body)["items"]:
            _ = item["metadata"]["name"], item["metadata"]["resourceVersion"]

    def orjson_touch() -> None:
        for item in orjson.loads(json_body)["items"]:
            _ = item["metadata"]["name"], item["metadata"]["resourceVersion"]

    rows = {
        "json (stdlib)": best_of(lambda: json.loads(json_body)),
        "json (orjson)": best_of(lambda: orjson.loads(json_body)),
        "protobuf (upb)": best_of(pb_decode),
        "json (stdlib) touched": best_of(json_touch),
        "json (orjson) touched": best_of(orjson_touch),
        "protobuf (upb) touched": best_of(pb_touch),
    }
    return {
        "items": n,
        "bytes": {"json": len(json_body), "protobuf": len(pb_body)},
        "ms": {k: round(v * 1e3, 2) for k, v in rows.items()},
        "us_per_item": {k: round(v / n * 1e6, 2) for k, v in rows.items()},
    }


def dispatch_cost(encoding: Encoding, watchers: int, events: int, batch: int = 5, repeat: int = 5) -> dict[str, float]:
    """ns per delivery and µs per event (fresh events each round: frames and metadata are built)."""
    base = sim_pods(1000)
    best = float("inf")
    for _ in range(repeat):
        cache = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
        cache.replace(base, 1000)
        d = Dispatcher(PODS)
        ws = []
        for _ in range(watchers):
            w = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), 1000, NullSink(), encoding=encoding)
            w.max_pending_bytes = 1 << 40
            d.add(w, 0.0)
            ws.append(w)
        rv = 1001
        spent = 0.0
        for b in range(events // batch):
            changes = []
            for j in range(batch):
                obj = base[(b * batch + j) % len(base)]
                body = orjson.loads(b"{" + obj.body)
                body["metadata"]["resourceVersion"] = str(rv)
                changes.append(("MODIFIED", encode_object(PODS, body)))
                rv += 1
            applied = cache.apply(changes)
            t0 = time.process_time()  # CPU: waiting for a shared core does not count
            d.dispatch(applied)
            spent += time.process_time() - t0
            for w in ws:
                w.take()
        best = min(best, spent)
    return {
        "ns_per_delivery": round(best / (events * watchers) * 1e9, 1),
        "us_per_event": round(best / events * 1e6, 1),
    }


# ------------------------------------------------------------------ the reference apiserver


class Kube:
    def __init__(self) -> None:
        self.url = os.environ["KUBE_REFERENCE_URL"]
        self.token = os.environ["KUBE_REFERENCE_TOKEN"]
        self.ctx = ssl.create_default_context(cafile=os.environ["KUBE_REFERENCE_CA"])

    def call(self, method: str, path: str, body: Any = None, accept: str = "application/json") -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", accept)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            if e.code == 409:
                return b""
            raise


def kube_sizes(count: int) -> dict[str, Any]:
    """Create ``count`` sim-shaped pods in the reference apiserver; bytes per pod in each encoding."""
    kube = Kube()
    ns = "negotiation-bench"
    kube.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    kube.call("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "default"}})
    rng = random.Random(2)
    try:
        for i in range(count):
            pod = make_pod(f"bench-{i}", ns, "", rng)
            pod["metadata"] = {k: v for k, v in pod["metadata"].items() if k in ("name", "labels", "annotations")}
            pod["spec"].pop("nodeName", None)
            pod["spec"]["serviceAccountName"] = "default"
            pod.pop("status", None)
            kube.call("POST", f"/api/v1/namespaces/{ns}/pods", pod)
        path = f"/api/v1/namespaces/{ns}/pods"
        bodies = {
            "full_json": kube.call("GET", path),
            "full_protobuf": kube.call("GET", path, accept="application/vnd.kubernetes.protobuf"),
            "metadata_json": kube.call(
                "GET", path, accept="application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            ),
            "metadata_protobuf": kube.call(
                "GET",
                path,
                accept="application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
            ),
        }
        items = orjson.loads(bodies["full_json"])["items"]
        cached = [encode_object(PODS, dict(item)) for item in items]
        return {
            "pods": len(items),
            "bytes_per_pod": {k: round(len(v) / len(items)) for k, v in bodies.items()},
            "cached_body_per_pod": round(statistics.mean(len(o.body) for o in cached)),
            "metadata_protobuf_ours_equals_kubes": b"".join(
                METADATA_PROTOBUF["v1"].list_parts(
                    PODS, cached, int(orjson.loads(bodies["full_json"])["metadata"]["resourceVersion"]), None, None
                )
            )
            == bodies["metadata_protobuf"],
        }
    finally:
        kube.call("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
        kube.call("DELETE", f"/api/v1/namespaces/{ns}")
        kube.call("PUT", f"/api/v1/namespaces/{ns}/finalize", {"metadata": {"name": ns}, "spec": {"finalizers": []}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=5000)
    parser.add_argument("--kube-pods", type=int, default=200)
    args = parser.parse_args()
    objs = sim_pods(args.objects)
    out: dict[str, Any] = {
        "sim_pod_bytes": sizes(objs),
        "encode_once_per_object": encode_cost(args.objects),
        "client_decode_metadata_list": decode_cost(objs),
        # full JSON measured first and last: the spread between the two is the machine's noise
        "dispatch_1000_watchers": {
            label: dispatch_cost(enc, 1000, 500)
            for label, enc in (
                ("json", FULL_JSON),
                ("metadata-json", METADATA_JSON["v1"]),
                ("metadata-protobuf", METADATA_PROTOBUF["v1"]),
                ("json (again)", FULL_JSON),
            )
        },
    }
    if os.environ.get("KUBE_REFERENCE_URL") and args.kube_pods:
        out["kube_apiserver_pods"] = kube_sizes(args.kube_pods)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
