"""Consistent reads through the proxy against kube-apiserver, while the cluster's rv moves elsewhere.

A writer renews Leases in a namespace of its own (as nodes do), so the ConfigMaps the test reads are
a quiet resource in a busy cluster. Through the proxy, a consistent LIST must answer what kube
answers, read-your-writes must hold for writes made through the proxy and directly, and the LISTs
must be served from the cache after one scope proof each (no pass-through, no probe watch); a
consistent GET goes to the apiserver, as kube sends it to etcd.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.kube.kit import Api, KubeEnv, Serving, drop_namespace, needs_kube, start_proxy
from harness.processes import Proc

pytestmark = needs_kube

# Per pytest-xdist worker: the module's tests may be split between workers, and each worker's ``cluster``
# drops and makes its namespaces (one namespace for both would be dropped under the other's tests).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
NS = f"wc-consistent-{_WORKER}"
LEASES = f"wc-consistent-leases-{_WORKER}"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{LEASES}/leases"


@pytest.fixture(scope="module")
def kube() -> KubeEnv:
    return KubeEnv.from_environ()


@pytest.fixture(scope="module")
def cluster(kube: KubeEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Api, Proc]]:
    direct = Api(kube.url, kube.token, kube.ca)
    for ns in (NS, LEASES):
        drop_namespace(direct, ns, ("configmaps", "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"))
        direct.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    for i in range(30):
        direct.create(f"/api/v1/namespaces/{NS}/configmaps", {"metadata": {"name": f"cm-{i:02d}"}, "data": {"v": "0"}})
    for i in range(10):
        direct.create(
            f"/apis/coordination.k8s.io/v1/namespaces/{LEASES}/leases",
            {"metadata": {"name": f"node-{i}"}, "spec": {"holderIdentity": f"node-{i}"}},
        )
    serving = Serving.make(tmp_path_factory.mktemp("consistent"))
    proc = start_proxy(kube, serving, resources="configmaps")
    proxy = Api(proc.url, kube.token, str(serving.ca.crt))
    try:
        yield direct, proxy, proc
    finally:
        proc.stop()
        for ns in (NS, LEASES):
            drop_namespace(direct, ns, ("configmaps", "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"))


def renewing(direct: Api, stop: threading.Event) -> threading.Thread:
    """Lease renewals at about 50/s until ``stop``: the cluster's rv moves, the ConfigMaps get no event."""

    def run() -> None:
        writer = Api(direct.url, direct.token, direct.ca_file)
        i = 0
        while not stop.is_set():
            renewed = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
            writer.merge_patch(f"{LEASE_PATH}/node-{i % 10}", {"spec": {"renewTime": renewed}})
            i += 1
            stop.wait(0.02)
        writer.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def counter(proxy: Api, pattern: str) -> float:
    _, _, body = proxy.raw("GET", "/metrics", accept=None)
    return sum(float(v) for v in re.findall(pattern + r"(?:\{[^}]*\})? ([0-9.e+]+)", body.decode()))


def items(doc: dict) -> list[tuple[str, str]]:
    return [(i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in doc["items"]]


def test_consistent_lists_of_a_quiet_resource_in_a_busy_cluster_come_from_the_cache_and_read_your_writes(
    cluster: tuple[Api, Api, Proc],
) -> None:
    direct, proxy, _ = cluster
    stop = threading.Event()
    thread = renewing(direct, stop)
    try:
        served = r'apiserver_watch_cache_consistent_read_total\{[^}]*fallback="false"[^}]*\}'
        before = counter(proxy, served)
        passed = counter(proxy, r'watchcache_passthrough_requests_total\{reason="consistent-read"[^}]*\}')
        probes = counter(proxy, "watchcache_consistency_probes_total")
        path = f"/api/v1/namespaces/{NS}/configmaps"
        for i in range(1, 21):
            via = proxy if i % 2 else direct  # writes through the proxy (passed through) and directly
            written = via.merge_patch(f"{path}/cm-{i % 30:02d}", {"data": {"v": str(i)}})
            listed = proxy.get(path)  # at once, without resourceVersion
            mine = next(o for o in listed["items"] if o["metadata"]["name"] == written["metadata"]["name"])
            assert mine["data"]["v"] == str(i), f"a consistent LIST missed a write that completed before it ({i})"
            assert mine["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
            assert items(listed) == items(direct.get(path))  # the same objects at the same versions as kube's
        assert counter(proxy, served) - before >= 18  # from the cache (a write racing its event may pass)
        assert counter(proxy, r'watchcache_passthrough_requests_total\{reason="consistent-read"[^}]*\}') - passed <= 2
        assert counter(proxy, "watchcache_consistency_probes_total") == probes  # no bookmark waited for
    finally:
        stop.set()
        thread.join()


def test_a_consistent_get_is_the_apiservers_answer(cluster: tuple[Api, Api, Proc]) -> None:
    direct, proxy, _ = cluster
    path = f"/api/v1/namespaces/{NS}/configmaps/cm-00"
    before = counter(proxy, r'watchcache_passthrough_requests_total\{reason="consistent-get"[^}]*\}')
    written = direct.merge_patch(path, {"data": {"v": "get"}})
    got = proxy.get(path)
    assert got["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
    assert counter(proxy, r'watchcache_passthrough_requests_total\{reason="consistent-get"[^}]*\}') == before + 1
    assert proxy.get(path, resourceVersion="0")["metadata"]["name"] == "cm-00"  # any rv: from the cache


def test_consistent_gets_sent_early_read_every_write_before_them(cluster: tuple[Api, Api, Proc]) -> None:
    """Sent to kube-apiserver as they arrive (the worker idle), before the proxy's own flow control:
    each still answers the write made just before it, directly or through the proxy."""
    direct, proxy, _ = cluster
    path = f"/api/v1/namespaces/{NS}/configmaps/cm-01"
    used = r'watchcache_passthrough_sent_early_requests_total\{outcome="used"[^}]*\}'
    before = counter(proxy, used)
    for i in range(20):
        writer = direct if i % 2 else proxy
        written = writer.merge_patch(path, {"data": {"v": f"early-{i}"}})
        got = proxy.get(path)
        assert got["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
        assert got["data"]["v"] == f"early-{i}"
    # Sequential GETs on an idle proxy go early, but one per worker that finds no idle pooled connection
    # and any that arrives while the write before it still holds its seat (its handler's end).
    assert counter(proxy, used) - before >= 15
    assert counter(proxy, r'watchcache_passthrough_sent_early_requests_total\{outcome="dropped"[^}]*\}') == 0


def test_a_consistent_watch_starts_from_the_proven_state(cluster: tuple[Api, Api, Proc], tmp_path: Path) -> None:
    direct, proxy, _ = cluster
    written = direct.merge_patch(f"/api/v1/namespaces/{NS}/configmaps/cm-01", {"data": {"v": "watch"}})
    conn = proxy.connect(timeout=10)
    conn.request("GET", f"/api/v1/namespaces/{NS}/configmaps?watch=1&timeoutSeconds=1", headers=proxy.headers())
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    assert resp.status == 200
    assert f'"resourceVersion":"{written["metadata"]["resourceVersion"]}"' in body.replace(" ", "")
    # (With --control-plane the kit's controller manager adds its own ConfigMaps to every namespace.)
    assert body.count('"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-') == 30
