"""exec, attach, cp and port-forward end to end: kubectl (WebSocket, its default since 1.31) and the
official Python client, through `watchcache serve` in front of `watchcache sim`, which serves the
streaming subresources over kube's channel protocols. Every kubectl run is also made against the
simulated cluster directly: the proxy must not change a byte of what the client sees."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.stream import portforward, stream

from harness.processes import Stack, start_stack
from harness.tools import KUBECTL_INSTALL, require
from tests.support.httpkube import get, get_ok
from tests.support.metrics import scrape, total
from tests.support.upgrading import WebSocket, raw_upgrade


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = start_stack("--workers", "1", sim_args=("--objects", "6", "--namespaces", "1"))
    yield s
    s.proxy.stop()
    s.sim.stop()


@pytest.fixture(scope="module")
def target(stack: Stack) -> tuple[str, str]:
    """(pod, its first container) in ns-0."""
    pod = get_ok(stack.proxy.url, "/api/v1/namespaces/ns-0/pods")["items"][0]
    return pod["metadata"]["name"], pod["spec"]["containers"][0]["name"]


def kubectl(url: str, home: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    (home / "kubeconfig").write_text("")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(home / "kubeconfig")}
    argv = [
        require("kubectl", KUBECTL_INSTALL),
        "--server",
        url,
        "--cache-dir",
        str(home / "cache"),
        "--request-timeout=20s",
        "-n",
        "ns-0",
    ]
    return subprocess.run([*argv, *args], env=env, input=stdin, capture_output=True, timeout=60)


def both(stack: Stack, home: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run kubectl through the proxy and against the simulated cluster; the two must agree."""
    through = kubectl(stack.proxy.url, home, *args, stdin=stdin)
    direct = kubectl(stack.sim.url, home, *args, stdin=stdin)
    assert (through.returncode, through.stdout, through.stderr) == (direct.returncode, direct.stdout, direct.stderr)
    return through


def test_kubectl_exec_output_stdin_and_exit_codes(stack: Stack, target, tmp_path: Path) -> None:
    pod, container = target
    before = total(scrape(stack.proxy.url)[1], "watchcache_tunnels_total", protocol="websocket", outcome="switched")
    run = both(stack, tmp_path, "exec", pod, "-c", container, "--", "echo", "hello", "world")
    assert (run.returncode, run.stdout) == (0, b"hello world\n")
    run = both(stack, tmp_path, "exec", pod, "-c", container, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (run.returncode, run.stdout) == (3, b"out\n")
    assert b"err\n" in run.stderr and b"command terminated with exit code 3" in run.stderr
    run = both(stack, tmp_path, "exec", "-i", pod, "-c", container, "--", "cat", stdin=b"through stdin\n" * 1000)
    assert (run.returncode, run.stdout) == (0, b"through stdin\n" * 1000)
    run = both(stack, tmp_path, "exec", pod, "-c", container, "--", "no-such-command")
    assert run.returncode == 1 and b'exec: "no-such-command": executable file not found' in run.stderr
    # kube's own refusals pass through unchanged too.
    run = both(stack, tmp_path, "exec", pod, "-c", "nope", "--", "true")
    assert run.returncode == 1 and f"container nope is not valid for pod {pod}".encode() in run.stderr
    run = both(stack, tmp_path, "exec", "missing-pod", "--", "true")
    assert run.returncode == 1 and b'pods "missing-pod" not found' in run.stderr
    after = total(scrape(stack.proxy.url)[1], "watchcache_tunnels_total", protocol="websocket", outcome="switched")
    assert after - before == 4  # the four sessions that ran were tunnels through the proxy


def test_kubectl_cp_both_ways(stack: Stack, target, tmp_path: Path) -> None:
    pod, container = target
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(2_000_000))
    run = kubectl(stack.proxy.url, tmp_path, "cp", str(src), f"{pod}:/tmp/payload.bin", "-c", container)
    assert run.returncode == 0, run.stderr
    back = tmp_path / "back.bin"
    run = kubectl(stack.proxy.url, tmp_path, "cp", f"{pod}:/tmp/payload.bin", str(back), "-c", container)
    assert run.returncode == 0, run.stderr
    assert back.read_bytes() == src.read_bytes()


def test_kubectl_attach_with_stdin(stack: Stack, target, tmp_path: Path) -> None:
    pod, container = target
    run = both(stack, tmp_path, "attach", "-i", pod, "-c", container, stdin=b"attached input\n")
    assert run.returncode == 0 and run.stdout == b"attached input\n"


def api_client(url: str) -> client.CoreV1Api:
    cfg = client.Configuration()
    cfg.host = url
    return client.CoreV1Api(client.ApiClient(cfg))


def test_python_client_exec_through_the_proxy(stack: Stack, target) -> None:
    pod, container = target
    api = api_client(stack.proxy.url)
    resp = stream(
        api.connect_get_namespaced_pod_exec, pod, "ns-0", container=container,
        command=["sh", "-c", "echo hi; echo oops >&2; exit 4"],
        stderr=True, stdout=True, stdin=False, tty=False, _preload_content=False,
    )  # fmt: skip
    resp.run_forever(timeout=10)
    assert resp.read_stdout() == "hi\n" and resp.read_stderr() == "oops\n"
    assert resp.returncode == 4


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP echo server on loopback: the simulated pod's port."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return

            def echo(c: socket.socket) -> None:
                with c:
                    while data := c.recv(65536):
                        c.sendall(data)

            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    stop.set()
    server.close()


