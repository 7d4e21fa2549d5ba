"""Connection upgrades against the real kube-apiserver v1.36 of ../shared/tools/kube-reference, each
request made directly and through `watchcache serve --kubeconfig` (TLS on both sides), answers
compared. The reference has no kubelet, so kube refuses exec, attach and port-forward ("pod ...
does not have a host assigned"): the tests show those refusals reach the client unchanged and
that the upstream judged the client's own identity. A pod's ``proxy`` subresource is a real
tunnel there: kube-apiserver proxies the upgrade to a backend this test runs on the pod's IP.

Skipped, with the reason, when KUBE_REFERENCE_KUBECONFIG is unset (CI machines)."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.pki import make_pki
from harness.processes import Proc, start
from harness.tools import KUBECTL_INSTALL, require
from tests.support.metrics import total
from tests.support.upgrade_upstream import FakeUpstream
from tests.support.upgrading import WebSocket, raw_upgrade

pytestmark = pytest.mark.skipif(
    not os.environ.get("KUBE_REFERENCE_KUBECONFIG"),
    reason="no reference kube-apiserver (KUBE_REFERENCE_KUBECONFIG unset): see shared/tools/kube-reference/README.md",
)

# This branch's namespace in the shared reference cluster; one per test process (xdist workers
# each run the module's fixture, and one's teardown must not delete another's pod).
NAMESPACE = f"upgrades-{uuid.uuid4().hex[:6]}"
POD = "exec-target"
WS_KEY = {"Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


def routable_ip() -> str | None:
    """An address of this machine kube-apiserver will proxy to (global unicast, not loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))  # no packet is sent: this only picks the outgoing address
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith(("127.", "0.", "169.254.")) else ip


@dataclass
class Reference:
    url: str
    ca: str
    token: str
    nobody: str
    context: ssl.SSLContext

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            if e.code in (404, 409):  # already gone / already there
                return None
            raise


@dataclass
class Setup:
    ref: Reference
    proxy: Proc
    proxy_context: ssl.SSLContext
    proxy_ca: str
    pod_ip: str | None


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    env = os.environ
    ctx = ssl.create_default_context(cafile=env["KUBE_REFERENCE_CA"])
    ref = Reference(env["KUBE_REFERENCE_URL"], env["KUBE_REFERENCE_CA"], env["KUBE_REFERENCE_TOKEN"],
                    env["KUBE_REFERENCE_NOBODY_TOKEN"], ctx)  # fmt: skip
    ip = routable_ip()
    ref.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    # No controller manager on the reference: the ServiceAccount a pod needs is made by hand.
    ref.call("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": "default"}})
    # A scheduler nobody runs: the kit's kube-scheduler would bind the pod to a node another test
    # made (test_tables' kubelets), and kube would then dial it instead of refusing.
    spec = {"schedulerName": "no-scheduler.watchcache.test", "containers": [{"name": "main", "image": "busybox"}]}
    pod = {"metadata": {"name": POD}, "spec": spec}
    ref.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    # A Running pod with an IP (no kubelet will ever say so): kubectl port-forward then tries to
    # upgrade, and the pod's proxy subresource reaches a backend at that IP.
    status: dict[str, Any] = {"phase": "Running"}
    if ip:
        status.update(podIP=ip, podIPs=[{"ip": ip}])
    ref.call("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}/status", {"status": status},
             "application/merge-patch+json")  # fmt: skip
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    # Certificate users (signed by the reference's CA) are presented upstream with the front-proxy certificate.
    proxy = start("serve", "--kubeconfig", env["KUBE_REFERENCE_KUBECONFIG"], "--workers", "1",
                  "--tls-cert-file", str(pki["srv.crt"]), "--tls-private-key-file", str(pki["srv.key"]),
                  "--client-ca-file", env["KUBE_REFERENCE_CA"], "--client-cert-passthrough", "front-proxy",
                  "--proxy-client-cert-file", env["KUBE_REFERENCE_FRONT_PROXY_CERT"],
                  "--proxy-client-key-file", env["KUBE_REFERENCE_FRONT_PROXY_KEY"])  # fmt: skip
    try:
        yield Setup(ref, proxy, ssl.create_default_context(cafile=str(pki["ca.crt"])), str(pki["ca.crt"]), ip)
    finally:
        proxy.stop()
        ref.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}?gracePeriodSeconds=0")
        ref.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
        ref.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
        # Without the namespace controller, the namespace's finalizer is lifted here.
        ref.call("PUT", f"/api/v1/namespaces/{NAMESPACE}/finalize",
                 {"metadata": {"name": NAMESPACE}, "spec": {"finalizers": []}})  # fmt: skip


