"""``kubectl get pods -A`` on 10,000 pods: through watchcache vs kube-apiserver, side by side, one run.

kubectl's default output is a Table (``Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...``),
fetched in pages of 500 (``--chunk-size``): 20 requests for 10,000 pods. kube-apiserver answers each
from its watch cache, converting every pod to its internal type and printing it; watchcache prints
from rows it derived once per pod (``watchcache/printers``), writing only the ages per request.

Topology: a kube-apiserver of its own (the reference kit's binary and PKI, ``--etcd-prefix`` of its
own in the kit's etcd, so the 10,000 pods are invisible to the shared apiserver and its users), with
``POD_COUNT`` Running pods (2 containers, labels, IPs) bound to a fake node; ``watchcache serve`` in
front of it (TLS, delegated authentication: the production configuration). Then, alternately against
each, ``ROUNDS`` times:

- ``kubectl get pods -A`` (the real binary; output to /dev/null): its wall time;
- the same 20 page requests from Python (keep-alive TLS, kubectl's Accept): the listing's wall time
  without kubectl's own printing;

and each server's CPU seconds over its rounds (``/proc``: user+system of the apiserver process, of
the proxy's processes), per listing. A first listing through each warms it (the proxy derives its
rows there: measured apart as ``first``). Afterwards the prefix is deleted from etcd.

Needs the kit (``eval "$(../shared/tools/kube-reference/env.sh)"``). Run:
``.venv/bin/python -m loadtest.bench.tables`` (``--pods 2000 --rounds 5`` for a quick look).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.kube.kit import Api, KubeEnv, write_kubeconfig
from harness.kube.private import PrivateApiserver
from harness.tools import KUBECTL_INSTALL, require
from loadtest.bench import lib as bl

ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


def pod(ns: str, i: int, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"web-{i:05d}", "namespace": ns, "labels": {"app": "web", "shard": str(i % 10)}},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {"name": "app", "image": "registry.example.com/app:1.4.2", "ports": [{"containerPort": 8080}],
                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}},
                {"name": "sidecar", "image": "registry.example.com/sidecar:0.9"},
            ],
        },
    }  # fmt: skip


def running(i: int) -> dict[str, Any]:
    t = "2026-01-01T00:00:00Z"
    cond = [{"type": k, "status": "True", "lastTransitionTime": t} for k in ("Initialized", "Ready", "ContainersReady",
                                                                             "PodScheduled")]  # fmt: skip
    ip = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
    statuses = [
        {"name": n, "image": "x", "imageID": "", "ready": True, "started": True, "restartCount": i % 3,
         "state": {"running": {"startedAt": t}},
         **({"lastState": {"terminated": {"exitCode": 1, "finishedAt": t}}} if i % 3 else {})}
        for n in ("app", "sidecar")
    ]  # fmt: skip
    return {"phase": "Running", "conditions": cond, "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "192.168.0.10",
            "startTime": t, "containerStatuses": statuses}  # fmt: skip


def populate(api: Api, pods: int, namespaces: int) -> None:
    node = "bench-node"
    api.create("/api/v1/nodes", {"metadata": {"name": node}, "status": {"conditions": [
        {"type": "Ready", "status": "True"}], "allocatable": {"pods": "100000"}}})  # fmt: skip
    per = pods // namespaces
    for n in range(namespaces):
        api.create("/api/v1/namespaces", {"metadata": {"name": f"bench-{n}"}})
    started = time.monotonic()

    def make(i: int) -> None:
        ns = f"bench-{i // per}"
        api.create(f"/api/v1/namespaces/{ns}/pods", pod(ns, i, node))
        api.merge_patch(f"/api/v1/namespaces/{ns}/pods/web-{i:05d}/status", {"status": running(i)})

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for done, _ in enumerate(pool.map(make, range(per * namespaces)), 1):
            if done % 1000 == 0:
                bl.log(f"{done} pods ({time.monotonic() - started:.0f} s)")


def kubectl_get(kubectl: str, kubeconfig: Path, home: Path) -> float:
    started = time.monotonic()
    subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "--cache-dir", str(home / "cache"), "get", "pods", "-A"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600,
                   env={"PATH": os.environ.get("PATH", ""), "HOME": str(home)})  # fmt: skip
    return time.monotonic() - started


def listing(api: Api) -> tuple[float, int, int, float]:
    """kubectl's requests: the Table in pages of 500; (seconds, pages, rows, seconds of the first page).

    The first page is a consistent read (no resourceVersion): a server answers it once its cache is
    proven as new as etcd (kube: a progress request to etcd; watchcache: docs/consistency.md); the
    next pages read the first page's snapshot.
    """
    started = time.monotonic()
    token, pages, rows, first = "", 0, 0, 0.0
    while True:
        path = "/api/v1/pods?limit=500" + (f"&continue={token}" if token else "")
        status, _, body = api.raw("GET", path, accept=ACCEPT)
        assert status == 200, body[:300]
        if not pages:
            first = time.monotonic() - started
        doc = json.loads(body)
        pages += 1
        rows += len(doc["rows"])
        token = doc["metadata"].get("continue", "")
        if not token:
            return time.monotonic() - started, pages, rows, first


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=10_000)
    p.add_argument("--namespaces", type=int, default=10)
    p.add_argument("--rounds", type=int, default=20, help="listings per target and method")
    p.add_argument("--workers", type=int, default=1, help="watchcache serve --workers")
    args = p.parse_args()
    kube = KubeEnv.from_environ()
    kubectl = require("kubectl", KUBECTL_INSTALL)
    work = Path(tempfile.mkdtemp(prefix="bench-tables-"))
    bl.log(f"load before: {os.getloadavg()}")
    # no controller manager here: pods need no ServiceAccount object
    apiserver = PrivateApiserver(kube, work, extra=["--disable-admission-plugins=ServiceAccount"])
    apiserver.start()
    api_direct = Api(apiserver.url, kube.token, kube.ca, timeout=120)
    proxy = None
    try:
        populate(api_direct, args.pods, args.namespaces)
        upstream = write_kubeconfig(work / "upstream.kubeconfig", apiserver.url, kube.ca, kube.token)
        cert, key = bl.make_tls_cert(work)
        proxy = bl.start_process("proxy", [
            *bl.watchcache_exe(), "serve", "--listen", "127.0.0.1:0", "--kubeconfig", str(upstream),
            "--tls-cert-file", str(cert), "--tls-private-key-file", str(key), "--authentication", "delegated",
            "--resources", "pods", "--workers", str(args.workers),
        ])  # fmt: skip
        bl.wait_ready(proxy)
        targets = {
            "kube-apiserver": (api_direct, upstream, lambda: bl.cpu_seconds(apiserver.pid)),
            "watchcache": (Api(proxy.url, kube.token, str(cert), timeout=120),
                           write_kubeconfig(work / "proxy.kubeconfig", proxy.url, str(cert), kube.token), proxy.cpu),
        }  # fmt: skip
        first: dict[str, float] = {}
        for name, (api, _, _) in targets.items():
            seconds, pages, count, _ = listing(api)
            assert count == args.pods, (name, count)
            first[name] = seconds
            bl.log(f"{name}: first listing {seconds:.2f} s, {pages} pages")
        results: dict[str, dict[str, list[float]]] = {
            n: {"kubectl": [], "listing": [], "first": [], "cpu": []} for n in targets
        }
        for _ in range(args.rounds):
            for name, (api, kubeconfig, cpu) in targets.items():
                before = cpu()
                results[name]["kubectl"].append(kubectl_get(kubectl, kubeconfig, work))
                seconds, _, _, first_page = listing(api)
                results[name]["listing"].append(seconds)
                results[name]["first"].append(first_page)
                results[name]["cpu"].append((cpu() - before) / 2)  # per listing: kubectl's and ours
        table: list[list[Any]] = []
        for name, r in results.items():
            k, li, fp = bl.summarize(r["kubectl"]), bl.summarize(r["listing"]), bl.summarize(r["first"])
            cpu_per = sum(r["cpu"]) / len(r["cpu"]) * 1000
            table.append([name, k["p50"], k["p99"], li["p50"], li["p99"], fp["p50"], cpu_per,
                          cpu_per / (args.pods / 500), first[name] * 1000])  # fmt: skip
        bl.print_table(
            ["server", "kubectl p50 ms", "kubectl p99 ms", "pages p50 ms", "pages p99 ms", "1st page p50 ms",
             "server CPU ms / listing", "CPU ms / page", "warm-up listing ms"],
            table,
            title=f"kubectl get pods -A, {args.pods:,} pods in {-(-args.pods // 500)} pages, {args.rounds} rounds each "
            f"(load {os.getloadavg()[0]:.1f})",
        )  # fmt: skip
    finally:
        if proxy is not None:
            proxy.stop()
        apiserver.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
