"""What full objects in protobuf from the cache cost the proxy, per design (issue 30; docs/representations.md).

Needs the reference kube-apiserver (``KUBE_REFERENCE_*``, shared/tools/kube-reference): it creates
``--pods`` realistic pods there (two containers, env, probes, resources, volumes, on nodes, as the
issue's measurement) and lists them in JSON and in protobuf, so every figure is on kube's own bytes.

* ``bytes``: per pod, the JSON the cache holds (body) and kube's protobuf message;
* ``memory``: net bytes allocated per object (tracemalloc) by a cache's objects built from kube's
  list: ``CachedObject`` from JSON (what the JSON cache holds), ``ProtobufObject`` from protobuf
  (what design (a) adds: the bytes, and attributes read from the wire);
* ``enter``: CPU per watch event to put an object in a cache, as the reflectors do: JSON (``orjson``
  parse, attributes, the body cut from the line) and protobuf (``kubeproto/objects.py``: frame,
  envelope, attributes read from the wire, the bytes kept);
* ``schema_encode``: a lower bound of design (b), encoding from the cached JSON with a schema: the
  protobuf runtime (upb) encoding only the ObjectMeta of each pod from its parsed JSON (the rest
  of a pod, spec and status, would need kube's schemas: several times more);
* ``fan_out``: ns per delivery of MODIFIED pod events to K cluster-wide watchers of full JSON and
  of full protobuf (the dispatcher and watchers, no sockets; each frame built once per event).

Run: ``.venv/bin/python -m loadtest.bench.protobuf_cache [--pods 500] [--watchers 1000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson

from harness.doubles import NullSink
from loadtest.bench.lib import machine_info
from loadtest.bench.negotiation import Kube, best_of
from watchcache.cache.encoding import FULL_JSON, Encoding
from watchcache.cache.object import CachedObject, body_in_event, encode_object
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.protobuf import FULL_PROTOBUF, decode_protobuf_object
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.dispatch.dispatcher import Dispatcher
from watchcache.kubeproto import objects, wire
from watchcache.resources import PODS
from watchcache.watchers.watcher import Watcher

PB = "application/vnd.kubernetes.protobuf"
# Per run: without a controller manager a deleted namespace stays Terminating (cleanup finalizes it).
NS = f"protobuf-cache-bench-{int(time.time())}"


def container(name: str, i: int) -> dict[str, Any]:
    return {
        "name": name,
        "image": f"registry.example/{name}:1.{i % 7}.0",
        "args": ["--listen", ":8080", "--log-level", "info"],
        "env": [{"name": f"VAR_{k}", "value": f"value-{i}-{k}"} for k in range(6)]
        + [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"containerPort": 8080, "name": "http"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/live", "port": 8080}, "initialDelaySeconds": 10},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}, {"name": "data", "mountPath": "/data"}],
    }


def realistic_pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"bench-{i}",
            "labels": {"app": f"app-{i % 20}", "tier": "web", "pod-template-hash": f"{i * 7919:x}"},
            "annotations": {"example.com/owner": "team-a", "example.com/revision": str(i % 5)},
        },
        "spec": {
            "nodeName": f"node-{i % 50}",
            "containers": [container("app", i), container("sidecar", i)],
            "volumes": [{"name": "config", "configMap": {"name": "app-config"}}, {"name": "data", "emptyDir": {}}],
        },
    }


def kube_lists(count: int) -> tuple[bytes, bytes]:
    """``count`` pods made in the reference apiserver, listed in JSON and in protobuf at one rv."""
    kube = Kube()
    kube.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    kube.call("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", {"metadata": {"name": "default"}})
    for i in range(count):
        kube.call("POST", f"/api/v1/namespaces/{NS}/pods", realistic_pod(i))
    path = f"/api/v1/namespaces/{NS}/pods"
    listed = kube.call("GET", path)
    rv = orjson.loads(listed)["metadata"]["resourceVersion"]
    exact = f"{path}?resourceVersion={rv}&resourceVersionMatch=Exact"
    return kube.call("GET", exact), kube.call("GET", exact, accept=PB)


def cleanup() -> None:
    kube = Kube()
    kube.call("DELETE", f"/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=0")
    kube.call("DELETE", f"/api/v1/namespaces/{NS}")
    kube.call("PUT", f"/api/v1/namespaces/{NS}/finalize", {"metadata": {"name": NS}, "spec": {"finalizers": []}})


def allocated(build: Callable[[], list[Any]]) -> tuple[float, list[Any]]:
    """Net bytes per object that ``build`` leaves allocated (its result kept)."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    out = build()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / len(out), out


