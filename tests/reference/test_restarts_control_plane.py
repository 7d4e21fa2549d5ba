"""Issue 20, reference tier: kube-controller-manager and kube-scheduler through a proxy that restarts.

A real kube-controller-manager and kube-scheduler (the kit's v1.36 binaries, flags as the kit's
``start.sh``) read and write through ``watchcache serve --workers 2`` (TLS, delegated
authentication, the default resources). They run the control-plane scenario (``scenario.py``:
scheduling, a Deployment rollout and a new revision, a scale-down, garbage collection, namespace
deletion), then the proxy gets SIGTERM and a new process starts on the same port (a rolling
update), every informer's watch resumes through the new process, and the scenario runs again.

Relists are counted from the requests the proxy served (``requestlog``: a TLS relay in front of
it logs every request): after the restart, no LIST of a collection without ``resourceVersion`` or
with ``resourceVersion=0``, no watch with ``sendInitialEvents=true``. The components' logs agree:
no new "Caches populated", no "too old resource version".

The components run against an apiserver of our own over the kit's etcd (``private.py``): the
kit's apiserver is shared, and its own controller manager (``start.sh --control-plane``) would
fight a second one over every object.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.kube.controlplane import ControlPlane
from harness.kube.kit import DEFAULT_RESOURCES, Api, KubeEnv, Serving, needs_kube, wait_for, write_kubeconfig
from harness.kube.kubelet import FakeKubelet
from harness.kube.private import PrivateApiserver
from harness.kube.requestlog import RequestLog, informers, relists, watches
from harness.kube.scenario import CRD_RESOURCE, Scenario, ensure_crd
from harness.processes import free_port, python_m
from harness.proxygroup import ProxyGroup

pytestmark = [pytest.mark.reference, needs_kube]


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateApiserver]:
    kit = KubeEnv.from_environ()
    if not (kit.bin / "kube-controller-manager").exists():
        pytest.skip(f"no kube-controller-manager in {kit.bin}")
    server = PrivateApiserver(kit, tmp_path_factory.mktemp("private-apiserver"))
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.mark.timeout(900)
def test_controllers_through_a_restarted_proxy_do_not_relist(private: PrivateApiserver, tmp_path: Path) -> None:
    kube = private.env()
    api = Api(kube.url, kube.token, kube.ca)
    serving = Serving.make(tmp_path)
    port = free_port()
    argv = python_m(
        "watchcache", "serve", "--kubeconfig", kube.kubeconfig, "--listen", f"127.0.0.1:{port}", "--workers", "2",
        "--tls-cert-file", str(serving.server.crt), "--tls-private-key-file", str(serving.server.key),
        "--authentication", "delegated", "--resources", f"{DEFAULT_RESOURCES},{CRD_RESOURCE}",
    )  # fmt: skip
    proxy = ProxyGroup(argv, tmp_path / "proxy.log", port, ca_file=str(serving.ca.crt))
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ssl.load_cert_chain(str(serving.server.crt), str(serving.server.key))
    requests = RequestLog(("127.0.0.1", port), server_ssl, ssl.create_default_context(cafile=str(serving.ca.crt)))
    kubeconfig = write_kubeconfig(
        tmp_path / "components.kubeconfig", f"https://127.0.0.1:{requests.start()}", str(serving.ca.crt), kube.token
    )
    try:
        ensure_crd(api)
        asyncio.run(proxy.start(120.0))
        with FakeKubelet(api, "i20t-node") as kubelet, ControlPlane(kube, kubeconfig, tmp_path / "cp") as cp:
            synced = cp.wait_synced()
            before = Scenario(api, "i20t-cp-before").run()
            counts = cp.counts()
            restart = time.monotonic()
            watching = informers(requests, restart)
            code = asyncio.run(proxy.sigterm(30.0))
            ready = asyncio.run(proxy.start(120.0))
            # Every informer that watched before watches again, through the new process.
            resumed = wait_for(lambda: watching <= watches(requests, restart), 180, "every watch resumed")
            after = Scenario(api, "i20t-cp-after").run()
            again = cp.counts()
            relisted = relists(requests, restart)
            # Why they relisted: each one's watch requests after the restart, with the answers' status (0: none).
            relisting = {line.split(" ", 2)[2].split("?")[0] for line in relisted}
            why = [
                f"{r.at - restart:6.2f}s {r.user_agent.split('/')[0]} {r.target[:150]} -> {r.status or 'no answer'}"
                for r in requests.since(restart)
                if r.target.split("?")[0] in relisting
            ]
            report = (
                f"synced in {synced:.1f}s; proxy exited {code}, new one ready in {ready:.1f}s, every informer "
                f"watching again {resumed:.1f}s after it was ready ({len(watching)} informers); steps before "
                f"{before}, after {after}; relists after the restart: {len(relisted)}"
            )
            print(report)
            assert kubelet.errors == []
        assert relisted == [], (
            report + "\n" + "\n".join(relisted[:40]) + "\ntheir requests after the restart:\n" + "\n".join(why[:80])
        )
        for component in ("kube-controller-manager", "kube-scheduler"):
            for pattern in ("lists (Caches populated)", "too old resource version", "decode errors"):
                assert again[component][pattern] == counts[component][pattern], (component, pattern, report)
    finally:
        proxy.stop()
        requests.stop()
        api.close()
