"""``watchcache serve --kubeconfig`` in front of the simulated cluster over TLS, with anonymous requests
refused: an exec credential plugin (a real script) and a proxy-url (a real local proxy) end to end.

The simulated cluster here authenticates like an apiserver (``--policy-file``, ``--no-anonymous-auth``):
the proxy's caches sync only if its own requests carry a token the cluster knows.
"""

from __future__ import annotations

import base64
import http.client
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.pki import Pair, Pki
from harness.processes import Proc, start, wait_logged, wait_ready
from tests.support.execplugin import ExecPlugin, kubeconfig
from tests.support.forwardproxy import ForwardProxy
from tests.support.httpkube import get
from tests.support.upgrading import WebSocket

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "watchcache/sim/policy-example.yaml"
PROXY_TOKEN = "watchcache-token"  # the policy's system:serviceaccount:watchcache:watchcache


@dataclass
class Cluster:
    root: Path
    ca: Pair
    sim: Proc

    @property
    def ca_b64(self) -> str:
        return base64.b64encode(self.ca.crt.read_bytes()).decode()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("kubeconfig-upstream")
    pki = Pki(root)
    ca = pki.ca("ca", "/CN=test-ca")
    server = pki.issue(ca, "server", "/CN=127.0.0.1", ip_san="127.0.0.1")
    sim = start(
        "sim", "--objects", "12", "--namespaces", "2", "--policy-file", str(POLICY), "--no-anonymous-auth",
        "--tls-cert-file", str(server.crt), "--tls-private-key-file", str(server.key),
    )  # fmt: skip
    yield Cluster(root, ca, sim)
    sim.stop()


def serve(path: Path, *extra: str) -> Proc:
    return start(
        "serve", "--kubeconfig", str(path), "--workers", "1", "--authentication", "none",
        "--resources", "configmaps,pods", *extra,
    )  # fmt: skip


def wait_for(predicate: Any, timeout: float, what: str, proc: Proc) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not seen in {timeout}s:\n" + "".join(proc.log[-40:]))


def as_admin(url: str, path: str) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": "Bearer admin-token", "Accept": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def ready(proc: Proc) -> bool:
    return get(proc.url, "/readyz").status == 200


def test_exec_plugin_credential_end_to_end(cluster: Cluster, tmp_path: Path) -> None:
    plugin = ExecPlugin(tmp_path)
    plugin.set("token", "not-a-token")  # the cluster answers 401 to it
    path = kubeconfig(tmp_path / "kubeconfig", cluster.sim.url, plugin, ca_b64=cluster.ca_b64)
    # Every consistent read waits for a proof from the upstream (a request with the proxy's credential).
    proxy = serve(path, "--consistent-passthrough-objects", "0")
    try:
        # 401 to the plugin's credential: it runs again (no expiry would make it run otherwise).
        wait_for(lambda: len(plugin.runs()) >= 2, 30, "a second plugin run after a 401", proxy)
        assert not ready(proxy)
        wait_logged(proxy, lambda line: "answered 401 to the exec plugin's credential" in line)
        plugin.set("token", PROXY_TOKEN)
        plugin.set("ttl", "3")
        wait_ready(proxy, 60)
        runs = plugin.runs()
        assert runs[-1]["token"] == PROXY_TOKEN
        info = runs[0]["info"]
        assert info["apiVersion"] == "client.authentication.k8s.io/v1"
        assert info["spec"]["interactive"] is False
        assert info["spec"]["cluster"]["server"] == cluster.sim.url
        assert info["spec"]["cluster"]["certificate-authority-data"] == cluster.ca_b64
        assert runs[0]["env"] == "from-kubeconfig"
        cached = get(proxy.url, "/api/v1/namespaces/ns-1/configmaps?resourceVersion=0")
        assert cached.status == 200, cached.body
        # The credential expires: the next request with it (a consistent read's proof) runs the plugin first.
        before = len(plugin.runs())
        time.sleep(max(0.0, runs[-1]["time"] + 3.5 - time.time()))
        consistent = get(proxy.url, "/api/v1/namespaces/ns-1/configmaps")
        assert consistent.status == 200, consistent.body
        after = plugin.runs()
        assert len(after) > before and after[before]["time"] >= runs[-1]["time"] + 3
        wait_logged(proxy, lambda line: "exec plugin" in line and "gave a token (expires" in line)
    finally:
        proxy.stop()


def token_kubeconfig(path: Path, cluster: Cluster, proxy_url: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": cluster.sim.url,
                    "certificate-authority-data": cluster.ca_b64,
                    "proxy-url": proxy_url,
                },
            }
        ],
        "users": [{"name": "u", "user": {"token": PROXY_TOKEN}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("kind", ["http", "socks5"])
def test_proxy_url_carries_every_upstream_connection(cluster: Cluster, tmp_path: Path, kind: str) -> None:
    forward = ForwardProxy(kind)
    sim_port = int(cluster.sim.url.rsplit(":", 1)[1])
    proxy = serve(token_kubeconfig(tmp_path / "kubeconfig", cluster, forward.url))
    try:
        wait_ready(proxy, 60)
        assert forward.targets, "the caches synced without a connection through the proxy"
        assert all(port == sim_port for _, _, port in forward.targets)
        assert {how for how, _, _ in forward.targets} == {"CONNECT" if kind == "http" else "SOCKS5"}
        # Pass-through (with the client's own token) goes through it too.
        seen = len(forward.targets)
        passed = as_admin(proxy.url, "/api/v1/namespaces/ns-1/secrets")
        assert passed[0] == 200, passed[1]
        assert len(forward.targets) > seen
        # And so does a tunnel (exec over WebSocket), on a connection of its own.
        pods = get(proxy.url, "/api/v1/namespaces/ns-1/pods?resourceVersion=0").json()["items"]
        pod, container = pods[0]["metadata"]["name"], pods[0]["spec"]["containers"][0]["name"]
        seen = len(forward.targets)
        ws = WebSocket(
            proxy.url,
            f"/api/v1/namespaces/ns-1/pods/{pod}/exec?command=echo&command=through&stdout=1&container={container}",
            subprotocols=["v5.channel.k8s.io"],
            headers={"Authorization": "Bearer admin-token"},
        )
        try:
            assert ws.accepted, ws.rejected
            data = b""
            while b"through" not in data:
                message = ws.receive()
                assert message is not None, data
                data += message if isinstance(message, bytes) else message.encode()
        finally:
            ws.close()
        assert len(forward.targets) == seen + 1
    finally:
        proxy.stop()
        forward.close()
