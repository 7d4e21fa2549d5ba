"""HTTP/2 end to end: `watchcache serve --http2` over TLS in front of `watchcache sim`, with real clients.

kubectl (client-go negotiates h2 over TLS by ALPN) gets, lists and watches; httpx with HTTP/2
multiplexes several watches on one connection and sees ``HTTP/2``; kubectl exec still works,
on HTTP/1.1 (client-go dials connection upgrades with ALPN http/1.1 only). Which connections
speak HTTP/2 is read from the proxy's own gauges.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.pki import Pair, Pki
from harness.processes import Proc, start
from harness.tools import KUBECTL_INSTALL, require

httpx = pytest.importorskip("httpx", reason="httpx[http2] is a dev dependency: pip install -e '.[dev]'")
pytest.importorskip("h2", reason="h2 is a dependency of watchcache: pip install -e .")

pytestmark = pytest.mark.timeout(120)


class Tls:
    def __init__(self, ca: Pair, proxy: Proc) -> None:
        self.ca = ca
        self.proxy = proxy
        self.url = proxy.url
        self.context = ssl.create_default_context(cafile=str(ca.crt))

    def gauge(self, name: str) -> float:
        """A gauge of the proxy, scraped over HTTP/1.1 (so the scrape is not one of the connections counted)."""
        text = httpx.get(self.url + "/metrics", verify=self.context, timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} not in /metrics")


def h2_stack(root: Path, *sim_args: str) -> tuple[Pair, Proc, Proc]:
    """A sim and `serve --http2` over TLS in front of it: (the CA, the sim, the proxy)."""
    pki = Pki(root)
    ca = pki.ca("ca", "/CN=h2-e2e-ca")
    srv = pki.issue(ca, "srv", "/CN=127.0.0.1", ip_san="127.0.0.1")
    sim = start("sim", *sim_args)
    try:
        proxy = start(
            "serve", "--upstream", sim.url, "--workers", "1", "--http2",
            "--tls-cert-file", str(srv.crt), "--tls-private-key-file", str(srv.key),
        )  # fmt: skip
    except BaseException:
        sim.stop()
        raise
    return ca, sim, proxy


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    ca, sim, proxy = h2_stack(Path(tmp_path_factory.mktemp("h2e2e")), "--objects", "30", "--namespaces", "2")
    t = Tls(ca, proxy)
    deadline = time.monotonic() + 30
    while httpx.get(t.url + "/readyz", verify=t.context, timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the proxy did not become ready"
        time.sleep(0.1)
    yield t
    proxy.stop()
    sim.stop()


def kubectl(tls: Tls, home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    exe = require("kubectl", KUBECTL_INSTALL)
    (home / "kubeconfig").write_text("")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(home / "kubeconfig")}
    # A token (any: the simulated cluster has no policy), else kubectl prompts for a password over https.
    argv = [exe, "--server", tls.url, "--certificate-authority", str(tls.ca.crt), "--token", "t"]
    argv += ["--cache-dir", str(home / "cache")]
    return subprocess.run(
        [*argv, "--request-timeout=20s", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_kubectl_gets_lists_and_watches_over_http2(tls: Tls, tmp_path: Path) -> None:
    listed = kubectl(tls, tmp_path, "get", "pods", "-A", "--chunk-size=10", "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.split()) == 30
    one = listed.stdout.split()[0].removeprefix("pod/")
    got = kubectl(tls, tmp_path, "get", "pod", one, "-n", "ns-0", "-o", "json")
    assert got.returncode == 0 and json.loads(got.stdout)["metadata"]["name"] == one
    # A watch stays open: while it does, the proxy counts an HTTP/2 connection with a stream open.
    exe = require("kubectl", KUBECTL_INSTALL)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "kubeconfig")}
    watch = subprocess.Popen(
        [exe, "--server", tls.url, "--certificate-authority", str(tls.ca.crt), "--token", "t",
         "--cache-dir", str(tmp_path / "c"),
         "get", "configmaps", "-n", "ns-1", "-w", "-o", "name"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while tls.gauge("watchcache_http2_streams") < 1:
            assert watch.poll() is None, watch.stderr.read() if watch.stderr else ""
            assert time.monotonic() < deadline, "kubectl's watch never showed up as an HTTP/2 stream"
            time.sleep(0.2)
        assert tls.gauge("watchcache_http2_connections") >= 1
        manifest = tmp_path / "cm.json"
        manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "h2-made"}}))
        created = kubectl(tls, tmp_path, "create", "-n", "ns-1", "-f", str(manifest))
        assert created.returncode == 0, created.stderr  # a write passed through, over HTTP/2
        assert watch.stdout is not None
        deadline = time.monotonic() + 20
        seen = ""
        while "configmap/h2-made" not in seen:
            assert time.monotonic() < deadline, f"the watch did not see the new ConfigMap: {seen!r}"
            seen += watch.stdout.readline()
    finally:
        watch.terminate()
        watch.wait(10)


def test_httpx_multiplexes_watches_on_one_http2_connection(tls: Tls) -> None:
    async def run() -> None:
        async with httpx.AsyncClient(http2=True, verify=tls.context, timeout=30) as client:
            ready = [asyncio.Event() for _ in range(6)]
            seen: list[list[str]] = [[] for _ in range(6)]
            versions: list[str] = []

            async def watch(i: int) -> None:
                url = f"{tls.url}/api/v1/namespaces/ns-0/configmaps?watch=1&resourceVersion=0&w={i}"
                async with client.stream("GET", url) as response:
                    versions.append(response.http_version)
                    ready[i].set()
                    async for line in response.aiter_lines():
                        if not line:
                            continue
                        event = json.loads(line)
                        seen[i].append(event["object"]["metadata"]["name"])
                        if "mux-4" in seen[i]:
                            return

            tasks = [asyncio.ensure_future(watch(i)) for i in range(6)]
            await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready)), 20)
            assert versions == ["HTTP/2"] * 6
            # All six on one connection: the proxy sees one HTTP/2 connection holding six streams.
            assert await asyncio.to_thread(tls.gauge, "watchcache_http2_connections") == 1
            assert await asyncio.to_thread(tls.gauge, "watchcache_http2_streams") >= 6
            for n in range(5):
                body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"mux-{n}"}}
                made = await client.post(f"{tls.url}/api/v1/namespaces/ns-0/configmaps", json=body)
                assert made.status_code == 201 and made.http_version == "HTTP/2", made.text
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
            for names in seen:
                assert [n for n in names if n.startswith("mux-")] == [f"mux-{n}" for n in range(5)]

    asyncio.run(run())


def test_kubectl_exec_still_works_with_http2_on(tls: Tls, tmp_path: Path) -> None:
    pods = json.loads(kubectl(tls, tmp_path, "get", "pods", "-n", "ns-0", "-o", "json").stdout)["items"]
    pod, container = pods[0]["metadata"]["name"], pods[0]["spec"]["containers"][0]["name"]
    run = kubectl(tls, tmp_path, "exec", "-n", "ns-0", pod, "-c", container, "--", "echo", "over", "http1")
    assert run.returncode == 0, run.stderr
    assert run.stdout == "over http1\n"


def test_shutdown_ends_watches_with_their_last_bookmark_then_says_goaway(tmp_path: Path) -> None:
    """SIGTERM: each HTTP/2 watch gets its final BOOKMARK and END_STREAM, then the connection a GOAWAY
    (NO_ERROR) before it closes, so a client opens its next stream on a new connection, as from Go."""
    import signal

    from tests.support.h2client import H2Client, Stream

    _, sim, proxy = h2_stack(tmp_path, "--objects", "5", "--namespaces", "1")
    host, port = proxy.url.removeprefix("https://").split(":")

    async def scenario() -> tuple[H2Client, Stream]:
        client = await H2Client.connect(host, int(port))
        assert client.alpn == "h2"
        watch = client.request("/api/v1/pods?watch=1&allowWatchBookmarks=true")
        await client.until(lambda: len(watch.events()) >= 5)  # the initial ADDED events: registered
        proxy.process.send_signal(signal.SIGTERM)
        await client.until(lambda: client.closed.is_set(), timeout=20)
        return client, watch

    try:
        client, watch = asyncio.run(scenario())
        assert watch.ended and watch.reset is None
        assert watch.events()[-1]["type"] == "BOOKMARK"
        assert client.goaway is not None and client.goaway.error_code == 0
        assert proxy.process.wait(20) == 0
    finally:
        proxy.stop()
        sim.stop()