def both(s: Setup, path: str, protocol: str, token: str | None, *, method: str = "GET") -> list[tuple[int, str, Any]]:
    """The same upgrade request to kube-apiserver and through the proxy: (status, content type, body)."""
    headers = dict(WS_KEY) if protocol == "websocket" else {"X-Stream-Protocol-Version": "v4.channel.k8s.io"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    answers = []
    for url, ctx in ((s.ref.url, s.ref.context), (s.proxy.url, s.proxy_context)):
        up = raw_upgrade(url, path, protocol, method=method, headers=headers, context=ctx)
        assert up.head.status != 101, path
        answers.append((up.head.status, up.head.headers.get("content-type", ""), json.loads(up.body())))
        up.close()
    return answers


def metric(s: Setup, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    req = urllib.request.Request(s.proxy.url + "/metrics", headers={"Authorization": f"Bearer {s.ref.token}"})
    with urllib.request.urlopen(req, context=s.proxy_context, timeout=10) as resp:
        text = resp.read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return total(samples, name, **labels)


@pytest.mark.parametrize("protocol,method", [("websocket", "GET"), ("SPDY/3.1", "POST")])
def test_kubes_refusals_of_exec_attach_and_portforward_come_back_unchanged(setup: Setup, protocol, method) -> None:
    base = f"/api/v1/namespaces/{NAMESPACE}/pods"
    cases = [
        (f"{base}/{POD}/exec?command=echo&command=hi&stdout=true", setup.ref.token, 400, "does not have a host"),
        (f"{base}/{POD}/attach?stdout=true", setup.ref.token, 400, "does not have a host"),
        (f"{base}/{POD}/portforward?ports=80", setup.ref.token, 400, "does not have a host"),
        (f"{base}/missing/exec?command=true&stdout=true", setup.ref.token, 404, 'pods "missing" not found'),
        # The upstream judged the client, not the proxy (whose own identity is an admin's):
        (f"{base}/{POD}/exec?command=true&stdout=true", setup.ref.nobody, 403, 'User "nobody" cannot'),
        (f"{base}/{POD}/exec?command=true&stdout=true", None, 401, "Unauthorized"),
    ]
    for path, token, code, message in cases:
        direct, through = both(setup, path, protocol, token, method=method)
        assert direct == through, path
        assert direct[0] == code and message in direct[2]["message"], (path, direct)


@pytest.mark.parametrize("protocol,method", [("websocket", "GET"), ("SPDY/3.1", "POST")])
def test_a_certificate_users_upgrade_goes_out_as_that_user(setup: Setup, protocol, method) -> None:
    """Tunnels share pass-through's identity: a client-certificate user reaches kube as itself
    (here through the front-proxy certificate), so kube's 403 names that user, direct or not."""
    env = os.environ
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}/exec?command=true&stdout=true"
    headers = dict(WS_KEY) if protocol == "websocket" else {}
    answers = []
    for url, ca in ((setup.ref.url, setup.ref.ca), (setup.proxy.url, setup.proxy_ca)):
        ctx = ssl.create_default_context(cafile=ca)
        ctx.load_cert_chain(env["KUBE_REFERENCE_CLIENT_CERT"], env["KUBE_REFERENCE_CLIENT_KEY"])
        up = raw_upgrade(url, path, protocol, method=method, headers=headers, context=ctx)
        answers.append((up.head.status, json.loads(up.body())))
        up.close()
    assert answers[0] == answers[1]
    assert answers[0][0] == 403 and 'User "cert-user" cannot' in answers[0][1]["message"], answers[0]


def test_an_upgrade_on_a_plain_get_is_answered_as_kube_answers_it(setup: Setup) -> None:
    """kube-apiserver ignores Upgrade on a path that does not upgrade, and answers the request."""
    direct, through = both(setup, f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", "websocket", setup.ref.token)
    assert direct[0] == through[0] == 200
    assert direct[2]["kind"] == through[2]["kind"] == "ServiceAccountList"
    assert [i["metadata"]["name"] for i in direct[2]["items"]] == [i["metadata"]["name"] for i in through[2]["items"]]


@pytest.fixture
def backend(setup: Setup) -> Iterator[FakeUpstream]:
    if setup.pod_ip is None:
        pytest.skip("no non-loopback address on this machine for kube-apiserver to proxy to")
    upstream = FakeUpstream(host=setup.pod_ip)
    yield upstream
    upstream.stop()


def test_a_real_tunnel_through_kube_apiservers_pod_proxy(setup: Setup, backend: FakeUpstream) -> None:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}:{backend.port}/proxy"
    auth = {"Authorization": f"Bearer {setup.ref.token}"}
    for url, ctx in ((setup.ref.url, setup.ref.context), (setup.proxy.url, setup.proxy_context)):
        ws = WebSocket(url, f"{path}/ws/echo", subprotocols=["v4.channel.k8s.io"], headers=auth, context=ctx)
        assert ws.accepted and ws.subprotocol == "v4.channel.k8s.io", url
        payload = os.urandom(1 << 20)
        ws.send(payload)
        assert ws.receive(timeout=30) == payload
        ws.close()
        up = raw_upgrade(url, f"{path}/spdy/echo", headers=auth, context=ctx)
        assert up.head.status == 101
        up.sock.sendall(b"spdy bytes")
        assert up.recv_exactly(10) == b"spdy bytes"
        up.close()
    # Two of each reached the backend, and the proxy counted its two as tunnels.
    assert len([h for h in backend.upgrade_heads() if h.target == "/ws/echo"]) == 2
    assert metric(setup, "watchcache_tunnels_total", protocol="websocket", outcome="switched") >= 1
    assert metric(setup, "watchcache_tunnels_total", protocol="spdy", outcome="switched") >= 1
    # With the nobody token kube refuses the proxy subresource: the client's identity went upstream.
    direct, through = both(setup, f"{path}/ws/echo", "websocket", setup.ref.nobody)
    assert direct == through and direct[0] == 403


def kubectl(server: str, ca: str, token: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (home / "kubeconfig").write_text("")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(home / "kubeconfig")}
    argv = [require("kubectl", KUBECTL_INSTALL), "--server", server, "--certificate-authority", ca, "--token", token,
            "--cache-dir", str(home / "cache"), "--request-timeout=20s", "-n", NAMESPACE, *args]  # fmt: skip
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_kubectl_exec_and_port_forward_fail_exactly_as_without_the_proxy(setup: Setup, tmp_path: Path) -> None:
    """kubectl tries WebSocket, then falls back to SPDY: both upgrades go through the proxy to kube."""
    ref = setup.ref
    protocols = ("websocket", "spdy")
    before = {p: metric(setup, "watchcache_tunnels_total", protocol=p, outcome="refused") for p in protocols}
    for args in (["exec", POD, "--", "echo", "hi"], ["port-forward", POD, "0:80"]):
        direct = kubectl(ref.url, ref.ca, ref.token, tmp_path, *args)
        through = kubectl(setup.proxy.url, setup.proxy_ca, ref.token, tmp_path, *args)
        assert (direct.returncode, direct.stdout, direct.stderr) == (through.returncode, through.stdout, through.stderr)
        assert direct.returncode == 1 and "does not have a host assigned" in direct.stderr, direct.stderr
    after = {p: metric(setup, "watchcache_tunnels_total", protocol=p, outcome="refused") for p in protocols}
    assert after["websocket"] - before["websocket"] == 2  # exec and port-forward's WebSocket attempts
    assert after["spdy"] - before["spdy"] == 2  # and their SPDY fallbacks
