"""The cluster side of the kubelet-shaped benchmarks: the upstream, its objects, the proxy in front.

* ``Upstream``: kube-apiserver of the reference kit (``--upstream kube``, from ``KUBE_REFERENCE_*``:
  run ``eval "$(/work/shared/tools/kube-reference/env.sh)"`` first) or the simulated cluster
  (``--upstream sim``: ``watchcache sim`` over TLS, enforcing ``sim/policy-example.yaml``). Either
  is also a *target*: the clients watch it directly, to compare with the proxy in the same run.
  Its server processes are known by pid (kube-apiserver and etcd from the kit's ``run/*.pid``),
  for their CPU and RSS.
* ``Layout``: the objects a run needs, named with a prefix of the run's own (the kit is shared):
  a namespace, Nodes ``<prefix>-node-00000…``, pods on them, ConfigMaps the kubelets watch, and the
  relist storm's pods in a namespace of their own. ``seed`` creates what is missing (existing
  objects are reused, so a second run skips the set-up), ``cleanup`` deletes it all.
* ``start_proxy``: ``watchcache serve`` in front of the upstream in the production configuration
  (TLS, delegated authentication, ``--workers 1`` unless told otherwise).

Objects come from ``watchcache.sim.fixtures`` (realistic sizes). Pods tolerate every taint: the
reference kit has no kubelets, so its node-lifecycle controller taints the fake Nodes unreachable
about a minute after they are created, and would evict pods that do not tolerate it. Their
status is the fixture's on the simulated cluster; kube-apiserver resets it to Pending on create.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.bench import lib as bl
from loadtest.bench.kubeclient import Collect, H1Conn, Target
from loadtest.bench.kubelet_clients import configmap_index
from watchcache.sim import fixtures

KIT_ENV = ("KUBE_REFERENCE_URL", "KUBE_REFERENCE_TOKEN", "KUBE_REFERENCE_KUBECONFIG", "KUBE_REFERENCE_CA")


@dataclass
class Upstream:
    kind: str  # "kube" or "sim"
    url: str
    token: str  # an identity that may write everything and read everything
    ca: str  # "" for the sim's self-signed certificate (not verified)
    pids: dict[str, int]  # server processes by name: kube-apiserver and etcd, or the sim
    proc: bl.Proc | None = None

    def target(self, *, h2: bool = False) -> Target:
        return Target(self.url, self.token, self.ca, h2=h2)

    def cpu(self) -> dict[str, float]:
        out = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                out[name] = bl.tree_cpu_seconds(pid)
        return out

    def rss(self) -> dict[str, int]:
        out = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                out[name] = bl.tree_rss_bytes(pid)
        return out

    @property
    def server(self) -> str:
        """The process that serves the API (the one compared with the proxy)."""
        return "kube-apiserver" if self.kind == "kube" else "sim"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def kube_upstream() -> Upstream:
    missing = [v for v in KIT_ENV if not os.environ.get(v)]
    if missing:
        raise SystemExit(
            f'--upstream kube needs {", ".join(missing)}: eval "$(/work/shared/tools/kube-reference/env.sh)"'
        )
    run = Path(os.environ.get("KUBE_REFERENCE_HOME", str(Path.home() / ".cache/kube-reference"))) / "run"
    pids = {}
    for name in ("kube-apiserver", "etcd"):
        with contextlib.suppress(OSError, ValueError):
            pids[name] = int((run / f"{name}.pid").read_text().strip())
    if "kube-apiserver" not in pids:
        raise SystemExit(f"no kube-apiserver pid in {run}")
    return Upstream(
        "kube",
        os.environ["KUBE_REFERENCE_URL"],
        os.environ["KUBE_REFERENCE_TOKEN"],
        os.environ["KUBE_REFERENCE_CA"],
        pids,
    )


def sim_upstream(files: bl.ProductionFiles, extra: Sequence[str] = ()) -> Upstream:
    """``watchcache sim`` over TLS with the example policy (admin-token may do everything)."""
    assert files.cert is not None
    proc = bl.start_sim(
        objects=0,
        namespaces=1,
        extra=[
            "--nodes",
            "0",
            "--policy-file",
            str(bl.POLICY_FILE),
            "--tls-cert-file",
            str(files.cert[0]),
            "--tls-private-key-file",
            str(files.cert[1]),
            "--max-connections-per-client",
            "0",
            "--max-watchers",
            "1000000",
            *extra,
        ],
    )
    bl.wait_ready(proc)
    return Upstream("sim", proc.url, bl.ADMIN_TOKEN, "", {"sim": proc.pid}, proc)


def start_proxy(
    up: Upstream,
    files: bl.ProductionFiles,
    prod: bl.Production,
    extra: Sequence[str] = (),
    *,
    wait: bool = True,
    via: str = "",
    listen: str = "127.0.0.1:0",
    src: str | None = None,
) -> bl.Proc:
    """``watchcache serve`` in front of ``up`` (TLS and delegated authentication as ``prod`` says).

    ``via``: reach the upstream through this plain-HTTP relay (``upstream_relay``) with the
    upstream's token. ``wait=False``: return once it listens, before its caches are synced. ``src``:
    the copy of ``watchcache`` to run (``bl.child_env``).
    """
    if via:
        token = files.dir / "upstream-token"
        token.write_text(up.token if up.kind == "kube" else bl.PROXY_TOKEN)
        upstream = ["--upstream", via, "--token-file", str(token)]
    elif up.kind == "kube":
        upstream = ["--kubeconfig", os.environ["KUBE_REFERENCE_KUBECONFIG"]]
    else:
        upstream = ["--upstream", up.url, "--insecure-skip-tls-verify", "--token-file", str(files.token_file)]
    cmd = [*bl.watchcache_exe(), "serve", "--listen", listen, *upstream]
    if prod.tls:
        assert files.cert is not None
        cmd += ["--tls-cert-file", str(files.cert[0]), "--tls-private-key-file", str(files.cert[1])]
    cmd += ["--authentication", prod.authentication]
    if prod.workers:
        cmd += ["--workers", str(prod.workers)]
    cmd += list(extra)
    proc = bl.start_process("proxy", cmd, src=src)
    if wait:
        try:
            bl.wait_ready(proc, 300)
        except BaseException:
            proc.stop()
            raise
    return proc


# ---------------------------------------------------------------- objects


@dataclass(frozen=True)
class Layout:
    prefix: str = "i25"
    nodes: int = 0
    pods_per_node: int = 0
    configmaps: int = 0
    relist_pods: int = 0

    @property
    def namespace(self) -> str:
        return f"{self.prefix}-kubelets"

    @property
    def relist_namespace(self) -> str:
        return f"{self.prefix}-relist"

    @property
    def node_prefix(self) -> str:
        return f"{self.prefix}-node-"

    @property
    def cm_prefix(self) -> str:
        return f"{self.prefix}-cm-"

    def node(self, i: int) -> str:
        return f"{self.node_prefix}{i:05d}"

    def pod(self, node: int, j: int) -> str:
        return f"{self.node(node)}-pod-{j}"

    def pods(self) -> list[tuple[str, str, int]]:
        """(namespace, name, node index) of every kubelet pod."""
        return [(self.namespace, self.pod(i, j), i) for i in range(self.nodes) for j in range(self.pods_per_node)]


def _pod(layout: Layout, name: str, namespace: str, node: str, rng: random.Random, cm: str | None) -> dict[str, Any]:
    pod = fixtures.make_pod(name, namespace, node, rng)
    meta, spec = pod["metadata"], pod["spec"]
    meta.pop("generateName", None)
    meta.pop("ownerReferences", None)  # no ReplicaSet exists: the garbage collector would delete them
    meta["labels"]["bench"] = layout.prefix
    meta["annotations"]["bench/written-at"] = "0"
    spec["tolerations"] = [{"operator": "Exists"}]
    if not node:
        del spec["nodeName"]
        spec["schedulerName"] = f"{layout.prefix}-no-scheduler"  # the kit's scheduler leaves them alone
    if cm is not None:
        spec["volumes"][0]["configMap"]["name"] = cm
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    return pod


def _node(layout: Layout, name: str, rng: random.Random) -> dict[str, Any]:
    node = fixtures.make_node(name, rng)
    node["metadata"]["labels"]["bench"] = layout.prefix
    node["apiVersion"], node["kind"] = "v1", "Node"
    return node


def _configmap(layout: Layout, name: str, rng: random.Random) -> dict[str, Any]:
    cm = fixtures.make_configmap(name, layout.namespace, rng)
    cm["metadata"]["labels"]["bench"] = layout.prefix
    cm["apiVersion"], cm["kind"] = "v1", "ConfigMap"
    return cm


async def _requests(
    target: Target,
    items: Sequence[tuple[str, str, bytes]],
    concurrency: int = 24,
    content_type: str = "application/json",
) -> collections.Counter[int]:
    """Send (method, path, body) requests on ``concurrency`` keep-alive connections; count the statuses."""
    statuses: collections.Counter[int] = collections.Counter()
    queue: asyncio.Queue[tuple[str, str, bytes]] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    failures: list[str] = []

    async def worker() -> None:
        conn: H1Conn | None = None
        while not queue.empty():
            method, path, body = queue.get_nowait()
            for _attempt in range(5):
                if conn is None or conn.closed:
                    c = await target.connect()
                    assert isinstance(c, H1Conn)
                    conn = c
                sink = Collect(keep=2048)
                conn.request(method, path, sink, body=body, content_type=content_type if body else "")
                await sink.done
                if sink.error is None and sink.status not in (429, 500, 503, 504):
                    statuses[sink.status] += 1
                    if sink.status >= 400 and sink.status not in (404, 409) and len(failures) < 5:
                        failures.append(f"{method} {path}: {sink.status} {sink.body[:300]!r}")
                    break
                await asyncio.sleep(0.5)
            else:
                statuses[-1] += 1
        if conn is not None:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(min(concurrency, max(1, len(items))))))
    for f in failures:
        bl.log(f"  {f}")
    return statuses


async def _get_json(target: Target, path: str) -> tuple[int, Any]:
    conn = await target.connect()
    try:
        sink = Collect()
        conn.request("GET", path, sink)
        await sink.done
        return sink.status, (json.loads(sink.body) if sink.status == 200 else sink.body[:300])
    finally:
        conn.close()


async def _existing(target: Target, path: str) -> set[str]:
    """Names of the objects at ``path`` (a collection with a label selector), following pages."""
    names: set[str] = set()
    cont = ""
    while True:
        status, body = await _get_json(target, path + (f"&continue={cont}" if cont else "") + "&limit=5000")
        if status != 200:
            return names
        names.update(item["metadata"]["name"] for item in body["items"])
        cont = body["metadata"].get("continue", "")
        if not cont:
            return names


async def seed(up: Upstream, layout: Layout) -> dict[str, Any]:
    """Create the namespaces, Nodes, kubelet pods, ConfigMaps and relist pods that do not exist yet."""
    t = up.target()
    rng = random.Random(layout.prefix)
    t0 = time.monotonic()
    for ns in (layout.namespace, layout.relist_namespace):
        body = json.dumps(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"bench": layout.prefix}}}
        )
        await _requests(t, [("POST", "/api/v1/namespaces", body.encode())])
    if up.kind == "kube":
        # The ServiceAccount admission plugin wants the namespace's default ServiceAccount (made by the
        # controller manager) before it admits a pod; a kit without one (KUBE_REFERENCE_CONTROL_PLANE=0)
        # never makes it: after 3 s, create it.
        for ns in (layout.namespace, layout.relist_namespace):
            for attempt in range(100):
                status, _ = await _get_json(t, f"/api/v1/namespaces/{ns}/serviceaccounts/default")
                if status == 200:
                    break
                if attempt == 10:
                    sa = json.dumps({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
                    await _requests(t, [("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", sa.encode())])
                await asyncio.sleep(0.3)
    sel = f"?labelSelector=bench%3D{layout.prefix}"
    have_nodes = await _existing(t, "/api/v1/nodes" + sel)
    have_cms = await _existing(t, f"/api/v1/namespaces/{layout.namespace}/configmaps" + sel)
    have_pods = await _existing(t, f"/api/v1/namespaces/{layout.namespace}/pods" + sel)
    have_relist = await _existing(t, f"/api/v1/namespaces/{layout.relist_namespace}/pods" + sel)
    todo: list[tuple[str, str, bytes]] = []
    for i in range(layout.nodes):
        name = layout.node(i)
        if name not in have_nodes:
            todo.append(("POST", "/api/v1/nodes", json.dumps(_node(layout, name, rng)).encode()))
    for i in range(layout.configmaps):
        name = f"{layout.cm_prefix}{i:05d}"
        if name not in have_cms:
            cm_body = json.dumps(_configmap(layout, name, rng)).encode()
            todo.append(("POST", f"/api/v1/namespaces/{layout.namespace}/configmaps", cm_body))
    created = collections.Counter(await _requests(t, todo))
    todo = []
    for i in range(layout.nodes):
        for j in range(layout.pods_per_node):
            name = layout.pod(i, j)
            if name not in have_pods:
                cm = f"{layout.cm_prefix}{configmap_index(i, j, layout.configmaps):05d}" if layout.configmaps else None
                pod = _pod(layout, name, layout.namespace, layout.node(i), rng, cm)
                todo.append(("POST", f"/api/v1/namespaces/{layout.namespace}/pods", json.dumps(pod).encode()))
    for k in range(layout.relist_pods):
        name = f"{layout.prefix}-relist-{k:05d}"
        if name not in have_relist:
            pod = _pod(layout, name, layout.relist_namespace, "", rng, None)
            todo.append(("POST", f"/api/v1/namespaces/{layout.relist_namespace}/pods", json.dumps(pod).encode()))
    created.update(await _requests(t, todo))
    wanted = {p[1] for p in layout.pods()}
    extra_pods = sorted(n for n in have_pods if n not in wanted)
    return {
        "created": {str(k): v for k, v in created.items()},
        "reused": {
            "nodes": len(have_nodes),
            "configmaps": len(have_cms),
            "pods": len(have_pods),
            "relist_pods": len(have_relist),
        },
        "extra_pods": len(extra_pods),
        "seconds": round(time.monotonic() - t0, 1),
    }


async def cleanup(up: Upstream, layout: Layout) -> dict[str, Any]:
    """Delete every object of the layout's prefix: pods at once (no kubelet will), Nodes, namespaces."""
    t = up.target()
    sel = f"labelSelector=bench%3D{layout.prefix}"
    reqs = [
        ("DELETE", f"/api/v1/namespaces/{ns}/pods?{sel}&gracePeriodSeconds=0", b"")
        for ns in (layout.namespace, layout.relist_namespace)
    ]
    reqs += [("DELETE", f"/api/v1/namespaces/{layout.namespace}/configmaps?{sel}", b"")]
    statuses = await _requests(t, reqs)
    statuses.update(await _requests(t, [("DELETE", f"/api/v1/nodes?{sel}", b"")]))
    statuses.update(
        await _requests(
            t, [("DELETE", f"/api/v1/namespaces/{ns}", b"") for ns in (layout.namespace, layout.relist_namespace)]
        )
    )
    return {str(k): v for k, v in statuses.items()}