def test_python_client_portforward_moves_bytes_both_ways(stack: Stack, target, echo_port: int) -> None:
    pod, _ = target
    api = api_client(stack.proxy.url)
    pf = portforward(api.connect_get_namespaced_pod_portforward, pod, "ns-0", ports=str(echo_port))
    sock = pf.socket(echo_port)
    sock.settimeout(10)
    payload = os.urandom(3_000_000)
    sender = threading.Thread(target=sock.sendall, args=(payload,))
    sender.start()
    received = b""
    while len(received) < len(payload):
        data = sock.recv(1 << 20)
        assert data, f"closed after {len(received)} bytes"
        received += data
    sender.join()
    assert received == payload
    assert pf.error(echo_port) is None
    sock.close()


def test_python_client_portforward_to_a_closed_port_reports_kubes_error(stack: Stack, target) -> None:
    pod, _ = target
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    pf = portforward(api_client(stack.proxy.url).connect_get_namespaced_pod_portforward, pod, "ns-0", ports=str(port))
    sock = pf.socket(port)
    sock.settimeout(10)
    assert sock.recv(10) == b""
    assert f"error forwarding port {port} to pod {pod}" in (pf.error(port) or "")
    assert "connect: connection refused" in (pf.error(port) or "")


def test_streaming_refusals_are_kube_statuses(stack: Stack, target) -> None:
    pod, container = target
    path = f"/api/v1/namespaces/ns-0/pods/{pod}/exec?command=true&stdout=1&container={container}"
    # No upgrade: kube's upgrade-aware handler answers 400 (a plain pass-through here).
    plain = get(stack.proxy.url, path)
    assert plain.status == 400 and plain.json()["message"] == "Upgrade request required"
    up = raw_upgrade(stack.proxy.url, path, "websocket")  # a raw head: no Sec-WebSocket-Key
    assert up.head.status == 400 and "WebSocket upgrade needs" in up.json()["message"]
    up.close()
    up = raw_upgrade(stack.proxy.url, path, "SPDY/3.1")
    assert up.head.status == 400 and "WebSocket only" in up.json()["message"]
    up.close()
    ws = WebSocket(stack.proxy.url, path, subprotocols=["v9.channel.k8s.io"])
    assert ws.rejected is not None and ws.rejected[0] == 400
    assert b"requested protocol(s) are not supported" in ws.rejected[2]
    ws.close()


def test_an_upgrade_on_a_cached_path_gets_kubes_plain_answer(stack: Stack) -> None:
    """kube-apiserver ignores Upgrade on a plain GET and answers it; the proxy passes it to the upstream."""
    before = total(scrape(stack.proxy.url)[1], "watchcache_passthrough_requests_total", reason="upgrade")
    up = raw_upgrade(stack.proxy.url, "/api/v1/namespaces/ns-0/pods?limit=1", "websocket", method="GET")
    assert up.head.status == 200 and up.head.headers["connection"] == "close"
    doc = json.loads(up.body())
    assert doc["kind"] == "PodList" and len(doc["items"]) == 1
    up.close()
    after = total(scrape(stack.proxy.url)[1], "watchcache_passthrough_requests_total", reason="upgrade")
    assert after == before + 1


def test_kubectl_logs_gets_what_a_cluster_without_kubelets_answers(stack: Stack, target, tmp_path: Path) -> None:
    """Not a 405: kube-apiserver's pods/log answer when it cannot reach the node's kubelet, passed through."""
    pod, container = target
    node = get_ok(stack.sim.url, f"/api/v1/namespaces/ns-0/pods/{pod}")["spec"]["nodeName"]
    run = both(stack, tmp_path, "logs", pod, "-c", container)
    assert run.returncode == 1 and run.stdout == b""
    assert run.stderr.decode().strip() == (
        f'Error from server: Get "https://{node}:10250/containerLogs/ns-0/{pod}/{container}": '
        f'the simulated cluster has no kubelets: node "{node}" serves no container logs'
    )
    run = both(stack, tmp_path, "logs", pod, "-c", "nope")
    assert run.returncode == 1 and f"container nope is not valid for pod {pod}".encode() in run.stderr
    before = total(scrape(stack.proxy.url)[1], "watchcache_passthrough_requests_total", reason="subresource")
    answer = get(stack.proxy.url, f"/api/v1/namespaces/ns-0/pods/{pod}/log", container=container)
    # kube-apiserver's answer when the kubelet cannot be reached: 500, and no reason (StatusReasonUnknown)
    assert answer.status == 500 and answer.json()["code"] == 500 and "reason" not in answer.json()
    after = total(scrape(stack.proxy.url)[1], "watchcache_passthrough_requests_total", reason="subresource")
    assert after == before + 1
    assert get(stack.proxy.url, f"/api/v1/namespaces/ns-0/pods/{pod}-gone/log").status == 404