def fan_out(encoding: Encoding, base: list[CachedObject], raw_modified: list[CachedObject], watchers: int) -> float:
    """ns (CPU) per delivery of ``raw_modified`` as MODIFIED events to ``watchers`` cluster-wide watchers."""
    best = float("inf")
    batch = 5
    for _ in range(3):
        cache = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
        cache.replace(base, max(o.rv for o in base))
        d = Dispatcher(PODS)
        ws = []
        for _ in range(watchers):
            w = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), cache.rv, NullSink(), encoding=encoding)
            w.max_pending_bytes = 1 << 40
            d.add(w, 0.0)
            ws.append(w)
        spent = 0.0
        for start in range(0, len(raw_modified), batch):
            applied = cache.apply([("MODIFIED", o) for o in raw_modified[start : start + batch]])
            t0 = time.process_time()
            d.dispatch(applied)
            spent += time.process_time() - t0
            for w in ws:
                w.take()
        best = min(best, spent)
    return best / (len(raw_modified) * watchers) * 1e9


def restamped(objs: list[CachedObject], first_rv: int) -> list[CachedObject]:
    return [o.with_resource_version(first_rv + i) for i, o in enumerate(objs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--watchers", type=int, default=1000)
    args = parser.parse_args()
    if not os.environ.get("KUBE_REFERENCE_URL"):
        sys.exit('needs the reference kube-apiserver: eval "$(../shared/tools/kube-reference/env.sh)"')
    try:
        json_list, pb_list = kube_lists(args.pods)
    finally:
        cleanup()
    items = orjson.loads(json_list)["items"]
    raws = objects.list_page(objects.unknown(pb_list).raw).items
    n = len(items)
    assert n == len(raws) == args.pods

    json_mem, json_objs = allocated(lambda: [encode_object(PODS, orjson.loads(orjson.dumps(i))) for i in items])
    pb_mem, pb_objs = allocated(lambda: [decode_protobuf_object(PODS, bytes(bytearray(r))) for r in raws])
    for j, p in zip(json_objs, pb_objs, strict=True):
        assert (j.key, j.rv, j.labels) == (p.key, p.rv, p.labels)

    typed = PODS.typed_prefix
    json_lines = [b'{"type":"MODIFIED","object":' + typed + o.body + b"}" for o in json_objs]
    pb_frames = [wire.watch_frame(b"MODIFIED", FULL_PROTOBUF.envelope(PODS, r)) for r in raws]

    def enter_json() -> None:
        for line in json_lines:
            event = orjson.loads(line)
            encode_object(PODS, event["object"], body_in_event(PODS, line, "MODIFIED", len(event)))

    def enter_protobuf() -> None:
        for frame in pb_frames:
            _, body = objects.watch_event(frame[4:])
            decode_protobuf_object(PODS, objects.unknown(body).raw)

    metas = [i["metadata"] for i in items]
    top = max(o.rv for o in json_objs)
    out: dict[str, Any] = {
        "machine": machine_info(),
        "pods": n,
        "bytes_per_pod": {
            "json_cached_body": round(statistics.mean(len(o.body) for o in json_objs)),
            "protobuf_message": round(statistics.mean(len(r) for r in raws)),
            "json_list": round(len(json_list) / n),
            "protobuf_list": round(len(pb_list) / n),
        },
        "memory_per_object": {"json_cache": round(json_mem), "protobuf_cache": round(pb_mem)},
        "enter_us_per_event": {
            "json": round(best_of(enter_json) / n * 1e6, 2),
            "protobuf": round(best_of(enter_protobuf) / n * 1e6, 2),
        },
        "schema_encode_objectmeta_only_us": round(best_of(lambda: [wire.object_meta(m) for m in metas]) / n * 1e6, 2),
        f"fan_out_ns_per_delivery_{args.watchers}_watchers": {
            # full JSON first and last: their spread is the machine's noise
            "json": round(fan_out(FULL_JSON, json_objs, restamped(json_objs, top + 1), args.watchers), 1),
            "protobuf": round(fan_out(FULL_PROTOBUF, pb_objs, restamped(pb_objs, top + 1), args.watchers), 1),
            "json (again)": round(fan_out(FULL_JSON, json_objs, restamped(json_objs, top + 1), args.watchers), 1),
        },
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
